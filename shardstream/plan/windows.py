"""How one worker slice is cut into shuffle windows, and how a DataLoader takes batches.

NOTE [ Striped windows ]
A window is the set of samples a worker holds and shuffles at once. If a window were
one stretch of consecutive positions, a window of four shards would hold four shards,
and every batch drawn from it would mix at most four of them: on a corpus whose shards
are sorted by label, a batch then has at most four labels whatever the seed. So a
worker slice longer than a window is laid out as ``lanes`` equal lanes side by side,
and window ``j`` takes the ``j``-th chunk of every lane: it mixes samples from
``lanes`` places spread over the whole slice. Each chunk is still one contiguous run
(one ranged GET of about ``1/RUNS_PER_SHARD`` of a shard for the default window), each
lane is read front to back across windows, and nothing leaves the worker slice, so a
shard is still split between workers only at slice boundaries. With ``shuffle=False``
there is one lane: windows are consecutive and the yield order is manifest order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardstream.plan.intervals import Intervals, merge

# A lane's chunk in one window is about this fraction of a mean-sized shard.
RUNS_PER_SHARD = 4


def split_even(total: int, parts: int) -> np.ndarray:
    """``parts`` lengths summing to ``total``; the first ``total % parts`` one longer."""
    base, extra = divmod(total, parts)
    lengths = np.full(parts, base, dtype=np.int64)
    lengths[:extra] += 1
    return lengths


def lanes_for(window: int, sizes: np.ndarray, shuffle: bool) -> int:
    """How many lanes a window stripes over; see NOTE [ Striped windows ]."""
    nonempty = int(np.count_nonzero(sizes))
    if not shuffle or nonempty == 0:
        return 1
    mean = -(-int(sizes.sum()) // nonempty)
    chunk = max(1, -(-mean // RUNS_PER_SHARD))
    return max(1, window // chunk)


@dataclass(frozen=True, slots=True)
class SliceLayout:
    """The windows of one worker slice of ``length`` samples (offsets ``[0, length)``).

    The slice is ``lanes`` lanes of ``lane_len`` offsets (the last ones shorter or
    empty); window ``j`` is the chunk ``[j * chunk, (j + 1) * chunk)`` of every lane.
    """

    length: int
    lanes: int
    lane_len: int
    chunk: int

    @classmethod
    def of(cls, length: int, window: int, lanes: int) -> SliceLayout:
        """The layout for a slice: windows of at most ``window`` samples, of even size."""
        if length <= window:
            return cls(length, 1, length, max(1, length))
        lanes = max(1, min(lanes, window))
        lane_len = -(-length // lanes)
        # As few windows as the window size allows, then chunks as even as they can be.
        count = max(-(-length // window), -(-lane_len // (window // lanes)))
        return cls(length, lanes, lane_len, -(-lane_len // count))

    @property
    def num_windows(self) -> int:
        return -(-self.lane_len // self.chunk) if self.length else 0

    def _lane_lengths(self) -> np.ndarray:
        full, partial = divmod(self.length, self.lane_len) if self.length else (0, 0)
        return np.array([self.lane_len] * full + ([partial] if partial else []), dtype=np.int64)

    def before(self, window: int) -> int:
        """How many offsets the windows before ``window`` hold."""
        if not self.length:
            return 0
        full, partial = divmod(self.length, self.lane_len)
        cut = window * self.chunk
        return full * min(self.lane_len, cut) + min(partial, cut)

    def locate(self, consumed: int) -> tuple[int, int]:
        """``(window, entries)``: after ``consumed`` samples in yield order, the window
        being read and how many of its entries are used up."""
        lo, hi = 0, self.num_windows
        while lo < hi:  # the last window whose start is <= consumed
            mid = (lo + hi + 1) // 2
            if self.before(mid) <= consumed:
                lo = mid
            else:
                hi = mid - 1
        return lo, consumed - self.before(lo)

    def window(self, window: int) -> Intervals:
        """The offsets of ``window``, ascending, one interval per lane."""
        lengths = self._lane_lengths()
        base = np.arange(lengths.size, dtype=np.int64) * self.lane_len
        lo = np.minimum(lengths, window * self.chunk)
        hi = np.minimum(lengths, (window + 1) * self.chunk)
        return merge((base + lo, base + hi))

    def after(self, window: int) -> Intervals:
        """The offsets of every window after ``window``, ascending."""
        lengths = self._lane_lengths()
        base = np.arange(lengths.size, dtype=np.int64) * self.lane_len
        return merge((base + np.minimum(lengths, (window + 1) * self.chunk), base + lengths))


def round_robin(batches: Sequence[int], steps: int) -> tuple[list[int], int]:
    """``(taken, next_worker)`` after ``steps`` batches of torch's round-robin.

    torch's DataLoader takes one batch from each worker in turn, starting at worker 0
    and skipping a worker once it is exhausted; worker ``w`` has ``batches[w]``.
    ``taken[w]`` is how many of its batches are used and ``next_worker`` the worker
    whose batch comes next (0 when none does).
    """
    counts = [int(b) for b in batches]
    lo, hi = 0, max(counts, default=0)
    while lo < hi:  # the most full turns that fit in `steps`
        mid = (lo + hi + 1) // 2
        if sum(min(b, mid) for b in counts) <= steps:
            lo = mid
        else:
            hi = mid - 1
    rest = steps - sum(min(b, lo) for b in counts)
    active = [w for w, b in enumerate(counts) if b > lo]
    taken = [min(b, lo) for b in counts]
    for w in active[:rest]:
        taken[w] += 1
    return taken, (active[rest] if rest < len(active) else 0)
