"""Mixtures whose epochs pass over a stream millions of times: planned in O(streams +
shards + window) whatever the passes (NOTE [ Stretched passes ]), and sized from any
weights, repeats, choices and epoch sizes without an overflow (NOTE [ Mixtures ])."""

from __future__ import annotations

import collections
import contextlib
import itertools
import tracemalloc
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardstream.errors import PlanError, ShardstreamError, StateError
from shardstream.plan import stream_passes
from shardstream.plan.config import PlanConfig
from shardstream.plan.kinds import MixturePlan, make_plan
from shardstream.plan.mixture import Mixture, StreamSpec, random_view
from shardstream.plan.state import STRETCHED_PASSES, Key
from tests.test_plan_kinds import SHAPES, _epoch, _shape, cases

# A plan of a huge epoch holds O(segments + window): a few MiB, never O(passes).
MEMORY_BOUND = 64 << 20

HUGE = {
    "epoch_size=10**10": ({"weight": 1}, {"weight": 1}, 10**10),
    "epoch_size=10**15": ({"weight": 10**30}, {"weight": 3 * 10**30}, 10**15),
    "repeat=10**7": ({"repeat": 10**7}, {}, None),
    "choose=10**10": ({}, {"choose": 10**10}, None),
}


def _mixture(case: str, sizes: tuple[list[int], list[int]] = ([100], [60]), mix: str = "random") -> Mixture:
    first, second, epoch_size = HUGE[case]
    streams = [StreamSpec("a", sizes[0], "fa", **first), StreamSpec("b", sizes[1], "fb", **second)]
    return Mixture(streams, epoch_size=epoch_size, mix=mix)


