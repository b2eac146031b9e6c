"""Property tests of the epoch plan: coverage, balance, determinism, variation, locality."""

from __future__ import annotations

import collections
import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardstream.errors import PlanError
from shardstream.plan import EpochPlan, PlanConfig

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Shard sizes with many empty and one-sample shards, and a few big ones.
shard_sizes = st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, 40)), min_size=0, max_size=24)
windows = st.one_of(st.none(), st.integers(1, 60))
# Half of the topologies small, so that worker slices span several windows and a resume
# often stops inside a window; the other half up to 64 ranks x 8 workers.
topologies = st.fixed_dictionaries(
    {
        "world_size": st.one_of(st.integers(1, 4), st.integers(1, 64)),
        "num_workers": st.one_of(st.integers(0, 3), st.integers(0, 8)),
        "batch_size": st.integers(1, 9),
    }
)


@st.composite
def plans(draw, *, shuffle=None, drop_last=None):
    sizes = draw(shard_sizes)
    config = PlanConfig(
        shuffle=draw(st.booleans()) if shuffle is None else shuffle,
        seed=draw(st.integers(0, 2**63)),  # and seed + seed_step
        drop_last=draw(st.booleans()) if drop_last is None else drop_last,
        shuffle_window=draw(windows),
    )
    topology = draw(topologies)
    return sizes, config, draw(st.integers(0, 5)), topology


def worker_lists(plan: EpochPlan) -> dict[tuple[int, int], list[tuple[int, int]]]:
    return {
        (r, w): list(plan.worker_samples(r, w))
        for r in range(plan.world_size)
        for w in range(plan.num_workers)
    }


def reference_batches(plan: EpochPlan, rank: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """(worker, batch) pairs as torch's DataLoader takes them, built from worker_samples."""
    size, count = plan.batch_size, plan.num_workers
    batches = {}
    for w in range(count):
        samples = list(plan.worker_samples(rank, w))
        batches[w] = [samples[i : i + size] for i in range(0, len(samples), size)]
    out = []
    for turn in range(max(map(len, batches.values()))):
        for i in range(count):
            w = (plan.first_worker() + i) % count
            if turn < len(batches[w]):
                out.append((w, batches[w][turn]))
    return out


def manifest_order(sizes: list[int]) -> list[tuple[int, int]]:
    return [(s, i) for s, n in enumerate(sizes) for i in range(n)]


@PROPERTY
@given(plans())
def test_every_sample_once_plus_padding_and_equal_ranks(case):
    sizes, config, epoch, topology = case
    plan = EpochPlan(sizes, config, epoch=epoch, **topology)
    lists = worker_lists(plan)
    ranks, workers, total = plan.world_size, plan.num_workers, sum(sizes)
    per_rank = total // ranks if config.drop_last else -(-total // ranks)
    counts = collections.Counter(itertools.chain.from_iterable(lists.values()))
    everything = set(manifest_order(sizes))
    assert set(counts) <= everything
    if config.drop_last:
        assert max(counts.values(), default=1) == 1
        assert len(counts) == per_rank * ranks
    else:
        assert set(counts) == everything
        assert sum(counts.values()) - total == per_rank * ranks - total <= ranks - 1
    for r in range(ranks):
        lengths = [len(lists[r, w]) for w in range(workers)]
        assert sum(lengths) == per_rank == plan.samples_per_rank()
        assert max(lengths) - min(lengths) <= 1
        assert lengths == [plan.worker_num_samples(r, w) for w in range(workers)]
        batches = reference_batches(plan, r)
        assert len(batches) == plan.batches_per_rank()
        assert list(plan.rank_samples(r)) == [s for _, batch in batches for s in batch]


@PROPERTY
@given(plans())
def test_windows_are_what_the_workers_yield(case):
    sizes, config, epoch, topology = case
    plan = EpochPlan(sizes, config, epoch=epoch, **topology)
    for r, w in itertools.product(range(min(plan.world_size, 3)), range(plan.num_workers)):
        yielded = []
        for window in plan.worker_windows(r, w):
            assert 0 < len(window) <= plan.shuffle_window
            assert all(0 <= run.start < run.stop <= sizes[run.shard] for run in window.runs)
            assert sorted(window.order.tolist()) == list(range(sum(len(run) for run in window.runs)))
            read = [(run.shard, i) for run in window.runs for i in range(run.start, run.stop)]
            yielded += [read[i] for i in window.order.tolist()]
        assert yielded == list(plan.worker_samples(r, w))


@PROPERTY
@given(plans())
def test_same_inputs_same_plan(case):
    sizes, config, epoch, topology = case
    first = worker_lists(EpochPlan(sizes, config, epoch=epoch, **topology))
    assert worker_lists(EpochPlan(list(sizes), config, epoch=epoch, **topology)) == first


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plans(shuffle=True),
    st.lists(st.integers(1, 40), min_size=10, max_size=20),
    st.integers(0, 50),
    st.integers(1, 1000),
)
def test_other_epoch_or_seed_other_order(case, nonempty, other_epoch, seed_step):
    """With 10 shards or more, two epochs (or seeds) give the same order with chance
    below 1 / 10!, so a failure here is a bug, not bad luck."""
    sizes, config, epoch, topology = case
    sizes = sizes + nonempty
    assume(other_epoch != epoch)
    first = worker_lists(EpochPlan(sizes, config, epoch=epoch, **topology))
    assert worker_lists(EpochPlan(sizes, config, epoch=other_epoch, **topology)) != first
    other_seed = PlanConfig(
        seed=config.seed + seed_step, drop_last=config.drop_last, shuffle_window=config.shuffle_window
    )
    assert worker_lists(EpochPlan(sizes, other_seed, epoch=epoch, **topology)) != first


