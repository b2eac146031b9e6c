"""Every registered kind of plan through one conformance harness (plan/kinds.py).

A kind is chosen by ``make_plan`` from the registry; whatever it is, its plans keep the
``Plan`` protocol's promises: equal samples per rank, every sample of the epoch (or of
each stream's quota) before padding, resume equal to continuing on another shape, and
states of another kind refused. A kind defined here, in this file alone (one class and
one ``register_plan_kind`` line), runs through the same harness, as
``test_formats_third.py`` does for formats.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardstream.errors import PlanError, StateError
from shardstream.plan import Plan, PlanConfig, PlanKind, Shape, make_plan, plan_kinds, register_plan_kind
from shardstream.plan.epoch import LocalPlan
from shardstream.plan.kinds import unregister_plan_kind
from shardstream.plan.mixture import Mixture, StreamSpec
from shardstream.plan.tokens import TokenSequences
from shardstream.plan.view import Segments, ShardView

# -- a kind defined by this file alone -----------------------------------------------------


@dataclass(frozen=True)
class Reversed:
    """A dataset read with its shards in reverse manifest order (a kind of plan that only
    this test knows): its plans run the local order over virtual shards."""

    sizes: tuple[int, ...]


def _reversed_view(source: Reversed) -> ShardView:
    count = len(source.sizes)
    shards = np.arange(count - 1, -1, -1, dtype=np.int64)
    stops = np.asarray(source.sizes, dtype=np.int64)[shards]
    segments = Segments(shards, np.zeros(count, dtype=np.int64), stops)
    return ShardView(stops, segments, {"reversed": True})


REVERSED = PlanKind(
    "reversed-test",
    lambda source, config: isinstance(source, Reversed) and not config.is_global,
    lambda source, config, epoch, shape: LocalPlan.fresh(_reversed_view(source), config, epoch, shape),
    lambda source, config, state, shape: LocalPlan.resume(_reversed_view(source), config, state, shape),
)


@pytest.fixture(autouse=True, scope="module")
def _reversed_kind() -> Iterator[None]:
    register_plan_kind(REVERSED)
    yield
    unregister_plan_kind(REVERSED.name)


# -- what each kind is made of --------------------------------------------------------------

GLOBAL_BATCH = 4  # every shape below divides it


def _sizes(draw: st.DrawFn) -> list[int]:
    return draw(st.lists(st.integers(0, 9), min_size=1, max_size=6).filter(lambda s: sum(s) >= 4))


@st.composite
def cases(draw: st.DrawFn, kind: str) -> tuple[object, PlanConfig]:
    """A source and a config that ``kind`` plans."""
    seed, shuffle = draw(st.integers(0, 2**32)), draw(st.booleans())
    window = draw(st.none() | st.integers(1, 12))
    if kind in ("global", "composed") or (kind == "tokens" and draw(st.booleans())):
        config = PlanConfig(
            seed=seed, shuffle=shuffle, shuffle_window=window, order="global", global_batch_size=GLOBAL_BATCH
        )
    else:
        config = PlanConfig(seed=seed, shuffle=shuffle, shuffle_window=window)
    if kind in ("local", "global"):
        return _sizes(draw), config
    if kind == "reversed-test":
        return Reversed(tuple(_sizes(draw))), config
    if kind == "tokens":
        return TokenSequences(np.array(_sizes(draw)), 16, "concat", "split", "bpe@0"), config
    streams = [
        StreamSpec(f"s{i}", _sizes(draw), f"f{i}", repeat=draw(st.sampled_from([None, 0.5, 2])))
        for i in range(draw(st.integers(1, 3)))
    ]
    mix = "random" if kind == "mixture" else draw(st.sampled_from(["stratified", "per_stream"]))
    mixture = Mixture(streams, mix=mix)
    assume(not config.is_global or mixture.total >= GLOBAL_BATCH)  # a larger batch is refused
    return mixture, config


SHAPES = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)]


def _shape(config: PlanConfig, world: int, workers: int) -> Shape:
    return Shape(world, workers, config.rank_batch_size(world))


def _streams(source: object) -> np.ndarray:
    """Shard offsets of each stream (one stream for a dataset of its own)."""
    if isinstance(source, Mixture):
        return source.shard_offsets
    return np.array([0, len(_own(source))])


def _own(source: object) -> Sequence[int]:
    """The shard sizes of a source that is one dataset."""
    return source.sizes if isinstance(source, (Reversed, TokenSequences)) else source  # type: ignore[return-value]


def _batches(plan: Plan, rank: int) -> Iterator[list[tuple[int, int]]]:
    """A rank's batches as its DataLoader takes them: round-robin over workers."""
    count, size = plan.num_workers, plan.batch_size
    turn = [(plan.first_worker() + i) % count for i in range(count)]
    streams = {w: plan.worker_samples(rank, w) for w in turn}
    while turn:
        for worker in list(turn):
            batch = list(itertools.islice(streams[worker], size))
            if len(batch) < size:
                turn.remove(worker)
            if batch:
                yield batch


def _epoch(plan: Plan) -> list[list[list[tuple[int, int]]]]:
    return [list(_batches(plan, rank)) for rank in range(plan.world_size)]


KINDS = ["local", "global", "mixture", "composed", "tokens", "reversed-test"]