@contextlib.contextmanager
def _peak(limit: int) -> Iterator[None]:
    """Fails unless the block's traced allocations peak under ``limit`` bytes."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"peaked at {peak} bytes"


@contextlib.contextmanager
def _stretch_everything() -> Iterator[None]:
    """Every stream's passes laid in stretches, about one per shard: the stretched layout
    on epochs small enough to check sample by sample."""
    with mock.patch.object(stream_passes, "LISTED_PASSES", 1), mock.patch.object(stream_passes, "SPREAD", 1):
        yield


# -- huge epochs: the first samples at once, in bounded memory ----------------------------


@pytest.mark.parametrize("case", HUGE)
def test_the_first_samples_of_a_huge_mixture_are_planned_in_bounded_memory(case):
    with _peak(MEMORY_BOUND):
        mixture = _mixture(case, ([100, 0, 7], [60]))
        plan = MixturePlan(mixture, PlanConfig(seed=1), epoch=3, world_size=4, num_workers=2, batch_size=8)
        first = list(itertools.islice(plan.rank_samples(2), 40))
        window = next(plan.worker_windows(1, 1))
        runs, order = window.runs, window.order
    assert plan.quotas == mixture.quotas
    assert any(mixture.stretched)
    assert plan.samples_per_rank() * 4 >= mixture.total
    sizes = mixture.sizes
    assert len(first) == 40
    assert all(0 <= i < sizes[s] for s, i in first)
    assert sum(len(r) for r in runs) == order.size <= plan.shuffle_window
    assert set(window.shards) >= {r.shard for r in runs}
    assert plan.shuffle_window <= 4 * max(sizes)  # the listing's window: four mean listed segments


@pytest.mark.parametrize("case", HUGE)
def test_a_huge_mixture_resumes_where_it_stopped_and_names_its_layout(case):
    mixture = _mixture(case)
    config = PlanConfig(seed=2)
    plan = MixturePlan(mixture, config, epoch=5, world_size=2, num_workers=2, batch_size=4)
    state = plan.state_dict(7)
    assert state[Key.STREAM_PASSES] == STRETCHED_PASSES
    resumed = MixturePlan.resume(mixture, config, state, world_size=2, num_workers=2, batch_size=4)
    whole = list(itertools.islice(plan.rank_samples(1), 7 * 4 + 24))
    assert list(itertools.islice(resumed.rank_samples(1), 24)) == whole[7 * 4 :]
    listed = {key: value for key, value in state.items() if key != Key.STREAM_PASSES}
    with pytest.raises(
        StateError, match=r"lists every pass of its streams.*stretches.*start the epoch again"
    ):
        MixturePlan.resume(mixture, config, listed, world_size=2, num_workers=2, batch_size=4)


@pytest.mark.parametrize("mix", ["random", "stratified", "per_stream"])
def test_every_mix_plans_a_huge_epoch_in_bounded_memory(mix):
    config = PlanConfig(seed=3, order="global", global_batch_size=64)
    with _peak(MEMORY_BOUND):
        mixture = _mixture("epoch_size=10**10", mix=mix)
        plan = make_plan(mixture, config, epoch=2, shape=_shape(config, 2, 2))
        first = list(itertools.islice(plan.rank_samples(1), 64))
    assert len(first) == 64
    assert all(0 <= i < mixture.sizes[s] for s, i in first)
    batch = plan.global_batch(0)  # type: ignore[attr-defined]  # a plan of global batches
    streams = collections.Counter(mixture.stream_of(s) for s, _ in batch)
    assert len(batch) == 64
    assert len(streams) == 2 or mix == "per_stream"  # the streams mix within a batch


@pytest.mark.parametrize("order", ["local", "global"])
def test_a_window_over_stretches_names_exactly_the_shards_it_reads(order):
    streams = [StreamSpec("a", [5] * 300, "fa", repeat=10**6), StreamSpec("b", [7, 9], "fb", choose=10**8)]
    mixture = Mixture(streams)
    extra = {"order": "global", "global_batch_size": 64} if order == "global" else {}
    config = PlanConfig(seed=5, **extra)
    plan = make_plan(mixture, config, epoch=1, shape=_shape(config, 2, 2))
    state = plan.state_dict(3)  # resumed part way into a window: its runs are laid out again
    resumed = make_plan(mixture, config, state=state, shape=_shape(config, 2, 2))
    assert all(mixture.stretched)
    for current in (plan, resumed):
        for window in itertools.islice(current.worker_windows(1, 0), 3):
            assert set(window.shards) == {run.shard for run in window.runs}
            assert len(window.shards) < 48  # what a reader's sidecar cache holds


def test_a_listed_mixture_refuses_a_state_of_stretched_passes():
    mixture = Mixture([StreamSpec("a", [5, 3], "fa", repeat=2), StreamSpec("b", [4], "fb")])
    assert not any(mixture.stretched)
    plan = MixturePlan(mixture, PlanConfig(seed=1), epoch=0, world_size=1)
    state = {**plan.state_dict(2), Key.STREAM_PASSES: STRETCHED_PASSES}
    with pytest.raises(StateError, match="lists every pass"):
        MixturePlan.resume(mixture, PlanConfig(seed=1), state, world_size=1)
    assert Key.STREAM_PASSES not in plan.state_dict(2)  # a listed mixture's states are as before


def test_a_huge_mixture_streams_through_a_dataset(tmp_path):
    import shardstream
    from tests.resume_harness import write_dataset

    write_dataset(str(tmp_path / "a"), [60, 40])
    write_dataset(str(tmp_path / "b"), [60])
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for case, streams, epoch_size in [
        ("epoch_size=10**10", [shardstream.Stream(a, weight=1), shardstream.Stream(b, weight=2)], 10**10),
        ("epoch_size=10**15", [shardstream.Stream(a, weight=1), shardstream.Stream(b, weight=1)], 10**15),
        ("repeat=10**7", [shardstream.Stream(a, repeat=10**7), shardstream.Stream(b)], None),
        ("choose=10**10", [shardstream.Stream(a), shardstream.Stream(b, choose=10**10)], None),
    ]:
        with _peak(4 * MEMORY_BOUND):
            dataset = shardstream.StreamingDataset(
                streams, epoch_size=epoch_size, seed=4, num_replicas=2, rank=1
            )
            samples = list(itertools.islice(iter(dataset), 12))
        assert len(samples) == 12, case
        assert {s["__stream__"] for s in samples} <= {0, 1}, case
        assert len(dataset) * 2 >= sum(dataset.quotas), case


# -- stretched and listed layouts give the same samples ----------------------------------


@st.composite
def _small_mixtures(draw: st.DrawFn) -> Mixture:
    streams = []
    for i in range(draw(st.integers(1, 3))):
        sizes = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4).filter(lambda s: sum(s) > 0))
        sizing = draw(
            st.sampled_from(["none", "repeat", "choose"]) if i or draw(st.booleans()) else st.just("weight")
        )
        if streams and "weight" in streams[0][2]:
            sizing = "weight"
        extra = {
            "none": {},
            "repeat": {"repeat": draw(st.sampled_from([0.5, 1, 2.5, 7, 13]))},
            "choose": {"choose": draw(st.integers(1, 60))},
            "weight": {"weight": draw(st.integers(1, 5))},
        }[sizing]
        streams.append((f"s{i}", sizes, extra))
    weighted = "weight" in streams[0][2]
    epoch_size = draw(st.integers(1, 150)) if weighted else None
    specs = [StreamSpec(name, sizes, f"f{name}", **extra) for name, sizes, extra in streams]
    try:
        return Mixture(specs, epoch_size=epoch_size)
    except PlanError:  # a stream that gets no samples of a small epoch
        assume(False)
        raise


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixture=_small_mixtures(), seed=st.integers(0, 2**20), shuffle=st.booleans(), epoch=st.integers(0, 5))
def test_stretched_passes_take_exactly_the_samples_the_listing_takes(mixture, seed, shuffle, epoch):
    config = PlanConfig(seed=seed, shuffle=shuffle)
    listed = random_view(mixture, config, epoch)
    with _stretch_everything():
        stretched = Mixture(
            mixture.streams, epoch_size=None if mixture.streams[0].weight is None else mixture.total
        )
        view = random_view(stretched, config, epoch)
        plan = MixturePlan(stretched, config, epoch=epoch, world_size=1, num_workers=2)
        samples = list(plan.rank_samples(0))
    assert all(stretched.stretched)
    assert view.segments is not None
    assert view.segments.source is not None
    assert stretched.quotas == mixture.quotas
    assert len(view.sizes) <= sum(int(np.count_nonzero(s.sizes)) for s in mixture.streams) + len(
        mixture.streams
    )
    assert view.listed == -(-mixture.total // len(listed.sizes))  # the listing's mean, counted not made
    expected = collections.Counter(
        listed.samples(iter((v, i) for v, n in enumerate(listed.sizes) for i in range(n)))
    )
    assert collections.Counter(samples) == expected
    for stream, quota in enumerate(mixture.quotas):  # each sample q // N or q // N + 1 times
        spec, lo = mixture.streams[stream], int(mixture.shard_offsets[stream])
        mine = [expected[(lo + s, i)] for s, n in enumerate(spec.sizes) for i in range(n)]
        assert sum(mine) == quota
        assert max(mine) - min(mine) <= 1


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_stretched_stream_beside_a_listed_one_gives_the_listings_samples(shuffle):
    streams = [StreamSpec("a", [5, 0, 3], "fa", repeat=40), StreamSpec("b", [4], "fb", repeat=1.5)]
    config = PlanConfig(seed=9, shuffle=shuffle)
    listed = Mixture(streams)
    whole = random_view(listed, config, 3)
    with mock.patch.object(stream_passes, "SPREAD", 4):
        mixture = Mixture(streams)
        plan = MixturePlan(mixture, config, epoch=3, world_size=1, num_workers=3, batch_size=2)
        samples = collections.Counter(plan.rank_samples(0))
    assert mixture.stretched == (True, False)
    assert not any(listed.stretched)
    indices = ((v, i) for v, n in enumerate(whole.sizes.tolist()) for i in range(n))
    assert samples == collections.Counter(whole.samples(indices))
    assert plan.shuffle_window == MixturePlan(listed, config, epoch=3, world_size=1).shuffle_window


@pytest.mark.parametrize("kind", ["mixture", "composed"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_stretched_mixtures_resume_on_another_shape_with_every_sample_once(kind, data):
    with _stretch_everything():
        source, config = data.draw(cases(kind))
        before, after = data.draw(st.sampled_from(SHAPES)), data.draw(st.sampled_from(SHAPES))
        plan = make_plan(source, config, epoch=1, shape=_shape(config, *before))
        steps = data.draw(st.integers(0, plan.batches_per_rank()))
        whole = _epoch(plan)
        resumed = make_plan(source, config, state=plan.state_dict(steps), shape=_shape(config, *after))
        rest = _epoch(resumed)
    assert all(source.stretched)
    counts = [sum(len(b) for b in rank) for rank in whole]
    assert counts == [plan.samples_per_rank()] * len(whole)
    if config.is_global:
        joined = [list(itertools.chain(*parts)) for parts in zip(*whole, strict=True)]
        assert [list(itertools.chain(*parts)) for parts in zip(*rest, strict=True)] == joined[steps:]
        return
    taken = collections.Counter(s for rank in whole for batch in rank[:steps] for s in batch)
    left = collections.Counter(s for rank in rest for batch in rank for s in batch)
    assert set(taken | left) == {s for rank in whole for batch in rank for s in batch}
    if before == after:
        assert rest == [rank[steps:] for rank in whole]


# -- sizing from any numbers: a plan, or a clear refusal ---------------------------------

_NUMBERS = (
    st.integers(1, 10**3)
    | st.integers(1, 10**18)
    | st.integers(10**18, 10**400)
    | st.floats(1e-300, 1e300, allow_nan=False)
    | st.fractions(min_value=0, max_value=10**9).filter(lambda f: f > 0)
)


@st.composite
def _sizings(draw: st.DrawFn) -> tuple[list[tuple[list[int], dict[str, object]]], int | None]:
    """``([(shard sizes, {weight | repeat | choose: number}), ...], epoch_size)``."""
    count = draw(st.integers(1, 3))
    sizes = [draw(st.lists(st.integers(0, 300), min_size=1, max_size=3).filter(any)) for _ in range(count)]
    if draw(st.booleans()):
        epoch_size = draw(st.none() | st.integers(1, 10**15) | st.integers(10**15, 10**25))
        return [(s, {"weight": draw(_NUMBERS)}) for s in sizes], epoch_size
    streams = []
    for s in sizes:
        how = draw(st.sampled_from(["repeat", "choose", "none"]))
        value = draw(_NUMBERS if how == "repeat" else st.integers(1, 10**15) | st.integers(1, 10**25))
        streams.append((s, {} if how == "none" else {how: value}))
    return streams, None


def _sized(
    streams: list[tuple[list[int], dict[str, object]]], epoch_size: int | None
) -> Mixture | ShardstreamError:
    try:
        specs = [StreamSpec(f"s{i}", s, **how) for i, (s, how) in enumerate(streams)]
        return Mixture(specs, epoch_size=epoch_size)
    except ShardstreamError as error:
        return error


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizing=_sizings(),
    world=st.integers(1, 9),
    workers=st.integers(1, 4),
    epoch=st.integers(0, 10**6) | st.integers(0, 2**80),
)
def test_any_sizing_plans_equal_ranks_in_bounded_segments_or_is_refused_clearly(
    sizing, world, workers, epoch
):
    mixture = _sized(*sizing)
    if isinstance(mixture, ShardstreamError):  # never OverflowError, MemoryError or a bare ValueError
        assert isinstance(mixture, PlanError)
        assert any(word in str(mixture) for word in ("stream", "epoch", "weight"))  # says which number
        return
    assert sum(mixture.quotas) == mixture.total
    view = random_view(mixture, PlanConfig(seed=epoch % 2**64), epoch)
    shards = sum(int(np.count_nonzero(s.sizes)) for s in mixture.streams)
    assert len(view.sizes) <= stream_passes.LISTED_PASSES * shards + stream_passes.SPREAD + 2 * len(
        mixture.streams
    )
    assert int(view.sizes.sum()) == mixture.total
    plan = MixturePlan(
        mixture, PlanConfig(seed=epoch % 2**64), epoch=epoch, world_size=world, num_workers=workers
    )
    per_rank = [sum(plan.worker_num_samples(r, w) for w in range(workers)) for r in range(world)]
    assert per_rank == [plan.samples_per_rank()] * world
    assert 0 <= per_rank[0] * world - mixture.total < world
    first = list(itertools.islice(plan.rank_samples(world - 1), 3))
    assert all(0 <= i < mixture.sizes[s] for s, i in first)