@PROPERTY
@given(plans(shuffle=False))
def test_no_shuffle_is_manifest_order(case):
    sizes, config, epoch, topology = case
    plan = EpochPlan(sizes, config, epoch=epoch, **topology)
    lists = worker_lists(plan)
    laid_out = [s for r in range(plan.world_size) for w in range(plan.num_workers) for s in lists[r, w]]
    order = manifest_order(sizes)
    assert laid_out == (order * (plan.world_size + 1))[: len(laid_out)]


@PROPERTY
@given(plans(drop_last=True))
def test_locality_contiguous_runs_and_few_workers_per_shard(case):
    sizes, config, epoch, topology = case
    plan = EpochPlan(sizes, config, epoch=epoch, **topology)
    readers = collections.defaultdict(set)
    for (r, w), samples in worker_lists(plan).items():
        per_shard = collections.defaultdict(list)
        for shard, index in samples:
            per_shard[shard].append(index)
            readers[shard].add((r, w))
        for indices in per_shard.values():  # each worker reads one stretch of each shard
            assert sorted(indices) == list(range(min(indices), max(indices) + 1))
    shortest = min(
        plan.worker_num_samples(r, w) for r in range(plan.world_size) for w in range(plan.num_workers)
    )
    if shortest >= max(sizes, default=0):
        assert all(len(workers) <= 2 for workers in readers.values())


@pytest.mark.parametrize("window_shards", [1, 2, 4])
def test_a_window_mixes_shards_from_across_the_slice(window_shards):
    """A shuffled window is striped over lanes: a window of k shards' worth holds
    quarter-shard runs of 4k shards (NOTE [ Striped windows ])."""
    plan = EpochPlan([40] * 40, PlanConfig(seed=1, shuffle_window=40 * window_shards), epoch=0, world_size=1)
    windows = list(plan.worker_windows(0, 0))
    assert len(windows) == 40 // window_shards
    for window in windows:
        assert len(window) == 40 * window_shards
        assert len({run.shard for run in window.runs}) == len(window.runs) == 4 * window_shards
        assert {len(run) for run in window.runs} == {10}
    unshuffled = EpochPlan([40] * 40, PlanConfig(shuffle=False, shuffle_window=80), epoch=0, world_size=1)
    assert [len(w.runs) for w in unshuffled.worker_windows(0, 0)] == [2] * 20


