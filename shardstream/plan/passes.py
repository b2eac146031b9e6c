"""Passes over an epoch: the first over all positions, each later one over what the
previous pass left when a run resumed under another topology.

NOTE [ Passes ]
A pass cuts its input positions (pass-local indices ``[0, inputs)``) into ``world_size``
equal rank slices, padded by repeating inputs from the start (or, in the first pass
only and with ``drop_last``, cut short), each into ``num_workers`` worker slices that
differ by at most one, each into windows (NOTE [ Striped windows ]). Ranks step in
lockstep, so ``steps`` batches per rank say, through torch's round-robin, how many
samples of each worker slice are used: whole windows, then the first entries of one
window's order. What is left of the real (unpadded) indices, in ascending order, is the
input of the next pass. Indices of a later pass map to indices of the one before
through per-worker counts (O(ranks x workers) integers) and the windows' orders, which
are recomputed from the seed on demand; nothing per sample is stored.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shardstream.plan.config import Run
from shardstream.plan.intervals import EMPTY, Intervals, compose, concat, from_points, merge, points, select
from shardstream.plan.randomness import TAG_WINDOW, permutation
from shardstream.plan.shards import ShardOrder
from shardstream.plan.windows import SliceLayout, round_robin, split_even

# Remainders of worker slices are cached up to this many intervals per shuffle window
# (a striped window of a later pass keeps coming back to the same few slices).
_CACHED_WINDOWS = 2


@dataclass(frozen=True, slots=True)
class PassRecord:
    """A pass's topology and how many batches each rank took from it."""

    world_size: int
    num_workers: int
    batch_size: int
    steps: int = 0

    def same_topology(self, other: PassRecord) -> bool:
        mine = (self.world_size, self.num_workers, self.batch_size)
        return mine == (other.world_size, other.num_workers, other.batch_size)


class PassInput(Protocol):
    """What a pass reads its input positions from: the epoch's shard order (the first
    pass) or the remainder of the pass before. Not a data source (``pack.sources``)."""

    def resolve(self, spans: Intervals) -> Intervals:
        """Input-index intervals of a pass -> base-position intervals, order kept."""
        ...


@dataclass(frozen=True, slots=True)
class PassSetup:
    """What every pass of one epoch plan shares."""

    shards: ShardOrder
    seed: int
    epoch: int
    shuffle: bool
    window: int
    lanes: int