def test_the_built_in_kinds_and_this_files_kind_are_registered():
    assert [name for name in plan_kinds() if name in KINDS] == KINDS
    with pytest.raises(PlanError, match="already registered"):
        register_plan_kind(REVERSED)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_kind_gives_equal_counts_and_every_sample_of_its_quota(kind, data):
    source, config = data.draw(cases(kind))
    world, workers = data.draw(st.sampled_from(SHAPES))
    plan = make_plan(source, config, epoch=data.draw(st.integers(0, 3)), shape=_shape(config, world, workers))
    epoch = _epoch(plan)
    counts = [sum(len(b) for b in rank) for rank in epoch]
    assert counts == [plan.samples_per_rank()] * world  # equal work: DDP never hangs
    seen = collections.Counter(s for rank in epoch for batch in rank for s in batch)
    offsets = _streams(source)
    by_stream = collections.Counter(
        int(np.searchsorted(offsets, shard, side="right")) - 1 for shard, _ in seen.elements()
    )
    padding = plan.batch_size * world if config.is_global else world
    for stream, quota in enumerate(plan.quotas):
        assert quota <= by_stream[stream] < quota + padding  # every sample of its quota, then padding
    if not isinstance(source, Mixture):  # a dataset of its own: each sample once, then repeats
        assert {(s, i) for s, n in enumerate(_own(source)) for i in range(n)} == set(seen)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_kind_resumes_on_another_shape_as_it_would_have_continued(kind, data):
    source, config = data.draw(cases(kind))
    before, after = data.draw(st.sampled_from(SHAPES)), data.draw(st.sampled_from(SHAPES))
    plan = make_plan(source, config, epoch=1, shape=_shape(config, *before))
    steps = data.draw(st.integers(0, plan.batches_per_rank()))
    whole = _epoch(plan)
    resumed = make_plan(source, config, state=plan.state_dict(steps), shape=_shape(config, *after))
    rest = _epoch(resumed)
    if config.is_global:  # the same global batches, whatever the shape, each laid out alone too
        joined = [list(itertools.chain(*parts)) for parts in zip(*whole, strict=True)]
        assert [list(itertools.chain(*parts)) for parts in zip(*rest, strict=True)] == joined[steps:]
        assert [plan.global_batch(k) for k in range(len(joined))] == joined  # type: ignore[attr-defined]
        return
    taken = {s for rank in whole for batch in rank[:steps] for s in batch}
    left = {s for rank in rest for batch in rank for s in batch}
    assert taken | left == {s for rank in whole for batch in rank for s in batch}
    if before == after:  # the same shape: exactly the batches it would have yielded
        assert rest == [rank[steps:] for rank in whole]


EXAMPLES = {
    "local": ([5, 3, 4], PlanConfig(seed=3)),
    "global": ([5, 3, 4], PlanConfig(seed=3, order="global", global_batch_size=GLOBAL_BATCH)),
    "mixture": (Mixture([StreamSpec("a", [5, 3], "fa"), StreamSpec("b", [4], "fb")]), PlanConfig(seed=3)),
    "composed": (
        Mixture([StreamSpec("a", [5, 3], "fa"), StreamSpec("b", [4], "fb")], mix="stratified"),
        PlanConfig(seed=3, order="global", global_batch_size=GLOBAL_BATCH),
    ),
    "tokens": (TokenSequences(np.array([5, 3, 4]), 16, "concat", "split", "bpe@0"), PlanConfig(seed=3)),
    "reversed-test": (Reversed((5, 3, 4)), PlanConfig(seed=3)),
}


@pytest.mark.parametrize(
    ("field", "value"),
    [("seq_len", 32), ("packing", "best_fit"), ("long_docs", "truncate"), ("tokenizer", "bpe@1")],
)
def test_a_token_state_resumes_only_sequences_made_the_same_way(field, value):
    source, config = EXAMPLES["tokens"]
    state = make_plan(source, config, epoch=0, shape=Shape(2, 1, 1)).state_dict(2)
    again = make_plan(source, config, state=state, shape=Shape(1, 2, 1))
    assert again.samples_per_rank() == 12 - 4
    other = TokenSequences(source.sizes, **{**source.record(), field: value})
    with pytest.raises(StateError, match=f"saved over sequences with {field}="):
        make_plan(other, config, state=state, shape=Shape(1, 2, 1))


@pytest.mark.parametrize(("saved", "loaded"), [(a, b) for a in KINDS for b in KINDS if a != b])
def test_a_state_of_one_kind_is_refused_by_another(saved, loaded):
    source, config = EXAMPLES[saved]
    state = make_plan(source, config, epoch=0, shape=_shape(config, 1, 1)).state_dict(1)
    source, config = EXAMPLES[loaded]
    with pytest.raises(StateError):
        make_plan(source, config, state=state, shape=_shape(config, 1, 1))


def test_make_plan_takes_an_epoch_or_a_state_and_names_a_source_no_kind_takes():
    config = PlanConfig()
    with pytest.raises(PlanError, match="one of them"):
        make_plan([3], config, shape=Shape())
    with pytest.raises(PlanError, match="one of them"):
        make_plan([3], config, epoch=0, state={}, shape=Shape())
    with pytest.raises(PlanError, match="no kind of plan takes a dict"):
        make_plan({"a": 1}, config, epoch=0, shape=Shape())
    with pytest.raises(PlanError, match="shape must be a Shape"):
        make_plan([3], config, epoch=0, shape=(1, 1, 1))  # type: ignore[arg-type]
