"""Mixtures: one epoch drawn from several datasets (streams), each its own share.

NOTE [ Mixtures ]
A mixture is a list of streams, each a dataset with its own shards, and one quota per
stream: the samples it gives every epoch. Quotas come from exactly one way of sizing per
mixture, as MosaicML Streaming's: every stream a ``weight`` (a share of the epoch,
normalised; the epoch is ``epoch_size`` samples, by default the largest at which no
stream repeats), or none: then each stream a ``repeat`` (a multiple of its own size:
0.5 takes half of it, 2.5 two and a half times) or a ``choose`` (samples per epoch), or
neither (all of it once).

Which samples of a stream an epoch takes: NOTE [ A stream's passes ], at ``Mixture.segments``.

The segments are the shards a plan runs on ("virtual shards"): with ``mix="random"`` one
``EpochPlan`` (or ``GlobalPlan``, order="global") over all streams' segments, which
interleaves the streams through its shard order and shuffle window and keeps every
guarantee it has (equal counts per rank, exact resume on any topology, reads of
contiguous runs); its runs over segments become runs of real shards. ``mix="stratified"``
and ``"per_stream"`` compose global batches from each stream's own sequence
(``ComposedPlan``, plan/composed.py). Memory is O(segments + window): O(shards) for each
stream, whatever its passes per epoch (NOTE [ Stretched passes ]).

A mixture's state is its plan's, plus the mix and the streams (name, fingerprint, shard
and sample counts, quota), and ``stream_passes`` where their passes are stretched: a state
of one mixture refuses to load into another and names the stream that differs.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from shardstream.counts import MAX_COUNT, check_int
from shardstream.errors import PlanError, StateError, shown
from shardstream.plan.config import PlanConfig, check_count, shard_sizes_array
from shardstream.plan.state import STRETCHED_PASSES, Key
from shardstream.plan.stream_passes import StreamPasses, Stretches, budget, stretched
from shardstream.plan.view import Segments, ShardView

MIXES = ("random", "stratified", "per_stream")
# The keys of one stream in a mixture's state (Mixture.describe).
_DESCRIBED = (Key.NAME, Key.FINGERPRINT, Key.NUM_SHARDS, Key.NUM_SAMPLES, Key.QUOTA)


def _positive(value: object, name: str) -> Fraction:
    """A finite positive number as an exact fraction (a float by its shortest repr; an
    integer as it is, however large: ``float(10**400)`` would overflow)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PlanError(f"{name} must be a positive number, not {shown(value)}")
    if isinstance(value, numbers.Rational):
        exact = Fraction(value)
    else:
        try:
            approximate = float(value)
        except (OverflowError, ValueError):
            raise PlanError(f"{name} must be a finite positive number, not {shown(value)}") from None
        if not math.isfinite(approximate):
            raise PlanError(f"{name} must be a finite positive number, not {shown(value)}")
        exact = Fraction(repr(approximate))
    if exact <= 0:
        raise PlanError(f"{name} must be a positive number, not {shown(value)}")
    return exact


