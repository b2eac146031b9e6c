"""Kinds of plan behind one protocol and one factory.

    plan = make_plan(shard_sizes, PlanConfig(seed=0), epoch=3, shape=Shape(8, 4, 32))
    plan = make_plan(mixture, config, state=saved, shape=Shape(16, 2, 32))

A kind is a ``PlanKind``: which sources and configs it takes (``selects``), and how it
makes a fresh plan of an epoch or resumes one from a state. ``make_plan`` asks the
registered kinds in order and the first that selects makes the plan, as MosaicML picks
its partition functions from a dict. The kinds are siblings: the local order
(plan/epoch.py), the global order (plan/batches.py), the mixtures (a random mix runs as
one of those over its streams' segments; the composed mixes in plan/composed.py), token
sequences (plan/tokens.py: an order over per-shard sequence counts). A new
kind is one module and one ``register_plan_kind`` line; ``tests/test_plan_kinds.py``
runs every registered kind through one conformance harness.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import numpy as np

from shardstream.errors import PlanError
from shardstream.plan import tokens
from shardstream.plan.batches import GlobalPlan
from shardstream.plan.composed import ComposedPlan
from shardstream.plan.config import PlanConfig, Window
from shardstream.plan.epoch import LocalPlan
from shardstream.plan.mixture import Mixture, check_mixture, check_mixture_state, random_view
from shardstream.plan.orders import order_plan
from shardstream.plan.view import ShardView
from shardstream.types import Shape


@runtime_checkable
class Plan(Protocol):
    """What a sampler, a dataset and a DataLoader use of a plan, whatever its kind."""

    @property
    def epoch(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def shuffle_window(self) -> int: ...
    @property
    def quotas(self) -> tuple[int, ...]: ...
    def of_epoch(self, epoch: int) -> bool: ...
    def samples_per_rank(self) -> int: ...
    def worker_num_samples(self, rank: int, worker: int) -> int: ...
    def batches_per_rank(self) -> int: ...
    def first_worker(self) -> int: ...
    def worker_windows(self, rank: int, worker: int) -> Iterator[Window]: ...
    def worker_samples(self, rank: int, worker: int) -> Iterator[tuple[int, int]]: ...
    def rank_samples(self, rank: int) -> Iterator[tuple[int, int]]: ...
    def state_dict(self, steps: int) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class PlanKind:
    """One kind of plan: ``selects(source, config)`` says whether it makes the plan of
    that source; ``fresh(source, config, epoch, shape)`` and ``resume(source, config,
    state, shape)`` make it."""

    name: str
    selects: Callable[[object, PlanConfig], bool]
    fresh: Callable[[Any, PlanConfig, int, Shape], Plan]
    resume: Callable[[Any, PlanConfig, Mapping[str, Any], Shape], Plan]


_registry: dict[str, PlanKind] = {}
_view = MappingProxyType(_registry)


def register_plan_kind(kind: PlanKind, *, clobber: bool = False) -> None:
    """Add ``kind`` to the kinds ``make_plan`` asks (after those there already); replacing
    one of the same name needs ``clobber=True``."""
    if not isinstance(kind, PlanKind):
        raise PlanError(f"register_plan_kind needs a PlanKind, not {type(kind).__name__}")
    if kind.name in _registry and not clobber:
        raise PlanError(
            f"a plan kind is already registered as {kind.name!r}; pass clobber=True to replace it"
        )
    _registry[kind.name] = kind


def plan_kinds() -> Mapping[str, PlanKind]:
    """Every registered kind by name, in the order ``make_plan`` asks them (read-only)."""
    return _view


def unregister_plan_kind(name: str) -> None:
    """Forget a kind that a test registered (the built-in ones stay)."""
    if name not in _BUILT_IN_NAMES:
        _registry.pop(name, None)


def make_plan(
    source: object,
    config: PlanConfig,
    *,
    shape: Shape,
    epoch: int | None = None,
    state: Mapping[str, Any] | None = None,
) -> Plan:
    """The plan of ``source`` (shard sample counts, a ``ShardView`` or a ``Mixture``) for
    ``shape``: a fresh one of ``epoch``, or the rest of the epoch ``state`` stopped in."""
    if (epoch is None) == (state is None):
        raise PlanError("make_plan takes an epoch (a fresh plan) or a state (a resumed one), one of them")
    if not isinstance(config, PlanConfig):
        raise PlanError(f"config must be a PlanConfig, not {type(config).__name__}")
    if not isinstance(shape, Shape):
        raise PlanError(f"shape must be a Shape, not {type(shape).__name__}")
    for kind in _registry.values():
        if kind.selects(source, config):
            if state is None:
                return kind.fresh(source, config, epoch, shape)  # type: ignore[arg-type]  # not None: checked
            return kind.resume(source, config, state, shape)
    raise PlanError(f"no kind of plan takes a {type(source).__name__} with order={config.order!r}")


# -- the built-in kinds ---------------------------------------------------------------------


def _shards(source: object) -> bool:
    return isinstance(source, (ShardView, np.ndarray)) or (
        isinstance(source, Sequence) and not isinstance(source, (str, bytes))
    )


def _random_fresh(source: object, config: PlanConfig, epoch: int, shape: Shape) -> Plan:
    mixture = check_mixture(source, config)
    return order_plan(config).fresh(random_view(mixture, config, epoch), config, epoch, shape)


def _random_resume(source: object, config: PlanConfig, state: Mapping[str, Any], shape: Shape) -> Plan:
    mixture = check_mixture(source, config)
    epoch = check_mixture_state(mixture, state)
    return order_plan(config).resume(random_view(mixture, config, epoch), config, state, shape)


def _mixed(source: object, random: bool) -> bool:
    return isinstance(source, Mixture) and (source.mix == "random") == random


_BUILT_IN = (
    PlanKind(
        "local",
        lambda source, config: _shards(source) and not config.is_global,
        lambda source, config, epoch, shape: LocalPlan.fresh(ShardView.of(source), config, epoch, shape),
        lambda source, config, state, shape: LocalPlan.resume(ShardView.of(source), config, state, shape),
    ),
    PlanKind(
        "global",
        lambda source, config: _shards(source) and config.is_global,
        lambda source, config, epoch, shape: GlobalPlan.fresh(ShardView.of(source), config, epoch, shape),
        lambda source, config, state, shape: GlobalPlan.resume(ShardView.of(source), config, state, shape),
    ),
    PlanKind(
        "mixture",
        lambda source, config: _mixed(source, random=True),
        _random_fresh,
        _random_resume,
    ),
    PlanKind(
        "composed",
        lambda source, config: _mixed(source, random=False),
        ComposedPlan.fresh,
        ComposedPlan.resume,
    ),
    PlanKind("tokens", tokens.selects, tokens.fresh, tokens.resume),  # type: ignore[arg-type]
)
for _kind in _BUILT_IN:
    register_plan_kind(_kind)
_BUILT_IN_NAMES = frozenset(kind.name for kind in _BUILT_IN)


class _PlanMaker:
    """``EpochPlan(shard_sizes, config, epoch=..., world_size=..., num_workers=...,
    batch_size=...)`` and ``EpochPlan.resume(shard_sizes, config, state, ...)``: the
    plan of one dataset (or, as ``MixturePlan``, of a mixture) by ``make_plan``, with the
    keywords the plan took before ``Shape``."""

    def __init__(self, name: str, takes: Callable[[object], bool], what: str) -> None:
        self._name, self._takes, self._what = name, takes, what

    def __repr__(self) -> str:
        return f"<{self._name}: make_plan of {self._what}>"

    def _source(self, source: object) -> object:
        if not self._takes(source):
            raise PlanError(f"{self._name} needs {self._what}, not {type(source).__name__}")
        return source

    def __call__(
        self,
        source: Any,
        config: PlanConfig,
        *,
        epoch: int,
        world_size: int,
        num_workers: int = 1,
        batch_size: int = 1,
    ) -> Plan:
        shape = Shape(world_size, num_workers, batch_size)
        return make_plan(self._source(source), config, epoch=epoch, shape=shape)

    def resume(
        self,
        source: Any,
        config: PlanConfig,
        state: Mapping[str, Any],
        *,
        world_size: int,
        num_workers: int = 1,
        batch_size: int = 1,
    ) -> Plan:
        """The rest of the epoch a ``state_dict()`` stopped in, for this topology
        (``StateError`` if the state is of another dataset, seed, kind or version)."""
        shape = Shape(world_size, num_workers, batch_size)
        return make_plan(self._source(source), config, state=state, shape=shape)


EpochPlan = _PlanMaker("EpochPlan", _shards, "shard sizes (a flat sequence of sample counts)")
MixturePlan = _PlanMaker("MixturePlan", lambda source: isinstance(source, Mixture), "a Mixture")
