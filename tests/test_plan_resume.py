"""Exact, elastic resume of the epoch plan: resume equals continue, and a new topology
re-cuts what is left so the epoch still sees every sample once."""

from __future__ import annotations

import collections
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import PlanError, StateError
from shardstream.manifest import counts_checksum
from shardstream.plan import PLAN_STATE_VERSION, EpochPlan, PlanConfig
from tests.test_plan_properties import plans, reference_batches, topologies, worker_lists

PROPERTY = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def take(plan: EpochPlan, steps: int) -> list[list[tuple[int, int]]]:
    """What every rank consumed in its first ``steps`` batches of ``plan``."""
    return [
        [s for _, batch in reference_batches(plan, r)[:steps] for s in batch] for r in range(plan.world_size)
    ]


def roundtrip(state: dict) -> dict:
    text = json.dumps(state)
    assert len(text) < 2048
    return json.loads(text)


@PROPERTY
@given(plans(), st.floats(0, 1))
def test_resume_with_the_same_topology_continues_exactly(case, fraction):
    sizes, config, epoch, topology = case
    plan = EpochPlan(sizes, config, epoch=epoch, **topology)
    steps = round(fraction * plan.batches_per_rank())
    state = roundtrip(plan.state_dict(steps))
    resumed = EpochPlan.resume(sizes, config, state, **topology)
    assert resumed.epoch == epoch
    for rank in range(plan.world_size):
        batches = reference_batches(plan, rank)
        done = collections.Counter(worker for worker, _ in batches[:steps])
        rest = [s for _, batch in batches[steps:] for s in batch]
        assert list(resumed.rank_samples(rank)) == rest
        assert resumed.first_worker() == (batches[steps][0] if steps < len(batches) else 0)
        for worker in range(plan.num_workers):
            skipped = done[worker] * plan.batch_size
            assert (
                list(resumed.worker_samples(rank, worker))
                == list(plan.worker_samples(rank, worker))[skipped:]
            )
    assert resumed.samples_per_rank() == len(rest)
    assert resumed.batches_per_rank() == plan.batches_per_rank() - steps
    # Its own state counts from where it started, and says the same as one made uninterrupted.
    more = round(fraction * resumed.batches_per_rank())
    assert resumed.state_dict(more) == plan.state_dict(steps + more)


@PROPERTY
@given(plans(), topologies, topologies, st.floats(0, 1), st.floats(0, 1))
def test_resume_under_new_topologies_sees_every_sample_once(case, second, third, first_part, second_part):
    sizes, config, epoch, topology = case
    fresh = EpochPlan(sizes, config, epoch=epoch, **topology)
    steps = round(first_part * fresh.batches_per_rank())
    seen = [s for samples in take(fresh, steps) for s in samples]
    plan = EpochPlan.resume(sizes, config, roundtrip(fresh.state_dict(steps)), **second)
    steps = round(second_part * plan.batches_per_rank())
    per_rank = take(plan, steps)
    assert len({len(samples) for samples in per_rank}) <= 1  # lockstep, whatever the topology
    seen += [s for samples in per_rank for s in samples]
    plan = EpochPlan.resume(sizes, config, roundtrip(plan.state_dict(steps)), **third)
    lists = worker_lists(plan)
    counts = [sum(len(lists[r, w]) for w in range(plan.num_workers)) for r in range(plan.world_size)]
    assert set(counts) <= {plan.samples_per_rank()}
    seen += [s for samples in lists.values() for s in samples]

    # The first pass sets the epoch's samples (a resume before any step replaces it).
    passes = plan.state_dict(0)["passes"]
    first = {k: passes[0][k] for k in ("world_size", "num_workers", "batch_size")}
    epoch_samples = collections.Counter(
        s
        for samples in worker_lists(EpochPlan(sizes, config, epoch=epoch, **first)).values()
        for s in samples
    )
    padding = sum(epoch_samples.values()) - len(epoch_samples)
    later = [p["world_size"] - 1 for p in passes[1:]]
    got = collections.Counter(seen)
    assert set(got) == set(epoch_samples)
    # Repeats only as padding: at most world_size - 1 per pass.
    assert sum(got.values()) - len(got) <= padding + sum(later)
    end = EpochPlan.resume(sizes, config, roundtrip(plan.state_dict(plan.batches_per_rank())), **second)
    assert end.samples_per_rank() == 0
    assert list(end.rank_samples(0)) == []