def _checked_quotas(streams: Sequence[StreamSpec], quotas: tuple[int, ...]) -> tuple[int, ...]:
    """``quotas``, or ``PlanError`` naming the stream whose epoch share no count can hold."""
    for spec, quota in zip(streams, quotas, strict=True):
        if quota > MAX_COUNT:
            raise PlanError(
                f"stream {spec.name!r} would give {shown(quota)} samples an epoch, more than {MAX_COUNT}: "
                "give it a smaller repeat, choose or epoch_size"
            )
    if sum(quotas) > MAX_COUNT:
        raise PlanError(f"the mixture's epoch of {shown(sum(quotas))} samples is more than {MAX_COUNT}")
    return quotas


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
        self.quotas = _checked_quotas(self.streams, _quotas(self.streams, epoch_size))
        self.total = sum(self.quotas)
        counts = [spec.sizes.size for spec in self.streams]
        self.shard_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        totals = [spec.num_samples for spec in self.streams]
        self.sample_offsets = np.concatenate([[0], np.cumsum(totals)]).astype(np.int64)
        self.sizes = np.concatenate([spec.sizes for spec in self.streams])
        self.sizes.setflags(write=False)
        # NOTE [ Stretched passes ]: by each stream's own quota, the same for every epoch
        self.stretched = tuple(
            stretched(spec.sizes, quota, self.total)
            for spec, quota in zip(self.streams, self.quotas, strict=True)
        )

    def __repr__(self) -> str:
        shares = ", ".join(f"{s.name}: {q}" for s, q in zip(self.streams, self.quotas, strict=True))
        return f"Mixture(mix={self.mix!r}, {shares})"

    def stream_of(self, shards: Any) -> Any:
        """The stream of mixture shard numbers (an int, or an array of them)."""
        found = np.searchsorted(self.shard_offsets, shards, side="right") - 1
        return int(found) if np.ndim(found) == 0 else found

    # NOTE [ A stream's passes ]
    # Which samples of a stream an epoch takes: the stream has an endless sequence of passes,
    # each its shards in a keyed order (manifest order without shuffle) laid end to end, and
    # epoch ``e`` takes positions ``[e q, (e + 1) q)`` of it (``q`` the quota, ``N`` the
    # stream's samples). So no sample of a stream repeats before every sample of it has been
    # seen, and a downsampled stream takes the next part of its passes each epoch (another
    # subset every epoch, all of the stream over successive epochs). Within one epoch every
    # sample must come ``q // N`` or ``q // N + 1`` times (at most once when downsampled); an
    # epoch that takes the tail of one pass and the head of the next would break that with two
    # unrelated orders (the head may hold samples of the tail). So the passes keep one order
    # for a cycle of ``q / gcd(N, q)`` passes, after which epochs and passes align again
    # (``N / gcd(N, q)`` epochs), the order ``permutation(shards, (seed, c, TAG_PASS,
    # stream))`` for cycle ``c``: a head and the tail before it then never overlap (``q <=
    # N``) or overlap in exactly ``q mod N`` samples. A fresh order comes every cycle: every
    # epoch when ``q`` divides or is a multiple of ``N``. Listed, those positions are
    # ``Segments``: runs of one real shard each, a few per shard of the stream and epoch; a
    # stream of many passes is laid in stretches instead (NOTE [ Stretched passes ]).
    def passes(
        self, stream: int, epoch: int, *, seed: int, shuffle: bool, quota: int | None = None
    ) -> StreamPasses:
        """The passes stream ``stream`` gives its quota (or ``quota``) of in ``epoch``."""
        take = self.quotas[stream] if quota is None else check_count(quota, "quota")
        return StreamPasses(
            self.streams[stream].sizes,
            stream=stream,
            offset=int(self.shard_offsets[stream]),
            seed=seed,
            shuffle=shuffle,
            epoch=check_count(epoch, "epoch"),
            quota=take,
        )

    def segments(
        self, stream: int, epoch: int, *, seed: int, shuffle: bool, quota: int | None = None
    ) -> Segments:
        """The samples stream ``stream`` gives in ``epoch`` (its quota, or ``quota``), in
        pass order, as runs of mixture shards, or stretches of its passes where it has many
        (NOTE [ A stream's passes ], NOTE [ Stretched passes ])."""
        return self.lay(self.passes(stream, epoch, seed=seed, shuffle=shuffle, quota=quota))

    def lay(self, passes: StreamPasses) -> Segments:
        """A stream's passes of an epoch as segments: listed, or in stretches."""
        if not self.stretched[passes.stream]:
            return passes.listed()
        return Stretches([passes], self.budget(passes), 1).segments()

    def budget(self, passes: StreamPasses) -> int:
        """The segments a stream's passes of an epoch may take (NOTE [ Stretched passes ])."""
        return budget(len(passes.nonempty), passes.quota, self.total)

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


def mixture_view(
    mixture: Mixture,
    segments: Segments | None = None,
    quotas: tuple[int, ...] = (),
    listed: int | None = None,
) -> ShardView:
    """The shards a plan of ``mixture`` runs on: its streams' segments (mix="random"), or its
    shards as they are; its states carry the mix and the streams, and whether their passes
    are stretched (NOTE [ Mixtures ], NOTE [ Stretched passes ])."""
    state: dict[str, Any] = {Key.MIX: mixture.mix, Key.STREAMS: mixture.describe()}
    if any(mixture.stretched):
        state[Key.STREAM_PASSES] = STRETCHED_PASSES
    sizes = mixture.sizes if segments is None else segments.sizes
    return ShardView(sizes, segments, state, quotas or mixture.quotas, listed)