def test_empty_dataset_and_fewer_samples_than_workers():
    plan = EpochPlan([0, 0], PlanConfig(), epoch=0, world_size=4, num_workers=2, batch_size=3)
    assert plan.samples_per_rank() == 0
    assert plan.batches_per_rank() == 0
    assert list(plan.rank_samples(3)) == []
    plan = EpochPlan([1, 0, 1], PlanConfig(), epoch=0, world_size=8, num_workers=8, batch_size=4)
    assert plan.samples_per_rank() == 1
    assert {len(list(plan.rank_samples(r))) for r in range(8)} == {1}
    dropped = EpochPlan([1, 0, 1], PlanConfig(drop_last=True), epoch=0, world_size=8, num_workers=2)
    assert dropped.samples_per_rank() == 0


def test_known_plan_is_stable_across_versions():
    """Golden values: a change here changes every user's data order."""
    config = PlanConfig(seed=7, shuffle_window=6)
    plan = EpochPlan([3, 0, 5, 2, 4, 6, 1, 8], config, epoch=2, world_size=2, num_workers=1)
    got = {r: list(plan.worker_samples(r, 0)) for r in range(2)}
    assert got == GOLDEN


GOLDEN = {
    0: [
        (6, 0),
        (5, 5),
        (2, 3),
        (5, 0),
        (5, 4),
        (2, 4),
        (2, 1),
        (2, 0),
        (4, 1),
        (5, 1),
        (5, 2),
        (4, 0),
        (5, 3),
        (4, 2),
        (2, 2),
    ],
    1: [
        (7, 0),
        (7, 4),
        (7, 5),
        (0, 2),
        (4, 3),
        (3, 0),
        (7, 7),
        (7, 6),
        (3, 1),
        (7, 1),
        (7, 2),
        (0, 0),
        (0, 1),
        (7, 3),
        (6, 0),
    ],
}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": 2, "num_workers": -1}, "num_workers"),
        ({"world_size": 2, "batch_size": 0}, "batch_size"),
        ({"world_size": 2, "epoch": -1}, "epoch"),
        ({"world_size": True}, "world_size"),
    ],
)
def test_bad_parameters_raise_plan_error(kwargs, message):
    kwargs = {"epoch": 0, **kwargs}
    with pytest.raises(PlanError, match=message):
        EpochPlan([3, 4], PlanConfig(), **kwargs)


def test_bad_config_and_sizes_raise_plan_error():
    with pytest.raises(PlanError, match="shuffle_window"):
        PlanConfig(shuffle_window=0)
    with pytest.raises(PlanError, match="seed"):
        PlanConfig(seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="negative"):
        EpochPlan([3, -1], PlanConfig(), epoch=0, world_size=1)
    with pytest.raises(PlanError, match="integer"):
        EpochPlan([3.5], PlanConfig(), epoch=0, world_size=1)
    plan = EpochPlan([3, 4], PlanConfig(), epoch=0, world_size=2, num_workers=2)
    with pytest.raises(PlanError, match="rank 2"):
        plan.worker_samples(2, 0)
    with pytest.raises(PlanError, match="worker 2"):
        plan.worker_windows(0, 2)
    with pytest.raises(PlanError, match="steps"):
        plan.state_dict(plan.batches_per_rank() + 1)


def test_default_window_is_four_mean_shards_and_windows_bound_memory():
    sizes = [100, 0, 50, 150]
    plan = EpochPlan(sizes, PlanConfig(), epoch=0, world_size=1)
    assert plan.shuffle_window == 4 * 100
    plan = EpochPlan(sizes, PlanConfig(shuffle_window=7), epoch=0, world_size=1)
    assert max(len(w) for w in plan.worker_windows(0, 0)) <= 7
    assert EpochPlan([0], PlanConfig(), epoch=0, world_size=1).shuffle_window == 1
