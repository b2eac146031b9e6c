"""Mixtures: one epoch drawn from several datasets (streams), each its own share.

NOTE [ Mixtures ]
A mixture is a list of streams, each a dataset with its own shards, and one quota per
stream: the samples it gives every epoch. Quotas come from exactly one way of sizing per
mixture, as MosaicML Streaming's: every stream a ``weight`` (a share of the epoch,
normalised; the epoch is ``epoch_size`` samples, by default the largest at which no
stream repeats), or none: then each stream a ``repeat`` (a multiple of its own size:
0.5 takes half of it, 2.5 two and a half times) or a ``choose`` (samples per epoch), or
neither (all of it once).

Which samples of a stream an epoch takes: the stream has an endless sequence of passes,
each its shards in a keyed order (manifest order without shuffle) laid end to end, and
epoch ``e`` takes positions ``[e q, (e + 1) q)`` of it (``q`` the quota, ``N`` the
stream's samples). So no sample of a stream repeats before every sample of it has been
seen, and a downsampled stream takes the next part of its passes each epoch (another
subset every epoch, all of the stream over successive epochs). Within one epoch every
sample must come ``q // N`` or ``q // N + 1`` times (at most once when downsampled); an
epoch that takes the tail of one pass and the head of the next would break that with two
unrelated orders (the head may hold samples of the tail). So the passes keep one order
for a cycle of ``q / gcd(N, q)`` passes, after which epochs and passes align again
(``N / gcd(N, q)`` epochs), the order ``permutation(shards, (seed, c, TAG_PASS,
stream))`` for cycle ``c``: a head and the tail before it then never overlap (``q <=
N``) or overlap in exactly ``q mod N`` samples. A fresh order comes every cycle: every
epoch when ``q`` divides or is a multiple of ``N``. Those positions are ``Segments``: runs
of one real shard each, a few per shard of the stream and epoch.

The segments are the shards a plan runs on ("virtual shards"): with ``mix="random"`` one
``EpochPlan`` (or ``GlobalPlan``, order="global") over all streams' segments, which
interleaves the streams through its shard order and shuffle window and keeps every
guarantee it has (equal counts per rank, exact resume on any topology, reads of
contiguous runs); its runs over segments become runs of real shards. ``mix="stratified"``
and ``"per_stream"`` compose global batches from each stream's own sequence
(``ComposedPlan``, plan/composed.py). Memory is O(segments + window): O(shards) for each
stream, times its passes per epoch when it repeats.

A mixture's state is its plan's, plus the mix and the streams (name, fingerprint, shard
and sample counts, quota): a state of one mixture refuses to load into another and names
the stream that differs.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from shardstream.counts import check_int
from shardstream.errors import PlanError, StateError, shown
from shardstream.plan.config import PlanConfig, Run, Window, check_count, shard_sizes_array
from shardstream.plan.epoch import EpochPlan
from shardstream.plan.keys import TAG_PASS, permutation
from shardstream.plan.state import Key

__all__ = ["MIXES", "Mixture", "MixturePlan", "Segments", "StreamSpec"]

MIXES = ("random", "stratified", "per_stream")
# The keys of one stream in a mixture's state (Mixture.describe).
_DESCRIBED = (Key.NAME, Key.FINGERPRINT, Key.NUM_SHARDS, Key.NUM_SAMPLES, Key.QUOTA)


def _positive(value: object, name: str) -> Fraction:
    """A finite positive number as an exact fraction (a float by its shortest repr)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise PlanError(f"{name} must be a positive number, not {shown(value)}")
    exact = Fraction(value) if isinstance(value, numbers.Rational) else Fraction(repr(float(value)))
    if exact <= 0:
        raise PlanError(f"{name} must be a positive number, not {shown(value)}")
    return exact


