"""The default window of datasets with big shards is what earlier releases used (issue 10).

A resume state records its window and must match it exactly, and the window decides the
epoch's order: see NOTE [ Window size ] in shardstream/plan/config.py.
"""

from __future__ import annotations

import itertools
import tracemalloc

import pytest

from shardstream.errors import PlanError
from shardstream.plan import EpochPlan, PlanConfig
from shardstream.plan.config import MAX_WINDOW

SIZES = [2_000_000] * 4

# Saved by the release before the hardening (3eb3179): EpochPlan(SIZES, PlanConfig(seed=7),
# epoch=1, world_size=1).state_dict(100), whose default window was 4 x the mean shard.
OLD_STATE = {
    "version": 1,
    "epoch": 1,
    "seed": 7,
    "shuffle": True,
    "drop_last": False,
    "shuffle_window": 8000000,
    "num_samples": 8000000,
    "num_shards": 4,
    "counts_checksum": "873bc1da44fb6f1d",
    "passes": [{"world_size": 1, "num_workers": 1, "batch_size": 1, "steps": 100}],
}
# The first samples of that epoch, and the first after the 100 the state consumed, as
# that release yielded them.
OLD_FIRST = [(1, 1466301), (2, 1867135), (2, 358258), (3, 1129525), (0, 26551)]
OLD_AFTER_100 = [(3, 1883659), (3, 1388836), (2, 1282946), (3, 1443909), (2, 1658052)]


def test_an_old_state_of_a_big_shard_dataset_resumes_with_the_default_config():
    plan = EpochPlan.resume(SIZES, PlanConfig(seed=7), dict(OLD_STATE), world_size=1)
    assert plan.shuffle_window == 8_000_000
    assert list(itertools.islice(plan.worker_samples(0, 0), 5)) == OLD_AFTER_100


def test_a_big_shard_dataset_keeps_its_epoch_order():
    plan = EpochPlan(SIZES, PlanConfig(seed=7), epoch=1, world_size=1)
    assert plan.shuffle_window == 4 * 2_000_000
    assert list(itertools.islice(plan.worker_samples(0, 0), 5)) == OLD_FIRST
    assert plan.state_dict(100) == OLD_STATE


def test_a_default_window_is_not_capped_and_not_allocated_by_planning():
    tracemalloc.start()
    try:
        plan = EpochPlan([10, 10**15, 10], PlanConfig(), epoch=0, world_size=1)
        windows = plan.worker_windows(0, 0)
        next(windows).shards  # noqa: B018  # known before the window is laid out
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.shuffle_window == 4 * (-(-(10**15 + 20) // 3))
    assert peak < 64 << 20


@pytest.mark.parametrize("window", [2**26 + 1, 2**30, MAX_WINDOW])
def test_big_explicit_windows_are_accepted(window):
    assert PlanConfig(shuffle_window=window).shuffle_window == window


def test_only_absurd_explicit_windows_are_refused():
    with pytest.raises(PlanError, match="at most"):
        PlanConfig(shuffle_window=MAX_WINDOW + 1)
