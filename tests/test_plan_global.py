"""order="global" (NOTE [ Global order ]): the same global batches on every topology,
every sample once per epoch, resume on another (R, W), and clear refusals."""

from __future__ import annotations

import collections

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardstream.errors import PlanError, StateError
from shardstream.plan import EpochPlan, PlanConfig
from shardstream.plan.batches import GlobalPlan

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shard_sizes = st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, 40)), min_size=0, max_size=20)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def global_configs(draw):
    return PlanConfig(
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**64 - 1)),
        drop_last=draw(st.booleans()),
        shuffle_window=draw(st.one_of(st.none(), st.integers(1, 60))),
        order="global",
        global_batch_size=draw(st.integers(1, 24)),
        read_lanes=draw(st.one_of(st.none(), st.integers(1, 9))),
        # bytes of small samples make the default window longer than a worker holds
        # (NOTE [ Global window ]); of big ones, the local order's
        dataset_bytes=draw(st.one_of(st.none(), st.sampled_from([0, 1, 100, 10**9]))),
    )


def plan_of(sizes, config, world, workers, *, epoch=0, state=None):
    batch = config.global_batch_size // world
    topology = dict(world_size=world, num_workers=workers, batch_size=batch)
    if state is None:
        return EpochPlan(sizes, config, epoch=epoch, **topology)
    return EpochPlan.resume(sizes, config, state, **topology)


def global_batches(plan) -> list[list[tuple[int, int]]]:
    """Global batch k: rank r's k-th DataLoader batch, for r in order (rank_samples is
    each worker's batches taken round-robin, as torch's DataLoader takes them)."""
    size = plan.batch_size
    ranks = [list(plan.rank_samples(r)) for r in range(plan.world_size)]
    assert {len(r) for r in ranks} == {plan.batches_per_rank() * size}
    return [
        [s for rank in ranks for s in rank[k * size : (k + 1) * size]] for k in range(plan.batches_per_rank())
    ]