@dataclass(frozen=True, eq=False)
class StreamSpec:
    """What the plan needs of one stream: a name for errors and states (the dataset
    layer gives its URL), its shard sizes (manifest order), its dataset fingerprint
    (checked on resume), and at most one of ``weight``, ``repeat`` and ``choose``."""

    name: str
    sizes: np.ndarray = field(repr=False)
    fingerprint: str = ""
    weight: float | None = None
    repeat: float | None = None
    choose: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", shard_sizes_array(self.sizes))
        given = [k for k in ("weight", "repeat", "choose") if getattr(self, k) is not None]
        if len(given) > 1:
            raise PlanError(
                f"stream {self.name!r}: give at most one of weight, repeat and choose, not {given}"
            )
        for key in ("weight", "repeat"):
            if getattr(self, key) is not None:
                _positive(getattr(self, key), f"stream {self.name!r}: {key}")
        if self.choose is not None:
            check_count(self.choose, f"stream {self.name!r}: choose", minimum=1)

    @property
    def num_samples(self) -> int:
        return int(self.sizes.sum())


class Mixture:
    """Streams and their quotas per epoch (NOTE [ Mixtures ]); pure, O(shards)."""

    def __init__(self, streams: Sequence[StreamSpec], *, epoch_size: int | None = None, mix: str = "random"):
        self.streams = tuple(streams)
        if not self.streams or not all(isinstance(s, StreamSpec) for s in self.streams):
            raise PlanError("a mixture needs a non-empty list of StreamSpec")
        if mix not in MIXES:
            raise PlanError(f"mix must be one of {MIXES}, not {mix!r}")
        self.mix = mix
        for spec in self.streams:
            if spec.num_samples == 0:
                raise PlanError(f"stream {spec.name!r} has no samples")
        self.quotas = _quotas(self.streams, epoch_size)
        self.total = sum(self.quotas)
        counts = [spec.sizes.size for spec in self.streams]
        self.shard_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        totals = [spec.num_samples for spec in self.streams]
        self.sample_offsets = np.concatenate([[0], np.cumsum(totals)]).astype(np.int64)
        self.sizes = np.concatenate([spec.sizes for spec in self.streams])
        self.sizes.setflags(write=False)

    def __repr__(self) -> str:
        shares = ", ".join(f"{s.name}: {q}" for s, q in zip(self.streams, self.quotas, strict=True))
        return f"Mixture(mix={self.mix!r}, {shares})"

    def stream_of(self, shards: Any) -> Any:
        """The stream of mixture shard numbers (an int, or an array of them)."""
        found = np.searchsorted(self.shard_offsets, shards, side="right") - 1
        return int(found) if np.ndim(found) == 0 else found

    def segments(
        self, stream: int, epoch: int, *, seed: int, shuffle: bool, quota: int | None = None
    ) -> Segments:
        """The samples stream ``stream`` gives in ``epoch`` (its quota, or ``quota``), in
        pass order, as runs of mixture shards (NOTE [ Mixtures ])."""
        spec, offset = self.streams[stream], int(self.shard_offsets[stream])
        total = spec.num_samples
        take = self.quotas[stream] if quota is None else check_count(quota, "quota")
        lo, hi = check_count(epoch, "epoch") * take, (epoch + 1) * take
        # passes of one order: an epoch that ends one and starts the next takes each sample
        # as often as any other, give or take one (NOTE [ Mixtures ])
        cycle = take // math.gcd(total, take) if take else 1
        parts = []
        for number in range(lo // total, -(-hi // total)):
            if shuffle:
                order = permutation(spec.sizes.size, (seed, number // cycle, TAG_PASS, stream))
            else:
                order = np.arange(spec.sizes.size, dtype=np.int64)
            ends = np.cumsum(spec.sizes[order])
            starts = ends - spec.sizes[order]
            a, b = max(lo - number * total, 0), min(hi - number * total, total)
            keep = (ends > a) & (starts < b) & (ends > starts)
            first, last = starts[keep], ends[keep]
            parts.append(
                Segments(order[keep] + offset, np.maximum(first, a) - first, np.minimum(last, b) - first)
            )
        return Segments.concat(parts)

    def describe(self) -> list[dict[str, Any]]:
        """The streams as a state records them (JSON-able)."""
        return [
            {
                Key.NAME: spec.name,
                Key.FINGERPRINT: spec.fingerprint,
                Key.NUM_SHARDS: int(spec.sizes.size),
                Key.NUM_SAMPLES: spec.num_samples,
                Key.QUOTA: int(quota),
            }
            for spec, quota in zip(self.streams, self.quotas, strict=True)
        ]

    def check(self, saved: object) -> None:
        """``StateError`` unless ``saved`` (a state's streams) describes this mixture;
        it names the first stream that differs. Names (URLs) may differ: a dataset may move."""
        if not isinstance(saved, list) or not all(isinstance(s, Mapping) for s in saved):
            raise StateError(f"a mixture state's 'streams' is a list of mappings, not {shown(saved)}")
        if len(saved) != len(self.streams):
            raise StateError(f"the state mixes {len(saved)} streams, this mixture has {len(self.streams)}")
        for number, (old, new) in enumerate(zip(saved, self.describe(), strict=True)):
            for key in _DESCRIBED[1:]:
                if type(old.get(key)) is not type(new[key]) or old.get(key) != new[key]:
                    raise StateError(
                        f"the state is of another mixture: stream {number} ({new[Key.NAME]}) was saved with "
                        f"{key}={shown(old.get(key))}, this one has {key}={new[key]!r}"
                    )


def _quotas(streams: tuple[StreamSpec, ...], epoch_size: int | None) -> tuple[int, ...]:
    weighted = [spec.weight is not None for spec in streams]
    if any(weighted) and not all(weighted):
        raise PlanError(
            "give every stream a weight, or none: a mixture sizes its streams one way "
            f"(weighted: {[s.name for s in streams if s.weight is not None]})"
        )
    if not all(weighted):
        if epoch_size is not None:
            raise PlanError(
                "epoch_size goes with weights; streams sized by repeat or choose set the epoch's size"
            )
        quotas = []
        for spec in streams:
            if spec.choose is not None:
                quotas.append(int(spec.choose))
                continue
            share = Fraction(1) if spec.repeat is None else _positive(spec.repeat, "repeat")
            quotas.append(math.floor(share * spec.num_samples + Fraction(1, 2)))
            if quotas[-1] == 0:
                raise PlanError(
                    f"stream {spec.name!r}: repeat={spec.repeat} of its {spec.num_samples} samples is none"
                )
        return tuple(quotas)
    weights = [_positive(spec.weight, "weight") for spec in streams]
    shares = [w / sum(weights) for w in weights]
    if epoch_size is None:  # the largest epoch at which no stream repeats
        size = min(math.floor(spec.num_samples / share) for spec, share in zip(streams, shares, strict=True))
    else:
        size = check_count(epoch_size, "epoch_size", minimum=1)
    apportioned = apportion(size, shares)
    for spec, quota in zip(streams, apportioned, strict=True):
        if quota == 0:
            raise PlanError(
                f"stream {spec.name!r} gets no samples of an epoch of {size} at weight {spec.weight}"
            )
    return apportioned


def apportion(total: int, shares: Sequence[Fraction]) -> tuple[int, ...]:
    """``total`` split in proportion to ``shares`` (largest remainder, ties to the first
    stream): integers summing to ``total``, each within one of its exact share."""
    whole = sum(shares)
    exact = [total * share / whole for share in shares]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


@dataclass(frozen=True, eq=False)
class Segments:
    """One stream's samples of one epoch, in order: segment ``i`` is samples
    ``[start[i], stop[i])`` of mixture shard ``shard[i]``; a plan reads the segments as
    its shards ("virtual shards", NOTE [ Mixtures ])."""

    shard: np.ndarray
    start: np.ndarray
    stop: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        return self.stop - self.start

    def __len__(self) -> int:
        return int(self.shard.size)

    @staticmethod
    def concat(parts: Sequence[Segments]) -> Segments:
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return Segments(empty, empty, empty)
        return Segments(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("shard", "start", "stop")))

    def split(self, at: int) -> tuple[Segments, Segments]:
        """The first ``at`` samples, and the rest (a segment cut in two if need be)."""
        ends = np.cumsum(self.sizes)
        cut = int(np.searchsorted(ends, at, side="left"))  # the segment holding sample `at - 1`
        if cut >= len(self):
            return self, Segments.concat([])
        inside = int(at - (ends[cut] - self.sizes[cut]))  # samples of segment `cut` that go first
        middle = int(self.start[cut]) + inside
        head = Segments(self.shard[: cut + 1], self.start[: cut + 1], self.stop[: cut + 1].copy())
        head.stop[cut] = middle
        tail = Segments(self.shard[cut:], self.start[cut:].copy(), self.stop[cut:])
        tail.start[0] = middle
        return _nonempty(head), _nonempty(tail)

    def runs(self, runs: Iterable[Run]) -> tuple[Run, ...]:
        """Runs over the segments (``Run.shard`` a segment number) as runs of mixture shards."""
        shard, start = self.shard, self.start
        return tuple(
            Run(int(shard[r.shard]), int(start[r.shard]) + r.start, int(start[r.shard]) + r.stop)
            for r in runs
        )

    def shards_of(self, virtual: Iterable[int]) -> tuple[int, ...]:
        """The mixture shards of segment numbers, each once, in order."""
        return tuple(dict.fromkeys(int(self.shard[v]) for v in virtual))


def _inner_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A mixture's state without the mixture (checked already): its inner plan's state,
    which a plan of one dataset would refuse with them (``state._check_plan``)."""
    return {key: value for key, value in state.items() if key not in (Key.MIX, Key.STREAMS)}


def _mapped_window(segments: Segments, window: Window) -> tuple[tuple[Run, ...], np.ndarray]:
    """The runs (over real shards) and order of a window over segments."""
    return segments.runs(window.runs), window.order


def _nonempty(segments: Segments) -> Segments:
    keep = segments.stop > segments.start
    return Segments(segments.shard[keep], segments.start[keep], segments.stop[keep])


class MixturePlan:
    """The plan of one epoch of a mixture, with ``EpochPlan``'s interface: its windows'
    ``Run.shard`` are mixture shard numbers (stream ``s``'s shard ``i`` is
    ``mixture.shard_offsets[s] + i``); see NOTE [ Mixtures ]."""

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
        topology = dict(world_size=world_size, num_workers=num_workers, batch_size=batch_size)
        self._setup(mixture, config, check_count(epoch, "epoch"), None, topology)

    @classmethod
    def resume(
        cls,
        mixture: Mixture,
        config: PlanConfig,
        state: Mapping[str, Any],
        *,
        world_size: int,
        num_workers: int = 1,
        batch_size: int = 1,
    ) -> MixturePlan:
        """The rest of the epoch a ``state_dict()`` stopped in, on this topology;
        ``StateError`` if the state is of another mixture, dataset, seed or version."""
        if not isinstance(mixture, Mixture):
            raise PlanError(f"a MixturePlan needs a Mixture, not {type(mixture).__name__}")
        if not isinstance(state, Mapping):
            raise StateError(f"a plan state is a mapping, not {type(state).__name__}")
        if Key.STREAMS not in state:
            raise StateError("the state is of a single dataset, not of a mixture")
        if state.get(Key.MIX) != mixture.mix:
            raise StateError(
                f"the state was saved with mix={shown(state.get(Key.MIX))}, this mixture has mix={mixture.mix!r}"
            )
        mixture.check(state[Key.STREAMS])
        epoch = check_int(state.get(Key.EPOCH), "plan state field 'epoch'", error=StateError)
        plan = cls.__new__(cls)
        topology = dict(world_size=world_size, num_workers=num_workers, batch_size=batch_size)
        plan._setup(mixture, config, epoch, state, topology)
        return plan

    def _setup(
        self,
        mixture: Mixture,
        config: PlanConfig,
        epoch: int,
        state: Mapping[str, Any] | None,
        topology: dict[str, int],
    ) -> None:
        if not isinstance(mixture, Mixture):
            raise PlanError(f"a MixturePlan needs a Mixture, not {type(mixture).__name__}")
        if not isinstance(config, PlanConfig):
            raise PlanError(f"config must be a PlanConfig, not {type(config).__name__}")
        if config.dataset_bytes is not None:  # NOTE [ Global window ]
            raise PlanError(
                "dataset_bytes sizes the global window of one dataset; a mixture's window is "
                "four mean-sized shards, as a mixture of StreamingDataset streams has it"
            )
        self.mixture, self._config = mixture, config
        self._segments: Segments | None = None
        self._inner: Any
        if mixture.mix != "random":
            if not config.is_global:
                raise PlanError(
                    f"mix={mixture.mix!r} composes global batches: it needs order='global' and a global_batch_size"
                )
            from shardstream.plan.composed import ComposedPlan

            if state is None:
                self._inner = ComposedPlan(mixture, config, epoch=epoch, **topology)
            else:
                self._inner = ComposedPlan.resume(mixture, config, _inner_state(state), **topology)
            return
        segments = Segments.concat(
            [
                mixture.segments(stream, epoch, seed=config.seed, shuffle=config.shuffle)
                for stream in range(len(mixture.streams))
            ]
        )
        self._segments = segments
        if state is None:
            self._inner = EpochPlan(segments.sizes, config, epoch=epoch, **topology)
        else:
            self._inner = EpochPlan.resume(segments.sizes, config, _inner_state(state), **topology)

    # -- what the plan is: the inner plan's --------------------------------------------------

    @property
    def epoch(self) -> int:
        return int(self._inner.epoch)

    def of_epoch(self, epoch: int) -> bool:
        return bool(self._inner.of_epoch(epoch))

    @property
    def world_size(self) -> int:
        return int(self._inner.world_size)

    @property
    def num_workers(self) -> int:
        return int(self._inner.num_workers)

    @property
    def batch_size(self) -> int:
        return int(self._inner.batch_size)

    @property
    def shuffle_window(self) -> int:
        return int(self._inner.shuffle_window)

    @property
    def quotas(self) -> tuple[int, ...]:
        """What each stream gives this epoch over all ranks, padding aside: the mixture's
        quotas, rounded to whole global batches by mix="stratified" and "per_stream"."""
        if self._segments is None:
            return tuple(self._inner.sequence.quotas)
        return self.mixture.quotas

    def samples_per_rank(self) -> int:
        return int(self._inner.samples_per_rank())

    def worker_num_samples(self, rank: int, worker: int) -> int:
        return int(self._inner.worker_num_samples(rank, worker))

    def batches_per_rank(self) -> int:
        return int(self._inner.batches_per_rank())

    def first_worker(self) -> int:
        return int(self._inner.first_worker())

    def __repr__(self) -> str:
        return f"MixturePlan({self.mixture!r}, {self._inner!r})"

    # -- what a worker reads: the inner plan's, over real shards ----------------------------

    def worker_windows(self, rank: int, worker: int) -> Iterator[Window]:
        windows = self._inner.worker_windows(rank, worker)
        segments = self._segments
        if segments is None:  # a ComposedPlan reads mixture shards already
            return windows
        return (
            Window.lazy(segments.shards_of(w.shards), functools.partial(_mapped_window, segments, w))
            for w in windows
        )

    def worker_samples(self, rank: int, worker: int) -> Iterator[tuple[int, int]]:
        return self._mapped(self._inner.worker_samples(rank, worker))

    def rank_samples(self, rank: int) -> Iterator[tuple[int, int]]:
        return self._mapped(self._inner.rank_samples(rank))

    def _mapped(self, samples: Iterator[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """Samples over segments as samples of mixture shards (a ComposedPlan's are already)."""
        if self._segments is None:
            return samples
        shard, start = self._segments.shard.tolist(), self._segments.start.tolist()
        return ((shard[virtual], start[virtual] + index) for virtual, index in samples)

    # -- resume ----------------------------------------------------------------------------

    def state_dict(self, steps: int) -> dict[str, Any]:
        """The inner plan's state after ``steps`` batches per rank, with the mixture."""
        state = dict(self._inner.state_dict(steps))
        state[Key.MIX] = self.mixture.mix
        state[Key.STREAMS] = self.mixture.describe()
        return state
