"""The parts a composed global batch is made of, and where they go: mix="stratified" and
mix="per_stream" (NOTE [ Composed batches ], in plan/composed.py)."""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from shardstream.errors import PlanError
from shardstream.plan.config import PlanConfig, Run, check_global_batch
from shardstream.plan.global_order import CACHED_BLOCKS, GlobalSequence, lanes_of
from shardstream.plan.intervals import from_points
from shardstream.plan.mixture import Mixture, Segments, apportion
from shardstream.plan.randomness import TAG_COMPOSED, random_words
from shardstream.plan.shards import ShardOrder
from shardstream.plan.spread import affine, count_below, golden_step

# What a TAG_COMPOSED key draws (the second word of the key after the seed).
_PART_SEED, _SPREAD = 0, 1
# per_stream: each stream's offset u_s is a multiple of 1 / _GRID.
_GRID = 1 << 16
# per_stream counts batches in int64 without overflow below this many batches per epoch.
_MAX_PER_STREAM_BATCHES = 1 << 31


@dataclass(frozen=True, eq=False)
class BatchShare:
    """One stream's share of the global batches: a ``GlobalSequence`` over some of one stream's
    samples; it takes ``size`` entries of a batch that holds it, somewhere in entries
    ``[low, high)`` (exactly ``[low, low + size)`` unless it moves from batch to batch)."""

    stream: int
    size: int
    low: int
    high: int
    segments: Segments
    sequence: GlobalSequence

    def entries(self, lo: int, hi: int) -> tuple[int, int]:
        """The part's entries ``[a, b)`` that a rank holding entries ``[lo, hi)`` of a batch may get."""
        if self.high - self.low > self.size:  # it moves: any of its entries may fall in [lo, hi)
            return (0, self.size) if lo < self.high and hi > self.low else (0, 0)
        return max(lo - self.low, 0), min(hi - self.low, self.size)