@PROPERTY
@given(shard_sizes, global_configs(), st.data())
def test_same_global_batches_on_any_topology_every_sample_once(sizes, config, data):
    assume(not 0 < sum(sizes) < config.global_batch_size)  # a batch larger than the epoch is refused
    size = config.global_batch_size
    first = (data.draw(st.sampled_from(divisors(size))), data.draw(st.integers(0, 5)))
    second = (data.draw(st.sampled_from(divisors(size))), data.draw(st.integers(0, 5)))
    one = global_batches(plan_of(sizes, config, *first))
    two = global_batches(plan_of(sizes, config, *second))
    assert one == two
    assert all(len(batch) == size for batch in one)
    total = sum(sizes)
    counts = collections.Counter(s for batch in one for s in batch)
    expected = {(shard, i) for shard, n in enumerate(sizes) for i in range(n)}
    if config.drop_last:
        assert len(one) == total // size
        assert set(counts) <= expected
        assert max(counts.values(), default=1) == 1
    else:
        assert len(one) == -(-total // size)
        assert set(counts) == expected  # every sample, the rest of the last batch repeats
        assert sum(counts.values()) - total < size or total == 0


@PROPERTY
@given(shard_sizes, global_configs(), st.data())
def test_padding_is_only_in_the_last_global_batch(sizes, config, data):
    assume(not 0 < sum(sizes) < config.global_batch_size)  # a batch larger than the epoch is refused
    size = config.global_batch_size
    world, workers = data.draw(st.sampled_from(divisors(size))), data.draw(st.integers(0, 5))
    plan = plan_of(sizes, config, world, workers)
    flat = [s for batch in global_batches(plan) for s in batch]
    for rank in range(world):  # a window names every shard it reads (the repeats' too)
        for worker in range(max(1, workers)):
            for window in plan.worker_windows(rank, worker):
                assert {run.shard for run in window.runs} <= set(window.shards)
    total = sum(sizes)
    every = {(shard, i) for shard, n in enumerate(sizes) for i in range(n)}
    real = min(len(flat), total)  # without drop_last every sample; with it, every full batch
    assert len(set(flat[:real])) == real  # all but the last batch's padding: distinct samples
    assert set(flat[:real]) <= every
    if not config.drop_last:
        assert set(flat[:real]) == every  # every sample comes before the padding
        assert len(flat) - real < size or total == 0  # the padding fits in the last batch
        assert flat[real:] == [flat[k % total] for k in range(len(flat) - real)]  # the first ones again


@PROPERTY
@given(shard_sizes, global_configs(), st.data())
def test_resume_on_another_topology_gives_the_same_rest(sizes, config, data):
    assume(not 0 < sum(sizes) < config.global_batch_size)  # a batch larger than the epoch is refused
    size = config.global_batch_size
    before = plan_of(sizes, config, data.draw(st.sampled_from(divisors(size))), data.draw(st.integers(0, 4)))
    whole = global_batches(before)
    steps = data.draw(st.integers(0, len(whole)))
    state = before.state_dict(steps)
    after = plan_of(
        sizes, config, data.draw(st.sampled_from(divisors(size))), data.draw(st.integers(0, 4)), state=state
    )
    assert isinstance(after, GlobalPlan)
    assert global_batches(after) == whole[steps:]
    middle = data.draw(st.integers(0, len(whole) - steps))
    again = plan_of(sizes, config, 1, 3, state=after.state_dict(middle))
    assert global_batches(again) == whole[steps + middle :]


def test_another_epoch_another_order_and_the_state_is_small():
    sizes = [50] * 40
    config = PlanConfig(seed=1, order="global", global_batch_size=32, read_lanes=8)
    zero, one = (
        global_batches(plan_of(sizes, config, 4, 2)),
        global_batches(plan_of(sizes, config, 4, 2, epoch=1)),
    )
    assert zero != one
    assert {s for b in zero for s in b} == {s for b in one for s in b}
    state = plan_of(sizes, config, 4, 2).state_dict(5)
    assert state["global_batches"] == 5
    assert "passes" not in state
    assert plan_of(sizes, config, 8, 1, state=state).batches_per_rank() == len(zero) - 5


def test_runs_are_whole_lane_chunks():
    # 4 lanes of a batch of 64: every read of a rank is a run of 16 (or 8 for the halves of
    # a lane cut between two ranks), unless it crosses a shard boundary.
    sizes = [1000] * 16
    config = PlanConfig(seed=2, order="global", global_batch_size=64, read_lanes=4, shuffle_window=640)
    plan = plan_of(sizes, config, 8, 2)
    lengths = [len(run) for window in plan.worker_windows(3, 1) for run in window.runs]
    assert collections.Counter(lengths).most_common(1)[0][0] == 8
    plan = plan_of(sizes, config, 2, 3)
    lengths = [len(run) for window in plan.worker_windows(1, 2) for run in window.runs]
    assert collections.Counter(lengths).most_common(1)[0][0] == 16


def test_unshuffled_global_order_is_manifest_order():
    sizes = [5, 0, 7, 3]
    config = PlanConfig(shuffle=False, order="global", global_batch_size=5)
    flat = [s for b in global_batches(plan_of(sizes, config, 5, 2)) for s in b]
    assert flat == [(shard, i) for shard, n in enumerate(sizes) for i in range(n)]


def test_refusals_say_why():
    sizes = [10] * 4
    config = PlanConfig(order="global", global_batch_size=12)
    with pytest.raises(PlanError, match="world size that divides it"):
        EpochPlan(sizes, config, epoch=0, world_size=5, batch_size=2)
    with pytest.raises(PlanError, match="batches of 6 samples per rank"):
        EpochPlan(sizes, config, epoch=0, world_size=2, batch_size=4)
    state = EpochPlan(sizes, config, epoch=0, world_size=2, batch_size=6).state_dict(1)
    with pytest.raises(StateError, match="not on 5 ranks"):
        EpochPlan.resume(sizes, config, state, world_size=5, batch_size=2)
    with pytest.raises(StateError, match="global_batch_size"):
        EpochPlan.resume(
            sizes, PlanConfig(order="global", global_batch_size=6), state, world_size=1, batch_size=6
        )
    with pytest.raises(StateError, match="order='global'"):
        EpochPlan.resume(sizes, PlanConfig(), state, world_size=1)
    local = EpochPlan(sizes, PlanConfig(), epoch=0, world_size=1).state_dict(1)
    with pytest.raises(StateError, match="order='local'"):
        EpochPlan.resume(sizes, config, local, world_size=1, batch_size=12)
    with pytest.raises(PlanError, match="needs a global_batch_size"):
        PlanConfig(order="global")
    with pytest.raises(PlanError, match="option of order='global'"):
        PlanConfig(global_batch_size=8)
    with pytest.raises(PlanError, match="order must be one of"):
        PlanConfig(order="random")


def test_default_lanes_follow_the_global_batch_size():
    # NOTE [ Default lanes ]: runs of at most 2 samples, at least 64 lanes where G allows
    def lanes(size, **options):
        return plan_of([100] * 50, PlanConfig(order="global", global_batch_size=size, **options), 1, 1)

    assert lanes(512).sequence.lanes == 256
    assert lanes(200).sequence.lanes == 100
    assert lanes(128).sequence.lanes == 64
    assert lanes(32).sequence.lanes == 32
    assert lanes(512, read_lanes=64).sequence.lanes == 64
    assert lanes(512, shuffle=False).sequence.lanes == 1
    saved = lanes(512, read_lanes=64).state_dict(1)
    with pytest.raises(StateError, match="read_lanes=64, this plan has read_lanes=256"):
        plan_of([100] * 50, PlanConfig(order="global", global_batch_size=512), 1, 1, state=saved)