@settings(max_examples=60, deadline=None)
@given(plans(), topologies)
def test_resume_at_the_start_under_a_new_topology_is_a_fresh_plan(case, other):
    sizes, config, epoch, topology = case
    plan = EpochPlan(sizes, config, epoch=epoch, **topology)
    resumed = EpochPlan.resume(sizes, config, plan.state_dict(0), **other)
    if not plan.batches_per_rank():  # an empty plan is at its end as much as at its start
        assert resumed.samples_per_rank() == 0
        return
    assert worker_lists(resumed) == worker_lists(EpochPlan(sizes, config, epoch=epoch, **other))
    assert resumed.state_dict(0) == EpochPlan(sizes, config, epoch=epoch, **other).state_dict(0)


def test_state_of_a_huge_epoch_is_small_and_resumes_fast():
    """10^9 samples, 4096 ranks x 8 workers, resumed on 1000 x 3 then on 7 x 2."""
    sizes = [1_000_000] * 1000
    config = PlanConfig(seed=3, shuffle_window=100_000)
    topology = {"world_size": 4096, "num_workers": 8, "batch_size": 32}
    plan = EpochPlan(sizes, config, epoch=5, **topology)
    state = roundtrip(plan.state_dict(plan.batches_per_rank() // 3))
    consumed = 4096 * (
        plan.samples_per_rank() - EpochPlan.resume(sizes, config, state, **topology).samples_per_rank()
    )
    plan = EpochPlan.resume(sizes, config, state, world_size=1000, num_workers=3, batch_size=64)
    assert plan.first_worker() == 0
    # What is left: all but the consumed samples, give or take the consumed padding (1536
    # repeats in all), then padded up to a multiple of 1000 ranks.
    assert 0 <= plan.samples_per_rank() * 1000 - (10**9 - consumed) < 1536 + 1000
    state = roundtrip(plan.state_dict(5))
    plan = EpochPlan.resume(sizes, config, state, world_size=7, num_workers=2, batch_size=64)
    window = next(plan.worker_windows(6, 1))
    assert 0 < len(window) <= plan.shuffle_window
    assert all(run.stop - run.start >= 1 for run in window.runs)
    assert len(json.dumps(plan.state_dict(1))) < 1024


@pytest.mark.parametrize(
    "chain",
    [
        [(3, 2, 7, 0.37), (2, 3, 5, 0.5), (5, 1, 4, 1.0)],
        [(4, 3, 8, 0.9), (4, 3, 8, 0.2), (1, 1, 3, 0.6), (6, 4, 2, 1.0)],
        [(1, 1, 16, 0.5), (7, 2, 3, 0.01), (2, 2, 9, 1.0)],
    ],
)
def test_a_chain_of_resumes_over_striped_windows_sees_every_sample_once(chain):
    """Bigger than the property tests: slices many windows long, striped over lanes."""
    sizes = [37 + (i * 13) % 29 for i in range(60)]  # 3,000-odd samples
    config = PlanConfig(seed=21, shuffle_window=120)
    world, workers, batch, _ = chain[0]
    plan = EpochPlan(sizes, config, epoch=4, world_size=world, num_workers=workers, batch_size=batch)
    assert any(len(w.runs) > 4 for w in plan.worker_windows(0, 0))  # striping is on
    seen, allowed = [], plan.samples_per_rank() * world - sum(sizes)
    for i, (_, _, _, part) in enumerate(chain):
        steps = round(part * plan.batches_per_rank())
        seen += [s for samples in take(plan, steps) for s in samples]
        if i + 1 < len(chain):
            world, workers, batch, _ = chain[i + 1]
            plan = EpochPlan.resume(
                sizes,
                config,
                roundtrip(plan.state_dict(steps)),
                world_size=world,
                num_workers=workers,
                batch_size=batch,
            )
            allowed += world - 1
    counts = collections.Counter(seen)
    assert set(counts) == {(s, i) for s, n in enumerate(sizes) for i in range(n)}
    assert sum(counts.values()) - len(counts) <= allowed


def _state(**changes):
    sizes = [5, 0, 7, 3]
    state = EpochPlan(
        sizes, PlanConfig(seed=1), epoch=2, world_size=2, num_workers=2, batch_size=2
    ).state_dict(1)
    state.update(changes)
    return sizes, state


@pytest.mark.parametrize(
    ("changes", "config", "sizes", "message"),
    [
        ({"version": PLAN_STATE_VERSION + 1}, PlanConfig(seed=1), None, "version"),
        ({}, PlanConfig(seed=2), None, "seed"),
        ({}, PlanConfig(seed=1, shuffle=False), None, "shuffle"),
        ({}, PlanConfig(seed=1, drop_last=True), None, "drop_last"),
        ({}, PlanConfig(seed=1, shuffle_window=3), None, "window"),
        ({}, PlanConfig(seed=1), [5, 0, 8, 3], "another dataset"),
        ({}, PlanConfig(seed=1), [5, 7, 0, 3], "another dataset"),
        ({"passes": []}, PlanConfig(seed=1), None, "passes"),
        (
            {"passes": [{"world_size": 2, "num_workers": 2, "batch_size": 2}]},
            PlanConfig(seed=1),
            None,
            "steps",
        ),
        (
            {"passes": [{"world_size": 2, "num_workers": 2, "batch_size": 2, "steps": 99}]},
            PlanConfig(seed=1),
            None,
            "99",
        ),
        ({"epoch": -1}, PlanConfig(seed=1), None, "epoch"),
        ({"counts_checksum": counts_checksum([1])}, PlanConfig(seed=1), None, "another dataset"),
        (
            {"passes": [{"world_size": 2**20, "num_workers": 8, "batch_size": 1, "steps": 0}]},
            PlanConfig(seed=1),
            None,
            "workers",
        ),
    ],
)
def test_a_state_that_does_not_fit_raises_state_error(changes, config, sizes, message):
    own_sizes, state = _state(**changes)
    with pytest.raises(StateError, match=message):
        EpochPlan.resume(sizes or own_sizes, config, state, world_size=2, num_workers=2, batch_size=2)


def test_a_state_that_is_not_a_mapping_raises_state_error():
    with pytest.raises(StateError, match="mapping"):
        EpochPlan.resume([1, 2], PlanConfig(), [1, 2], world_size=1)  # type: ignore[arg-type]


def test_state_fields_and_steps_bounds():
    plan = EpochPlan([4, 4, 4], PlanConfig(seed=9), epoch=1, world_size=2, num_workers=3, batch_size=2)
    state = plan.state_dict(2)
    assert set(state) == {
        "version",
        "epoch",
        "seed",
        "shuffle",
        "drop_last",
        "shuffle_window",
        "num_samples",
        "num_shards",
        "counts_checksum",
        "passes",
    }
    assert state["passes"] == [{"world_size": 2, "num_workers": 3, "batch_size": 2, "steps": 2}]
    assert state["counts_checksum"] == counts_checksum([4, 4, 4])
    with pytest.raises(PlanError):
        plan.state_dict(-1)
    resumed = EpochPlan.resume(
        [4, 4, 4], PlanConfig(seed=9), state, world_size=3, num_workers=1, batch_size=1
    )
    assert len(resumed.state_dict(0)["passes"]) == 2


@PROPERTY
@given(plans(shuffle=False), st.floats(0, 1))
def test_a_window_in_run_order_resumed_part_way_knows_its_runs_before_it_is_laid_out(case, fraction):
    # so a reader takes it in pieces of its budget, as any other (NOTE [ Unshuffled
    # windows in pieces ]), rather than the rest of a window of four shards at once
    sizes, config, epoch, topology = case
    plan = EpochPlan(sizes, config, epoch=epoch, **topology)
    steps = round(fraction * plan.batches_per_rank())
    resumed = EpochPlan.resume(sizes, config, roundtrip(plan.state_dict(steps)), **topology)
    for rank in range(plan.world_size):
        for worker in range(plan.num_workers):
            for window in resumed.worker_windows(rank, worker):
                known = window.known_runs
                assert window.in_run_order
                assert known is not None
                assert window.shards == tuple(dict.fromkeys(run.shard for run in known))
                assert known == window.runs  # what laying it out gives
