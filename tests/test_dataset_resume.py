"""Exact and elastic resume, through one harness, for the plan, the dataset and the loader.

Real tar shards on local disk; the loader runs real worker processes (fork, the Linux
default; tests/test_loader.py covers spawn and forkserver).
"""

from __future__ import annotations

import functools

import pytest

from shardstream.errors import StateError
from shardstream.plan import PlanConfig
from tests.resume_harness import (
    DatasetSubject,
    LoaderSubject,
    PlanSubject,
    Topo,
    check_resume_elastic,
    check_resume_same_topology,
    write_dataset,
)

# 12 shards of uneven sizes, 120 samples: no padding for 1, 2, 3 or 4 ranks.
SIZES = [7, 13, 10, 4, 16, 9, 11, 8, 12, 6, 14, 10]
WINDOW = 20
BATCH = 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("resume") / "ds")
    return url, write_dataset(url, SIZES)


def plan_opener(batch_size=BATCH):
    config = PlanConfig(seed=5, shuffle_window=WINDOW)
    return functools.partial(PlanSubject, SIZES, config, batch_size=batch_size)


def expected_ids():
    return [(s, i) for s, n in enumerate(SIZES) for i in range(n)]


# -- plan -------------------------------------------------------------------------------------


@pytest.mark.parametrize("topo", [Topo(1, 1), Topo(2, 3), Topo(3, 2)])
def test_plan_resume_same_topology(topo):
    check_resume_same_topology(plan_opener(), topo, steps=[0, 1, 3, 7, 1000])


@pytest.mark.parametrize(
    ("before", "after", "steps"),
    [(Topo(2, 2), Topo(1, 3), 5), (Topo(1, 1), Topo(4, 2), 11), (Topo(3, 2), Topo(2, 1), 1)],
)
def test_plan_resume_elastic(before, after, steps):
    check_resume_elastic(plan_opener(), before, after, steps=steps, expected=expected_ids())


def test_plan_resume_twice_under_three_topologies():
    opener = plan_opener()
    state = check_resume_elastic(opener, Topo(2, 2), Topo(3, 1), steps=3, expected=expected_ids())
    seen = []
    for rank in range(2):  # the same 3 steps again, then 2 more ranks x 1 worker take 4 steps each
        seen += [s for b in list(opener(rank, 2, 2, 0, None).batches())[:3] for s in b]
    states = []
    for rank in range(3):
        subject = opener(rank, 3, 1, 0, state)
        seen += [s for b in list(subject.batches())[:4] for s in b]
        subject.steps = 4
        states.append(subject.state_dict())
    assert all(s == states[0] for s in states)
    for rank in range(1):
        seen += [s for b in opener(rank, 1, 4, 0, states[0]).batches() for s in b]
    from tests.resume_harness import assert_exactly_once

    assert_exactly_once(seen, expected_ids())


# -- dataset iterated directly ----------------------------------------------------------------


def dataset_opener(dataset, **kwargs):
    url, _ = dataset
    return functools.partial(
        DatasetSubject, url, None, batch_size=BATCH, shuffle_window=WINDOW, seed=5, **kwargs
    )


@pytest.mark.parametrize("world", [1, 2])
def test_dataset_resume_same_topology(dataset, world):
    check_resume_same_topology(dataset_opener(dataset), Topo(world, 1), steps=[0, 5, 1000], ranks=[world - 1])


def test_dataset_resume_elastic(dataset):
    _, keys = dataset
    check_resume_elastic(dataset_opener(dataset), Topo(2, 1), Topo(4, 1), steps=4, expected=keys)


def test_dataset_state_matches_the_plan_state(dataset):
    url, _ = dataset
    subject = dataset_opener(dataset)(0, 1, 1, 2, None)
    batches = subject.batches()
    for _ in range(3):
        next(batches)
    plan = PlanSubject(SIZES, PlanConfig(seed=5, shuffle_window=WINDOW), 0, 1, 1, 2, None, batch_size=BATCH)
    state = subject.state_dict()
    subject.close()
    assert state["plan"] == plan.plan.state_dict(3)
    assert state["epoch"] == 2
    assert state["url"] == url


def test_dataset_state_between_batches_is_refused(dataset):
    subject = dataset_opener(dataset)(0, 1, 1, 0, None)
    iterator = iter(subject.dataset)
    next(iterator)
    with pytest.raises(StateError, match="whole number of batches"):
        subject.dataset.state_dict()
    iterator.close()


def test_loaded_state_of_another_dataset_or_seed_is_refused(dataset, tmp_path):
    url, _ = dataset
    state = dataset_opener(dataset)(0, 1, 1, 0, None).state_dict()
    with pytest.raises(StateError, match="seed"):
        DatasetSubject(url, None, 0, 1, 1, 0, state, batch_size=BATCH, shuffle_window=WINDOW, seed=6)
    other = str(tmp_path / "other")
    write_dataset(other, [3, 3])
    with pytest.raises(StateError, match="another dataset"):
        DatasetSubject(other, None, 0, 1, 1, 0, state, batch_size=BATCH, shuffle_window=WINDOW, seed=5)
    with pytest.raises(StateError, match="version"):
        DatasetSubject(url, None, 0, 1, 1, 0, {**state, "version": 99}, batch_size=BATCH, seed=5)


def test_set_epoch_discards_a_state_of_another_epoch(dataset):
    _, keys = dataset
    opener = dataset_opener(dataset)
    _, state = __import__("tests.resume_harness", fromlist=["take"]).take(opener(0, 1, 1, 0, None), 5)
    subject = opener(0, 1, 1, 0, state)
    subject.dataset.set_epoch(1)
    assert sorted(k for b in subject.batches() for k in b) == sorted(keys)


# -- DataLoader -------------------------------------------------------------------------------


def loader_opener(dataset, **kwargs):
    url, _ = dataset
    return functools.partial(
        LoaderSubject, url, None, batch_size=BATCH, shuffle_window=WINDOW, seed=5, **kwargs
    )


@pytest.mark.parametrize("topo", [Topo(1, 0), Topo(2, 2), Topo(1, 1)])
def test_loader_resume_same_topology(dataset, topo):
    check_resume_same_topology(loader_opener(dataset), topo, steps=[3, 1000], ranks=[topo.world_size - 1])


@pytest.mark.parametrize(
    ("before", "after", "steps"),
    [(Topo(2, 2), Topo(1, 1), 5), (Topo(1, 0), Topo(2, 2), 7), (Topo(1, 1), Topo(3, 0), 3)],
)
def test_loader_resume_elastic(dataset, before, after, steps):
    _, keys = dataset
    check_resume_elastic(loader_opener(dataset), before, after, steps=steps, expected=keys)


def test_loader_batches_equal_the_plan_batches(dataset):
    """What the DataLoader yields is what the plan says, key for key (round-robin included)."""
    _, keys = dataset
    plan_batches = list(plan_opener()(1, 2, 2, 4, None).batches())
    loader_batches = list(loader_opener(dataset)(1, 2, 2, 4, None).batches())
    as_keys = [[keys[sum(SIZES[:s]) + i] for s, i in batch] for batch in plan_batches]
    assert loader_batches == as_keys
