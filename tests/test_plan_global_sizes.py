"""Global batch sizes up to 10**15 (NOTE [ Most lanes ]): a global plan is made in memory
that does not grow with the batch, or refused with a PlanError that names the batch."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import PlanError
from shardstream.plan import EpochPlan, PlanConfig
from shardstream.plan.config import MAX_LANES
from shardstream.plan.global_order import lanes_of

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PLAN_MEMORY = 64 << 20  # far below what one word per sample of the batch would take


@st.composite
def huge_plans(draw):
    sizes = draw(st.lists(st.integers(0, 10**13), min_size=1, max_size=50))
    size = draw(st.one_of(st.integers(1, 10**4), st.integers(1, 10**15)))
    world = draw(st.sampled_from([d for d in (1, 2, 3, 4, 8, 64, 1024) if size % d == 0]))
    config = PlanConfig(
        order="global",
        global_batch_size=size,
        seed=draw(st.integers(0, 2**64 - 1)),
        drop_last=draw(st.booleans()),
        shuffle=draw(st.booleans()),
    )
    return sizes, config, world


@PROPERTY
@given(huge_plans(), st.integers(0, 2**20))
def test_a_global_plan_of_any_batch_size_is_made_in_bounded_memory_or_refused(case, steps):
    sizes, config, world = case
    size, total = config.global_batch_size, sum(sizes)
    if 0 < total < size:
        with pytest.raises(PlanError, match=f"global_batch_size={size} is more than"):
            EpochPlan(sizes, config, epoch=1, world_size=world, batch_size=size // world)
        return
    tracemalloc.start()
    try:
        plan = EpochPlan(sizes, config, epoch=1, world_size=world, batch_size=size // world)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PLAN_MEMORY
    batches = total // size if config.drop_last else -(-total // size)
    assert plan.batches_per_rank() == batches
    taken = min(steps, batches)
    state = plan.state_dict(taken)
    again = EpochPlan.resume(sizes, config, state, world_size=world, batch_size=size // world)
    assert again.batches_per_rank() == batches - taken  # what is left of the epoch


@pytest.mark.parametrize("size", [2 * MAX_LANES, 10**9, 10**15])
def test_lanes_stop_at_the_most_whatever_the_batch(size):
    assert lanes_of(PlanConfig(order="global", global_batch_size=size)) == MAX_LANES
    assert lanes_of(PlanConfig(order="global", global_batch_size=size, read_lanes=7)) == 7


def test_a_batch_below_the_most_keeps_its_default_lanes():
    # runs of two samples (NOTE [ Default lanes ]): the order of every batch up to 2 * MAX_LANES is kept
    assert lanes_of(PlanConfig(order="global", global_batch_size=1000)) == 500
    assert lanes_of(PlanConfig(order="global", global_batch_size=2 * MAX_LANES - 1)) == MAX_LANES


def test_read_lanes_above_the_most_is_refused():
    with pytest.raises(PlanError, match=f"read_lanes must be at most {MAX_LANES}"):
        PlanConfig(order="global", global_batch_size=10**9, read_lanes=MAX_LANES + 1)


def test_a_billion_sample_batch_reads_its_first_sample_over_realistic_shards():
    sizes = [10**4] * 10**5  # a billion samples
    config = PlanConfig(order="global", global_batch_size=10**7, seed=5)
    plan = EpochPlan(sizes, config, epoch=0, world_size=8, batch_size=10**7 // 8)
    shard, index = next(iter(plan.rank_samples(0)))
    assert 0 <= shard < len(sizes)
    assert 0 <= index < 10**4