def check_mixture(mixture: object, config: PlanConfig) -> Mixture:
    """``mixture``, or ``PlanError`` if it or ``config`` cannot make a plan of one."""
    if not isinstance(mixture, Mixture):
        raise PlanError(f"a mixture's plan needs a Mixture, not {type(mixture).__name__}")
    if not isinstance(config, PlanConfig):
        raise PlanError(f"config must be a PlanConfig, not {type(config).__name__}")
    if config.dataset_bytes is not None:  # NOTE [ Global window ]
        raise PlanError(
            "dataset_bytes sizes the global window of one dataset; a mixture's window is "
            "four mean-sized shards, as a mixture of StreamingDataset streams has it"
        )
    if mixture.mix != "random" and not config.is_global:
        raise PlanError(
            f"mix={mixture.mix!r} composes global batches: it needs order='global' and a global_batch_size"
        )
    return mixture


def check_mixture_state(mixture: Mixture, state: object) -> int:
    """The epoch of a mixture's state, or ``StateError`` if it is of another mixture (it names
    the stream that differs), of another mix, or of a single dataset."""
    if not isinstance(state, Mapping):
        raise StateError(f"a plan state is a mapping, not {type(state).__name__}")
    if Key.STREAMS not in state:
        raise StateError("the state is of a single dataset, not of a mixture")
    if state.get(Key.MIX) != mixture.mix:
        raise StateError(
            f"the state was saved with mix={shown(state.get(Key.MIX))}, this mixture has mix={mixture.mix!r}"
        )
    mixture.check(state[Key.STREAMS])
    _check_layout(mixture, state.get(Key.STREAM_PASSES))
    return check_int(state.get(Key.EPOCH), "plan state field 'epoch'", error=StateError)


def _check_layout(mixture: Mixture, saved: object) -> None:
    """``StateError`` unless a state lays the streams' passes as this mixture does: listed
    (no ``stream_passes``, as every state before) or stretched (NOTE [ Stretched passes ])."""
    many = [spec.name for spec, s in zip(mixture.streams, mixture.stretched, strict=True) if s]
    if (saved is None and not many) or (type(saved) is int and saved == STRETCHED_PASSES and many):
        return
    if not many:
        raise StateError(
            f"the state was saved with stream_passes={shown(saved)}, and this mixture lists every pass "
            "of its streams: the state is of another mixture or shardstream; start the epoch again"
        )
    was = "lists every pass of its streams" if saved is None else f"has stream_passes={shown(saved)}"
    raise StateError(
        f"the state {was}, and this shardstream lays the many passes of stream {many[0]!r} in "
        f"stretches (stream_passes={STRETCHED_PASSES}, NOTE [ Stretched passes ]): the rest of that "
        "epoch is not this one's; resume it with the shardstream that saved it, or start the epoch again"
    )


def random_view(mixture: Mixture, config: PlanConfig, epoch: int) -> ShardView:
    """mix="random": every stream's segments of ``epoch`` as the shards of one plan of the
    config's order, which interleaves the streams (NOTE [ Mixtures ]); where some are
    stretched, the default window is the listing's (NOTE [ Stretched passes ])."""
    passes = [
        mixture.passes(stream, epoch, seed=config.seed, shuffle=config.shuffle)
        for stream in range(len(mixture.streams))
    ]
    listed = [p for p, stretched in zip(passes, mixture.stretched, strict=True) if not stretched]
    parts = [p.listed() for p in listed]
    if len(listed) == len(passes):
        return mixture_view(mixture, Segments.concat(parts))
    # the stretched streams interleaved in rounds of a mean listed segment (NOTE [ Stretched passes ])
    mean = -(-mixture.total // max(1, sum(p.count() for p in passes)))
    stretched = [p for p in passes if mixture.stretched[p.stream]]
    parts.append(Stretches(stretched, sum(mixture.budget(p) for p in stretched), mean).segments())
    return mixture_view(mixture, Segments.concat(parts), listed=mean)
