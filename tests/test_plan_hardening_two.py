"""The plan under hostile and unlucky input (issue 39's plan items): seeds outside 64
bits, a global batch larger than the epoch, and states too large to be real are refused
at once with errors that say why."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardstream
from shardstream.errors import PlanError, StateError, UsageError
from shardstream.plan import EpochPlan, PlanConfig
from shardstream.plan.kinds import MixturePlan
from shardstream.plan.mixture import Mixture, StreamSpec
from shardstream.plan.state import MAX_PASSES
from tests.resume_harness import write_dataset


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=2**64)))
def test_seeds_outside_64_bits_are_refused(seed):
    with pytest.raises(PlanError, match="seed"):
        PlanConfig(seed=seed)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**64 - 1))
def test_every_64_bit_seed_plans(seed):
    assert len(list(EpochPlan([3, 2], PlanConfig(seed=seed), epoch=0, world_size=1).rank_samples(0))) == 5


def test_a_dataset_refuses_a_seed_outside_64_bits(tmp_path):
    url = str(tmp_path / "ds")
    write_dataset(url, [3])
    with pytest.raises(UsageError, match="seed is too large"):
        shardstream.StreamingDataset(url, seed=2**64)
    with pytest.raises(UsageError, match="seed must be at least 0"):
        shardstream.StreamingDataset(url, seed=-1)


@pytest.mark.parametrize("size", [101, 10**9, 10**15])
def test_a_global_batch_larger_than_the_epoch_is_refused_at_once(size):
    config = PlanConfig(order="global", global_batch_size=size)
    with pytest.raises(PlanError, match=f"global_batch_size={size} is more than the 100 samples"):
        EpochPlan([60, 40], config, epoch=0, world_size=1, batch_size=size)
    mixture = Mixture([StreamSpec("a", [60], "f"), StreamSpec("b", [40], "g")], mix="stratified")
    with pytest.raises(PlanError, match="is more than the 100 samples"):
        MixturePlan(mixture, config, epoch=0, world_size=1, batch_size=size)


def test_a_state_of_too_many_passes_is_refused_before_it_is_read():
    plan = EpochPlan([5, 5], PlanConfig(), epoch=0, world_size=2, batch_size=1)
    state = plan.state_dict(1)
    state["passes"] = state["passes"] * (MAX_PASSES + 1)
    with pytest.raises(StateError, match=f"{MAX_PASSES + 1} passes"):
        EpochPlan.resume([5, 5], PlanConfig(), state, world_size=1)
    state["passes"] = state["passes"][:2]  # a few passes of the same topology still load
    assert EpochPlan.resume([5, 5], PlanConfig(), state, world_size=1).samples_per_rank() >= 0


@pytest.mark.parametrize(
    ("sizing", "match"),
    [
        ({"repeat": 10**400}, "would give a number of about 403 digits samples an epoch"),
        ({"repeat": 1e308}, "samples an epoch, more than"),
        ({"choose": 10**30}, "would give 1000000000000000000000000000000 samples"),
        ({"repeat": float("inf")}, "finite positive number"),
    ],
)
def test_numbers_that_overflow_a_mixture_are_refused_naming_the_stream(sizing, match):
    with pytest.raises(PlanError, match=match):
        Mixture([StreamSpec("big", [100], "f", **sizing), StreamSpec("small", [60], "g")])


def test_a_weight_or_epoch_size_beyond_64_bits_is_refused_not_overflowed(tmp_path):
    with pytest.raises(PlanError, match="gets no samples"):
        Mixture([StreamSpec("a", [100], "f", weight=10**400), StreamSpec("b", [60], "g", weight=1)])
    with pytest.raises(PlanError, match="more than 9223372036854775807"):
        Mixture([StreamSpec("a", [100], "f", weight=1)], epoch_size=10**400)
    url = str(tmp_path / "ds")
    write_dataset(url, [3])
    with pytest.raises(UsageError, match="finite positive number"):
        shardstream.Stream(url, weight=float("nan"))