class Pass:
    """One pass; see NOTE [ Passes ]."""

    def __init__(
        self,
        index: int,
        record: PassRecord,
        inputs: int,
        read_from: PassInput,
        setup: PassSetup,
        *,
        drop_last: bool,
    ) -> None:
        self.index, self.record, self.inputs, self.setup = index, record, inputs, setup
        self.read_from = read_from
        ranks, workers = record.world_size, record.num_workers
        self.per_rank = inputs // ranks if drop_last else -(-inputs // ranks)
        self.total = self.per_rank * ranks
        self.real = min(inputs, self.total)
        self.lengths = split_even(self.per_rank, workers)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.layouts = {
            int(n): SliceLayout.of(int(n), setup.window, setup.lanes) for n in set(self.lengths.tolist())
        }
        self.batches = [-(-int(n) // record.batch_size) for n in self.lengths]
        self._remainders: OrderedDict[tuple[int, int, int], Intervals] = OrderedDict()
        self._cached = 0  # intervals held in _remainders

    def layout(self, worker: int) -> SliceLayout:
        return self.layouts[int(self.lengths[worker])]

    def slice_start(self, rank: int, worker: int) -> int:
        return rank * self.per_rank + int(self.offsets[worker])

    def consumed(self, steps: int) -> tuple[list[int], int]:
        """``(samples used in each worker slice, next worker)`` after ``steps`` batches."""
        taken, next_worker = round_robin(self.batches, steps)
        size = self.record.batch_size
        return [min(int(n), t * size) for n, t in zip(self.lengths, taken, strict=True)], next_worker

    def order(self, rank: int, worker: int, window: int, size: int) -> np.ndarray:
        """The yield order of a window: keyed by (seed, epoch, pass, rank, worker, window)."""
        if not self.setup.shuffle:
            return np.arange(size, dtype=np.int64)
        s = self.setup
        return permutation(size, (s.seed, s.epoch, TAG_WINDOW, self.index, rank, worker, window))

    def runs(self, spans: Intervals) -> tuple[Run, ...]:
        """Pass-index intervals as the runs of samples they are."""
        return self.setup.shards.runs(self.to_base(spans))

    def to_base(self, spans: Intervals) -> Intervals:
        """Pass-index intervals -> base positions: padding indices wrap to the start."""
        starts, stops = spans
        if not starts.size or int(stops.max()) <= self.inputs:
            return self.read_from.resolve(spans)
        inputs, lo, hi = self.inputs, [], []
        for u, v in zip(starts.tolist(), stops.tolist(), strict=True):
            if u < inputs:
                lo.append(u)
                hi.append(min(v, inputs))
                u = inputs
            while u < v:
                start = u % inputs
                n = min(v - u, inputs - start)
                lo.append(start)
                hi.append(start + n)
                u += n
        return self.read_from.resolve(merge((np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64))))

    def remaining(self, rank: int, worker: int, consumed: int) -> Intervals:
        """The pass indices of a worker slice not among its first ``consumed`` samples in
        yield order, ascending."""
        key = (rank, worker, consumed)
        if key in self._remainders:
            self._remainders.move_to_end(key)
            return self._remainders[key]
        layout = self.layout(worker)
        window, used = layout.locate(consumed)
        if window >= layout.num_windows:
            return EMPTY
        current = layout.window(window)
        if used:
            offsets = points(current)
            left = np.ones(offsets.size, dtype=bool)  # a mask, not a sort: O(window)
            left[self.order(rank, worker, window, offsets.size)[:used]] = False
            left = np.flatnonzero(left)
            current = from_points(offsets[left])
        starts, stops = concat([current, layout.after(window)])
        ascending = np.argsort(starts, kind="stable")
        start = self.slice_start(rank, worker)
        spans = merge((starts[ascending] + start, stops[ascending] + start))
        self._remainders[key] = spans
        self._cached += spans[0].size
        while len(self._remainders) > 1 and self._cached > _CACHED_WINDOWS * self.setup.window + 4096:
            self._cached -= self._remainders.popitem(last=False)[1][0].size
        return spans


class Remainder:
    """The real indices a pass left, ascending: the input of the next pass."""

    def __init__(self, done: Pass, consumed: list[int]) -> None:
        self.done, self.consumed = done, consumed
        ranks, workers = done.record.world_size, done.record.num_workers
        left = np.array([int(n) - c for n, c in zip(done.lengths, consumed, strict=True)], dtype=np.int64)
        counts = np.tile(left, ranks)
        starts = (np.arange(ranks, dtype=np.int64)[:, None] * done.per_rank + done.offsets[:-1]).ravel()
        stops = starts + np.tile(done.lengths, ranks)
        counts[starts >= done.real] = 0
        for i in np.flatnonzero((starts < done.real) & (stops > done.real)).tolist():
            rank, worker = divmod(i, workers)
            a, b = done.remaining(rank, worker, consumed[worker])
            counts[i] = int(np.clip(np.minimum(b, done.real) - a, 0, None).sum())
        self.counts = counts
        self.ends = np.cumsum(counts)
        self.count = int(self.ends[-1]) if counts.size else 0

    def resolve(self, spans: Intervals) -> Intervals:
        starts, stops = merge(spans)
        if not starts.size:
            return EMPTY
        workers = self.done.record.num_workers
        # Only the workers some interval overlaps: a striped window spans many others.
        first = np.searchsorted(self.ends, starts, side="right")
        last = np.searchsorted(self.ends, stops - 1, side="right")
        touched = np.unique(points((first, last + 1)))
        rank_starts, targets, lengths = [], [], []
        for i in touched.tolist():
            if not self.counts[i]:
                continue
            rank, worker = divmod(i, workers)
            left = self.done.remaining(rank, worker, self.consumed[worker])
            a, b = select(left, 0, int(self.counts[i]))  # padding indices are not carried on
            rank_starts.append(int(self.ends[i] - self.counts[i]) + np.cumsum(b - a) - (b - a))
            targets.append(a)
            lengths.append(b - a)
        mapped = compose(
            (starts, stops), np.concatenate(rank_starts), np.concatenate(targets), np.concatenate(lengths)
        )
        return self.done.to_base(mapped)