def _part(
    config: PlanConfig,
    epoch: int,
    per_window: int,
    stream: int,
    kind: int,
    segments: Segments,
    place: tuple[int, int, int],
) -> BatchShare:
    size, low, high = place
    seed = int(random_words(1, (config.seed, TAG_COMPOSED, _PART_SEED, stream, kind))[0] >> np.uint64(1))
    # its share of the batch's lanes (at least one): reads as long as a single dataset's
    total = int(config.global_batch_size or 1)
    lanes = max(1, (lanes_of(config) * size + total // 2) // total)
    own = dataclasses.replace(
        config, seed=seed, global_batch_size=size, shuffle_window=None, read_lanes=lanes
    )
    # The segments are in the stream's pass order already (NOTE [ Mixtures ]): laid as they are.
    shards = ShardOrder(segments.sizes, shuffle=False, seed=seed, epoch=epoch)
    sequence = GlobalSequence(shards, own, epoch=epoch, window=per_window * size)
    return BatchShare(stream, size, low, high, segments, sequence)


def _held(
    part: BatchShare, slots: np.ndarray, js: np.ndarray, offsets: np.ndarray, first: int, last: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(positions, yield slots)`` of what a rank holding entries ``[first, last)`` gets of
    ``part`` in its ``slots``-th batches (the part's batches ``js``, at ``offsets``)."""
    a, b = np.clip(first - offsets, 0, part.size), np.clip(last - offsets, 0, part.size)
    positions, yields = [], []
    wide = part.size + 1
    for pair in np.unique(a * wide + b).tolist():  # a main part: one (u, v)
        u, v = divmod(pair, wide)
        if v <= u:
            continue
        held = (a == u) & (b == v)
        positions.append(part.sequence.positions(js[held], part.sequence.pieces(u, v)))
        # every batch is full: entry e of the rank's i-th batch is yielded i * (last - first) + e - first
        start = slots[held] * (last - first) + offsets[held] + u - first
        yields.append((start[:, None] + np.arange(v - u)).ravel())
    return positions, yields


class ComposedSequence(abc.ABC):
    """The global batches of one epoch of a mixture, composed of parts (NOTE [ Composed batches ])."""

    def __init__(self, mixture: Mixture, config: PlanConfig, *, epoch: int, window: int) -> None:
        self.size = int(config.global_batch_size or 1)
        total = mixture.total
        check_global_batch(self.size, total)
        self.batches = total // self.size if config.drop_last else -(-total // self.size)
        self.lanes = lanes_of(config)
        self.per_window = max(1, window // self.size)
        spread = random_words(len(mixture.streams), (config.seed, epoch, TAG_COMPOSED, _SPREAD))
        self._spread = spread if config.shuffle else np.zeros_like(spread)
        self.parts: list[BatchShare] = []
        self.quotas: tuple[int, ...] = ()  # what each stream gives this epoch: q_s'

    def _share_caches(self) -> None:
        """The parts' chunk-permutation caches share one sequence's bound (8 MiB), whatever
        the number of streams."""
        for part in self.parts:
            part.sequence.cached_blocks = max(4, CACHED_BLOCKS // max(1, len(self.parts)))

    def _segments(self, mixture: Mixture, config: PlanConfig, epoch: int, stream: int) -> Segments:
        quota = self.quotas[stream]
        return mixture.segments(stream, epoch, seed=config.seed, shuffle=config.shuffle, quota=quota)

    @abc.abstractmethod
    def before(self, batch: int) -> list[int]:
        """How many batches of each part the global batches before ``batch`` hold."""

    @abc.abstractmethod
    def place(self, lo: int, hi: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per part, ``(batches, part batches, offsets)``: the global batches in ``[lo, hi)``
        that hold it, which of its batches each holds, and at which entry it starts."""

    def window_shards(self, lo: int, hi: int, first: int, last: int) -> tuple[int, ...]:
        """The mixture shards a worker holding entries ``[first, last)`` of some of the
        batches ``[lo, hi)`` may read: every part's shards of its windows there."""
        found: dict[int, None] = {}
        for part, a, b in zip(self.parts, self.before(lo), self.before(hi), strict=True):
            u, v = part.entries(first, last)
            if b > a and v > u:
                sequence = part.sequence
                virtual = sequence.window_shards(a, b, sequence.pieces(u, v))
                found.update(dict.fromkeys(part.segments.shards_of(virtual)))
        return tuple(found)

    def window_parts(self, batches: np.ndarray, first: int, last: int) -> tuple[tuple[Run, ...], np.ndarray]:
        """The runs and yield order of entries ``[first, last)`` of ``batches`` (ascending,
        evenly spaced): batches in order, each its entries in order."""
        lo, hi = int(batches[0]), int(batches[-1]) + 1
        step = int(batches[1] - batches[0]) if batches.size > 1 else 1
        runs: list[Run] = []
        order = np.empty(batches.size * (last - first), dtype=np.int64)
        count = 0
        for part, (ks, js, offsets) in zip(self.parts, self.place(lo, hi), strict=True):
            slots, apart = np.divmod(ks - lo, step)
            mine = apart == 0
            positions, yields = _held(part, slots[mine], js[mine], offsets[mine], first, last)
            if not positions:
                continue
            spots = np.concatenate(positions)
            ascending = np.argsort(spots, kind="stable")
            runs += part.segments.runs(part.sequence.shards.runs(from_points(spots[ascending])))
            index = np.empty(spots.size, dtype=np.int64)
            index[ascending] = count + np.arange(spots.size, dtype=np.int64)
            order[np.concatenate(yields)] = index
            count += spots.size
        order.setflags(write=False)
        return tuple(runs), order


# NOTE [ Stratified batches ]
# ``q'`` is ``B G`` apportioned by the quotas; ``a_s = q_s' // B`` and ``e_s = q_s' % B``.
# Stream s has a main part (g = a_s, in every batch) over its first ``a_s B`` samples and
# an extras part (g = 1) over its last ``e_s``. Every batch holds exactly
# ``X = G - sum(a_s)`` extras (``sum(e_s) = X B``): batch k holds one of stream s when
# ``pi(k)`` falls in the cyclic interval ``[c_s, c_s + e_s)`` of ``[0, B)`` (``c_s`` the sum
# of the e before s), so the intervals wrap around ``[0, B)`` exactly X times and each
# batch holds ``a_s`` or ``a_s + 1`` of stream s. ``pi(k) = alpha k + beta (mod B)`` with
# alpha the inverse of a step near ``B / phi`` (coprime with B; of the neighbours, the one
# with the smallest continued-fraction quotients): consecutive pi values are batches about
# ``0.618 B`` apart, so a stream's extras spread evenly over the epoch (every prefix of the
# epoch stays within a few samples of its share); beta is keyed by ``(seed, epoch)``.
# Parts of a batch: mains by stream, then extras. Which extras-batch batch k holds is the
# count of lattice points of ``alpha k + beta`` below k in an interval (a floor sum,
# O(log B)); a main's is k.
class StratifiedSequence(ComposedSequence):
    """mix="stratified": every batch holds each stream's share to within one sample."""

    def __init__(self, mixture: Mixture, config: PlanConfig, *, epoch: int, window: int) -> None:
        super().__init__(mixture, config, epoch=epoch, window=window)
        batches, per = self.batches, self.per_window
        self.quotas = apportion(batches * self.size, [Fraction(q) for q in mixture.quotas])
        mains = [q // max(1, batches) for q in self.quotas]
        self.base = sum(mains)  # where the extras start
        self.starts: list[int] = []  # c_s of each extras part
        self.alpha = pow(golden_step(batches), -1, batches) if batches > 1 else 0
        self.beta = int(self._spread[0] % np.uint64(max(1, batches)))
        extras: list[BatchShare] = []
        for stream, quota in enumerate(self.quotas):
            if not quota:
                continue
            head, tail = self._segments(mixture, config, epoch, stream).split(mains[stream] * batches)
            if mains[stream]:
                low = sum(mains[:stream])
                place = (mains[stream], low, low + mains[stream])
                self.parts.append(_part(config, epoch, per, stream, 0, head, place))
            if quota % batches:
                self.starts.append(sum(q % batches for q in self.quotas[:stream]))
                extras.append(_part(config, epoch, per, stream, 1, tail, (1, self.base, self.size)))
        self.mains = len(self.parts)
        self.parts += extras
        self._share_caches()

    def _extras(self, index: int) -> tuple[int, int]:
        """``(gamma, e)`` of an extras part: batch ``k`` holds it when ``(alpha k + gamma) % B < e``."""
        part = self.parts[self.mains + index]
        return (self.beta - self.starts[index]) % self.batches, int(part.sequence.batches)

    def before(self, batch: int) -> list[int]:
        batch = min(batch, self.batches)
        counts = [batch] * self.mains
        for index in range(len(self.parts) - self.mains):
            gamma, e = self._extras(index)
            counts.append(count_below(batch, self.batches, self.alpha, gamma, e))
        return counts

    def place(self, lo: int, hi: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        ks = np.arange(lo, hi, dtype=np.int64)
        placed = [(ks, ks, np.full(ks.size, part.low, dtype=np.int64)) for part in self.parts[: self.mains]]
        taken = np.zeros(ks.size, dtype=np.int64)  # extras placed in each batch so far
        for index, start in enumerate(self.before(lo)[self.mains :]):
            gamma, e = self._extras(index)
            held = affine(self.alpha, (self.alpha * lo + gamma) % self.batches, self.batches, ks.size) < e
            mine = np.flatnonzero(held)
            placed.append((ks[mine], start + np.arange(mine.size, dtype=np.int64), self.base + taken[mine]))
            taken += held
        return placed


# NOTE [ Per-stream batches ]
# b is B apportioned by the quotas, ``q_s' = b_s G``; one part per stream (g = G). Stream s
# has the points ``(j + u_s) / b_s`` for ``j < b_s`` (``u_s`` keyed by ``(seed, epoch)``),
# and batch k is the stream of the k-th point of all streams (ties to the first stream):
# every stream's batches evenly spread and interleaved. Where the k-th point lies is a
# bisection over O(S) counts, so a range of batches costs O(S log + range): nothing O(B) is
# ever built, and which part-batch batch k holds is the same bisection's count.
class PerStreamSequence(ComposedSequence):
    """mix="per_stream": each global batch from one stream, the streams evenly interleaved."""

    def __init__(self, mixture: Mixture, config: PlanConfig, *, epoch: int, window: int) -> None:
        super().__init__(mixture, config, epoch=epoch, window=window)
        if self.batches >= _MAX_PER_STREAM_BATCHES:
            raise PlanError(
                f"mix='per_stream' plans at most {_MAX_PER_STREAM_BATCHES - 1} global batches per epoch, "
                f"not {self.batches}: use a larger global_batch_size"
            )
        counts = apportion(self.batches, [Fraction(q) for q in mixture.quotas])
        self.quotas = tuple(b * self.size for b in counts)
        self.counts: list[int] = []  # b_s of each part
        self.offsets: list[int] = []  # u_s * _GRID of each part
        for stream, count in enumerate(counts):
            if count:
                segments = self._segments(mixture, config, epoch, stream)
                place = (self.size, 0, self.size)
                self.parts.append(_part(config, epoch, self.per_window, stream, 0, segments, place))
                self.counts.append(count)
                self.offsets.append(int(self._spread[stream] % np.uint64(_GRID)))
        self._share_caches()

    def _below(self, key: int) -> list[int]:
        """How many points of each part have a key below ``key`` (exact, in Python ints)."""
        found = []
        for count, offset in zip(self.counts, self.offsets, strict=True):
            limit = -(-key * count // self.batches) - 1  # the largest numerator below key
            found.append(0 if limit < offset else min(count, (limit - offset) // _GRID + 1))
        return found

    def before(self, batch: int) -> list[int]:
        if batch >= self.batches:
            return list(self.counts)
        # total(K) lies within len(parts) of K / _GRID, which bounds the bisection.
        spread = len(self.parts)
        lo, hi = max(0, (batch - spread) * _GRID), (batch + spread) * _GRID
        while hi - lo > 1:  # the largest key K with total(K) <= batch
            mid = (lo + hi) // 2
            if sum(self._below(mid)) <= batch:
                lo = mid
            else:
                hi = mid
        counts = self._below(lo)
        ties = batch - sum(counts)  # points at key lo, given to the first parts that have one
        for index, more in enumerate(self._below(lo + 1)):
            if ties and more > counts[index]:
                counts[index], ties = counts[index] + 1, ties - 1
        return counts

    def place(self, lo: int, hi: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        if not self.parts:  # an epoch of no batches
            return []
        first, last = self.before(lo), self.before(hi)
        js = [np.arange(a, b, dtype=np.int64) for a, b in zip(first, last, strict=True)]
        keys = np.concatenate([self._keys(index, j) for index, j in enumerate(js)])
        owner = np.repeat(np.arange(len(js)), [j.size for j in js])
        ks = np.empty(keys.size, dtype=np.int64)
        ks[np.lexsort((owner, keys))] = np.arange(lo, hi, dtype=np.int64)
        placed, at = [], 0
        for j in js:
            placed.append((ks[at : at + j.size], j, np.zeros(j.size, dtype=np.int64)))
            at += j.size
        return placed

    def _keys(self, index: int, j: np.ndarray) -> np.ndarray:
        """``floor((j _GRID + offset) B / b)``: the points' keys, split to stay in int64."""
        count = self.counts[index]
        numerator = j * _GRID + self.offsets[index]
        return (numerator // count) * self.batches + (numerator % count) * self.batches // count
