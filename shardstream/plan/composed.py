"""mix="stratified" and mix="per_stream": a mixture's global batches composed of parts.

NOTE [ Composed batches ]
Both mixes need order="global" (NOTE [ Global order ]): the epoch is ``B`` global
batches of ``G`` samples (``B = total // G`` with drop_last, else ``ceil(total / G)``),
the same on every world size dividing ``G`` and any worker count. A global batch is
made of *parts*: each part is a ``GlobalSequence`` of its own (its lanes, chunks and
windows as for a single dataset) over its own virtual shards (some of one stream's
``Segments``), with a batch size ``g``, ``min(read_lanes, g)`` lanes and a seed drawn
from ``(seed, stream, kind)``. Part ``i``'s ``j``-th batch goes into the ``j``-th global
batch that holds part ``i``; the parts of a batch come in a fixed order, so entry ``e``
of batch ``k`` is one entry of one part, and ranks and workers cut the batches exactly
as a ``GlobalPlan``'s. The quotas are first rounded so that the epoch is whole batches:
the epoch of stream ``s`` is ``q_s'`` samples (``quotas``), taken from its passes as
``Mixture.segments(quota=q_s')`` takes them, so "every sample before a repeat" holds.

- stratified: ``q'`` is ``B G`` apportioned by the quotas; ``a_s = q_s' // B`` and
  ``e_s = q_s' % B``. Stream ``s`` has a main part (``g = a_s``, in every batch) over
  its first ``a_s B`` samples and an extras part (``g = 1``) over its last ``e_s``.
  Every batch holds exactly ``X = G - sum(a_s)`` extras (``sum(e_s) = X B``): batch
  ``k`` holds one of stream ``s`` when ``pi(k)`` falls in the cyclic interval
  ``[c_s, c_s + e_s)`` of ``[0, B)`` (``c_s`` the sum of the ``e`` before ``s``), so the
  intervals wrap around ``[0, B)`` exactly ``X`` times and each batch holds ``a_s`` or
  ``a_s + 1`` of stream ``s``. ``pi(k) = alpha k + beta (mod B)`` with ``alpha`` the
  inverse of a golden-ratio step: consecutive ``pi`` values are batches about ``0.618 B``
  apart, so a stream's extras spread evenly over the epoch (three-gap theorem);
  ``beta`` is keyed by ``(seed, epoch)``. Parts of a batch: mains by stream, then extras.
- per_stream: ``b`` is ``B`` apportioned by the quotas, ``q_s' = b_s G``; one part per
  stream (``g = G``). Stream ``s`` has the points ``(j + u_s) / b_s`` for ``j < b_s``
  (``u_s`` keyed by ``(seed, epoch)``), and batch ``k`` is the stream of the ``k``-th
  point of all streams (ties to the first stream): every stream's batches evenly spread
  and interleaved. Where the ``k``-th point lies is a bisection over O(S) counts, so a
  range of batches costs O(S log + range): nothing O(B) is ever built.

Which part-batch a global batch holds is a count (``before``): for a main, ``k``; for
extras, the lattice points of ``alpha k + beta`` below ``k`` in an interval (a floor
sum, O(log B)); for per_stream, the bisection above. So a resume state is the number of
global batches taken, as a ``GlobalPlan``'s, and memory is O(segments + window).

Every part's windows are ``M = shuffle_window // G`` of its own batches: a main part's
windows are then exactly the windows of the global batches, a sparse part's span more
of them (its window of ``M g`` samples still shuffles as a single dataset's would).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from shardstream.errors import PlanError, StateError
from shardstream.plan.config import PlanConfig, Run, Window, check_count
from shardstream.plan.epoch import EpochPlan
from shardstream.plan.global_order import _FIRST_WINDOW, GlobalSequence, lanes_of
from shardstream.plan.intervals import from_points
from shardstream.plan.keys import TAG_COMPOSED, random_words
from shardstream.plan.mixture import Mixture, Segments, apportion
from shardstream.plan.shards import ShardOrder
from shardstream.plan.state import make_global_state, read_global_state

__all__ = ["ComposedPlan", "ComposedSequence"]

# What a TAG_COMPOSED key draws (the second word of the key after the seed).
_PART_SEED, _SPREAD = 0, 1
# per_stream: each stream's offset u_s is a multiple of 1 / _GRID.
_GRID = 1 << 16
# per_stream counts batches in int64 without overflow below this many batches per epoch.
_MAX_PER_STREAM_BATCHES = 1 << 31
# stratified: how far from batches / phi the step of the extras' permutation is sought.
_STEP_SEARCH = 32


@dataclass(frozen=True, eq=False)
class Part:
    """One part of the global batches: a ``GlobalSequence`` over some of one stream's
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
    config: PlanConfig, epoch: int, per_window: int, stream: int, kind: int, segments: Segments, place: tuple
) -> Part:
    size, low, high = place
    seed = int(random_words(1, (config.seed, TAG_COMPOSED, _PART_SEED, stream, kind))[0] >> np.uint64(1))
    own = dataclasses.replace(config, seed=seed, global_batch_size=size, shuffle_window=None)
    # The segments are in the stream's pass order already (NOTE [ Mixtures ]): laid as they are.
    shards = ShardOrder(segments.sizes, shuffle=False, seed=seed, epoch=epoch)
    sequence = GlobalSequence(shards, own, epoch=epoch, window=per_window * size)
    return Part(stream, size, low, high, segments, sequence)


