"""The positions of an epoch: its shards in epoch order, laid end to end."""

from __future__ import annotations

import numpy as np

from shardstream.plan.config import Run
from shardstream.plan.intervals import Intervals, merge
from shardstream.plan.randomness import TAG_SHARDS, permutation


class ShardOrder:
    """Position ``p`` in ``[0, total)`` is a sample of the shard whose prefix-sum range
    holds it; memory is O(shards), and a position is found by bisection."""

    __slots__ = ("ends", "order", "sizes", "starts", "total")

    def __init__(self, sizes: np.ndarray, *, shuffle: bool, seed: int, epoch: int) -> None:
        self.sizes = sizes
        if shuffle:
            self.order = permutation(sizes.size, (seed, epoch, TAG_SHARDS))
        else:
            self.order = np.arange(sizes.size, dtype=np.int64)
        lengths = sizes[self.order]
        self.ends = np.cumsum(lengths, dtype=np.int64)
        self.starts = self.ends - lengths
        self.total = int(self.ends[-1]) if sizes.size else 0

    def resolve(self, spans: Intervals) -> Intervals:
        """Positions are the base of every pass: the identity."""
        return spans

    def shards_in(self, spans: Intervals) -> list[int]:
        """The shards holding positions of ``spans`` (in ``[0, total)``), interval by
        interval in the order given, each in position order, empty shards left out: the
        shards of :meth:`runs` without merging the intervals or making the runs."""
        starts, stops = spans
        keep = stops > starts
        starts, stops = starts[keep], stops[keep]
        if starts.size == 0:
            return []
        first = np.searchsorted(self.ends, starts, side="right")
        count = np.searchsorted(self.ends, stops - 1, side="right") - first + 1
        owner = np.repeat(np.arange(starts.size), count)
        slot = first[owner] + (np.arange(int(count.sum())) - (np.cumsum(count) - count)[owner])
        slot = slot[self.ends[slot] > self.starts[slot]]
        return self.order[slot].tolist()

    def runs(self, spans: Intervals) -> tuple[Run, ...]:
        """Position intervals (in ``[0, total)``) cut at shard boundaries, as runs, in order."""
        starts, stops = merge(spans)
        if starts.size == 0:
            return ()
        first = np.searchsorted(self.ends, starts, side="right")
        last = np.searchsorted(self.ends, stops - 1, side="right")
        count = last - first + 1
        owner = np.repeat(np.arange(starts.size), count)
        slot = first[owner] + (np.arange(int(count.sum())) - (np.cumsum(count) - count)[owner])
        lo = np.maximum(starts[owner], self.starts[slot])
        hi = np.minimum(stops[owner], self.ends[slot])
        keep = hi > lo  # empty shards inside an interval
        slot, lo, hi = slot[keep], lo[keep], hi[keep]
        base = self.starts[slot]
        shards = self.order[slot].tolist()
        return tuple(
            Run(s, a, b) for s, a, b in zip(shards, (lo - base).tolist(), (hi - base).tolist(), strict=True)
        )