class ComposedSequence(abc.ABC):
    """The global batches of one epoch of a mixture, composed of parts (NOTE [ Composed batches ])."""

    def __init__(self, mixture: Mixture, config: PlanConfig, *, epoch: int, window: int) -> None:
        self.size = int(config.global_batch_size or 1)
        total = mixture.total
        self.batches = total // self.size if config.drop_last else -(-total // self.size)
        self.lanes = lanes_of(config)
        self.per_window = max(1, window // self.size)
        spread = random_words(len(mixture.streams), (config.seed, epoch, TAG_COMPOSED, _SPREAD))
        self._spread = spread if config.shuffle else np.zeros_like(spread)
        self.parts: list[Part] = []
        self.quotas: tuple[int, ...] = ()  # what each stream gives this epoch: q_s'

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
        keys: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (batch, entry, index in runs)
        count = 0
        for part, (ks, js, offsets) in zip(self.parts, self.place(lo, hi), strict=True):
            mine = (ks - lo) % step == 0
            ks, js, offsets = ks[mine], js[mine], offsets[mine]
            a, b = np.clip(first - offsets, 0, part.size), np.clip(last - offsets, 0, part.size)
            positions, batch_keys, entry_keys = [], [], []
            for u, v in np.unique(np.stack([a, b]), axis=1).T.tolist():
                if v <= u:
                    continue
                held = (a == u) & (b == v)
                positions.append(part.sequence.positions(js[held], part.sequence.pieces(u, v)))
                batch_keys.append(np.repeat(ks[held], v - u))
                entry_keys.append(((offsets[held] + u)[:, None] + np.arange(v - u)).ravel())
            if not positions:
                continue
            spots = np.concatenate(positions)
            ascending = np.argsort(spots, kind="stable")
            runs += part.segments.runs(part.sequence.shards.runs(from_points(spots[ascending])))
            index = np.empty(spots.size, dtype=np.int64)
            index[ascending] = count + np.arange(spots.size, dtype=np.int64)
            keys.append((np.concatenate(batch_keys), np.concatenate(entry_keys), index))
            count += spots.size
        if not keys:
            return (), np.zeros(0, dtype=np.int64)
        batch, entry, index = (np.concatenate(column) for column in zip(*keys, strict=True))
        order = index[np.lexsort((entry, batch))]
        order.setflags(write=False)
        return tuple(runs), order


class StratifiedSequence(ComposedSequence):
    """mix="stratified": every batch holds each stream's share to within one sample."""

    def __init__(self, mixture: Mixture, config: PlanConfig, *, epoch: int, window: int) -> None:
        super().__init__(mixture, config, epoch=epoch, window=window)
        batches, per = self.batches, self.per_window
        self.quotas = apportion(batches * self.size, [Fraction(q) for q in mixture.quotas])
        mains = [q // max(1, batches) for q in self.quotas]
        self.base = sum(mains)  # where the extras start
        self.starts: list[int] = []  # c_s of each extras part
        self.alpha = pow(_golden_step(batches), -1, batches) if batches > 1 else 0
        self.beta = int(self._spread[0] % np.uint64(max(1, batches)))
        extras: list[Part] = []
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

    def _extras(self, index: int) -> tuple[int, int]:
        """``(gamma, e)`` of an extras part: batch ``k`` holds it when ``(alpha k + gamma) % B < e``."""
        part = self.parts[self.mains + index]
        return (self.beta - self.starts[index]) % self.batches, int(part.sequence.batches)

    def before(self, batch: int) -> list[int]:
        batch = min(batch, self.batches)
        counts = [batch] * self.mains
        for index in range(len(self.parts) - self.mains):
            gamma, e = self._extras(index)
            counts.append(_below(batch, self.batches, self.alpha, gamma, e))
        return counts

    def place(self, lo: int, hi: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        ks = np.arange(lo, hi, dtype=np.int64)
        placed = [(ks, ks, np.full(ks.size, part.low, dtype=np.int64)) for part in self.parts[: self.mains]]
        taken = np.zeros(ks.size, dtype=np.int64)  # extras placed in each batch so far
        for index, start in enumerate(self.before(lo)[self.mains :]):
            gamma, e = self._extras(index)
            held = _affine(self.alpha, (self.alpha * lo + gamma) % self.batches, self.batches, ks.size) < e
            mine = np.flatnonzero(held)
            placed.append((ks[mine], start + np.arange(mine.size, dtype=np.int64), self.base + taken[mine]))
            taken += held
        return placed


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


def _golden_step(batches: int) -> int:
    """A step coprime with ``batches`` near ``batches / phi`` whose continued fraction
    ``step / batches`` has the smallest sum of partial quotients among its neighbours:
    that sum bounds how unevenly consecutive multiples of the step spread."""
    near = (math.isqrt(5 * batches * batches) - batches) // 2
    candidates = range(max(1, near - _STEP_SEARCH), min(batches, near + _STEP_SEARCH + 1))
    coprime = [step for step in candidates if math.gcd(step, batches) == 1] or [1]
    return min(coprime, key=lambda step: (_quotients(step, batches), abs(step - near), step))


def _quotients(a: int, b: int) -> int:
    """The sum of the partial quotients of the continued fraction of ``a / b``."""
    total = 0
    while a:
        total, a, b = total + b // a, b % a, a
    return total


def _affine(alpha: int, start: int, modulus: int, count: int) -> np.ndarray:
    """``(start + alpha i) % modulus`` for ``i < count``, in blocks short enough for int64."""
    alpha %= modulus
    block = max(1, (1 << 62) // max(1, alpha))
    out = np.empty(count, dtype=np.int64)
    for lo in range(0, count, block):
        n = min(block, count - lo)
        out[lo : lo + n] = ((start + alpha * lo) % modulus + alpha * np.arange(n, dtype=np.int64)) % modulus
    return out


def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a i + b) / m) for i < n)`` for ``a, b >= 0``, in O(log m) (ACL's floor_sum)."""
    total = 0
    while True:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        top = a * n + b
        if top < m:
            return total
        n, b, m, a = top // m, top % m, a, m


def _below(k: int, modulus: int, alpha: int, gamma: int, e: int) -> int:
    """How many ``i < k`` have ``(alpha i + gamma) % modulus < e`` (``0 <= gamma < modulus``,
    ``0 < e < modulus``): ``[x % m < e] = floor(x / m) - floor((x - e) / m)``."""
    return _floor_sum(k, modulus, alpha, gamma) - _floor_sum(k, modulus, alpha, gamma - e + modulus) + k


class ComposedPlan(EpochPlan):
    """The plan of a mix="stratified" or "per_stream" epoch (NOTE [ Composed batches ]) for
    every rank and worker, as a ``GlobalPlan``'s: ``batch_size`` is ``global_batch_size //
    world_size`` and ``state_dict(steps)`` counts global batches. Its runs are of mixture
    shards. ``MixturePlan`` makes it."""

    def __init__(
        self,
        mixture: Mixture,
        config: PlanConfig,
        *,
        epoch: int,
        world_size: int,
        num_workers: int = 1,
        batch_size: int = 1,
    ) -> None:
        self._composed_setup(mixture, config, check_count(epoch, "epoch"), 0)
        self._topology(world_size, num_workers, batch_size, error=PlanError)

    @classmethod
    def resume(  # type: ignore[override]  # a mixture in place of shard sizes
        cls,
        mixture: Mixture,
        config: PlanConfig,
        state: Mapping[str, Any],
        *,
        world_size: int,
        num_workers: int = 1,
        batch_size: int = 1,
    ) -> ComposedPlan:
        """The rest of the epoch after the global batches the state took, on any topology
        whose world size divides the global batch size."""
        _check_config(config)
        window = config.window_for(mixture.sizes)
        epoch, taken = read_global_state(state, mixture.sizes, config, window=window, lanes=lanes_of(config))
        plan = object.__new__(cls)
        plan._composed_setup(mixture, config, epoch, taken)
        if taken > plan._sequence.batches:
            raise StateError(
                f"the state says {taken} global batches were taken, the epoch has {plan._sequence.batches}"
            )
        plan._topology(world_size, num_workers, batch_size, error=StateError)
        return plan

    def _composed_setup(self, mixture: Mixture, config: PlanConfig, epoch: int, taken: int) -> None:
        _check_config(config)
        if mixture.mix not in _SEQUENCES:
            raise PlanError(f"a ComposedPlan composes mix='stratified' or 'per_stream', not {mixture.mix!r}")
        self._mixture, self._config, self._epoch, self._taken, self._first = mixture, config, epoch, taken, 0
        self._sizes = mixture.sizes
        self._window = config.window_for(mixture.sizes)
        self._sequence = _SEQUENCES[mixture.mix](mixture, config, epoch=epoch, window=self._window)

    def _topology(
        self, world_size: int, num_workers: int, batch_size: int, *, error: type[Exception]
    ) -> None:
        world = check_count(world_size, "world_size", minimum=1)
        self._workers = max(1, check_count(num_workers, "num_workers"))
        batch = check_count(batch_size, "batch_size", minimum=1)
        size = self._sequence.size
        if size % world or batch != size // world:
            raise error(
                f"mix={self._mixture.mix!r} with global_batch_size={size} runs on a world size that divides "
                f"it, with batch_size=global_batch_size // world_size, not on {world} ranks with "
                f"batch_size={batch}"
            )
        self._world, self._batch = world, batch

    # -- what the plan is ------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self._world

    @property
    def num_workers(self) -> int:
        return self._workers

    @property
    def batch_size(self) -> int:
        return self._batch

    @property
    def sequence(self) -> ComposedSequence:
        return self._sequence

    @property
    def global_batches_taken(self) -> int:
        return self._taken

    def _left(self, worker: int) -> int:
        left = self._sequence.batches - self._taken
        return (left // self._workers + (worker < left % self._workers)) * self._batch

    def samples_per_rank(self) -> int:
        return (self._sequence.batches - self._taken) * self._batch

    def batches_per_rank(self) -> int:
        return self._sequence.batches - self._taken

    def __repr__(self) -> str:
        return (
            f"ComposedPlan(mix={self._mixture.mix!r}, epoch={self.epoch}, world_size={self.world_size}, "
            f"num_workers={self.num_workers}, global_batch_size={self._sequence.size}, "
            f"quotas={self._sequence.quotas}, global_batches_taken={self._taken} of {self._sequence.batches})"
        )

    # -- what a worker reads ---------------------------------------------------------------

    def _windows(self, rank: int, worker: int) -> Iterator[Window]:
        # As GlobalPlan's: the worker's batches of whole windows of the sequence per Window.
        sequence, step, per = self._sequence, self._workers, self._sequence.per_window
        first_entry, last_entry = rank * self._batch, (rank + 1) * self._batch
        share = max(1, per * self._batch // step)
        most = max(1, self._window // share)
        count = max(1, min(most, _FIRST_WINDOW // share))
        first = self._taken + worker
        while first < sequence.batches:
            stop = min((first // per + count) * per, sequence.batches)
            batches = np.arange(first, stop, step, dtype=np.int64)
            build = functools.partial(sequence.window_parts, batches, first_entry, last_entry)
            yield Window.lazy(sequence.window_shards(first, stop, first_entry, last_entry), build)
            first, count = int(batches[-1]) + step, min(most, 2 * count)

    # -- resume ----------------------------------------------------------------------------

    def state_dict(self, steps: int) -> dict[str, Any]:
        """The state after every rank took ``steps`` batches (global batches) of this plan;
        ``MixturePlan`` adds the mix and the streams."""
        steps = check_count(steps, "steps")
        if steps > self.batches_per_rank():
            raise PlanError(
                f"steps={steps} is more than the {self.batches_per_rank()} batches this plan has per rank"
            )
        return make_global_state(
            self._sizes,
            self._config,
            epoch=self._epoch,
            window=self._window,
            lanes=self._sequence.lanes,
            taken=self._taken + steps,
        )


_SEQUENCES: dict[str, type[ComposedSequence]] = {
    "stratified": StratifiedSequence,
    "per_stream": PerStreamSequence,
}


def _check_config(config: PlanConfig) -> None:
    if not isinstance(config, PlanConfig) or not config.is_global:
        raise PlanError("mix='stratified' and 'per_stream' compose global batches: they need order='global'")
