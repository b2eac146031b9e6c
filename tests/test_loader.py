"""shardstream.DataLoader: start methods, persistent workers, len, exact resume, errors.

Real worker processes over real tar shards on local disk; datasets stay small because
every spawn or forkserver worker imports torch.
"""

from __future__ import annotations

import functools
import gc
import json

import pytest

import shardstream
from shardstream.errors import UsageError
from tests.resume_harness import LoaderSubject, assert_exactly_once, collate_keys, take, write_dataset

SIZES = [9, 5, 12, 7, 11, 4]  # 48 samples
BATCH = 3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("loader") / "ds")
    return url, write_dataset(url, SIZES)


def make_loader(url, *, workers=2, epoch=0, **kwargs):
    dataset = shardstream.StreamingDataset(url, seed=3, shuffle_window=10, decode=False)
    dataset.set_epoch(epoch)
    return shardstream.DataLoader(
        dataset, batch_size=BATCH, num_workers=workers, collate_fn=collate_keys, **kwargs
    )


def run_epoch(loader):
    batches = list(loader)
    return batches


@pytest.fixture(scope="module")
def reference(dataset):
    """The batches of epochs 0 and 1 with 2 fork workers: every start method must match."""
    url, _ = dataset
    return {
        epoch: run_epoch(make_loader(url, epoch=epoch, multiprocessing_context="fork")) for epoch in (0, 1)
    }


def test_reference_is_every_sample_once_and_epochs_differ(dataset, reference):
    _, keys = dataset
    for batches in reference.values():
        assert_exactly_once([k for b in batches for k in b], keys)
    assert reference[0] != reference[1]
    assert len(make_loader(dataset[0])) == len(reference[0])


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_start_methods_give_the_same_batches(dataset, reference, method):
    url, _ = dataset
    assert run_epoch(make_loader(url, multiprocessing_context=method)) == reference[0]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(dataset, reference, method):
    url, _ = dataset
    loader = make_loader(url, persistent_workers=True, multiprocessing_context=method)
    try:
        assert run_epoch(loader) == reference[0]
        loader.dataset.set_epoch(1)
        assert run_epoch(loader) == reference[1]
        loader.dataset.set_epoch(0)
        assert run_epoch(loader) == reference[0]
    finally:
        loader._iterator._shutdown_workers()


def test_persistent_workers_resume_exactly(dataset, reference):
    url, _ = dataset
    loader = make_loader(url, persistent_workers=True)
    try:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(5)]
        state = json.loads(json.dumps(loader.state_dict()))
        assert head == reference[0][:5]
        # The same loader, its persistent workers busy with the rest of the epoch, loads
        # the state: they must be replaced by workers that know it.
        loader.load_state_dict(state)
        assert run_epoch(loader) == reference[0][5:]
        loader.dataset.set_epoch(1)
        assert run_epoch(loader) == reference[1]
    finally:
        loader._iterator._shutdown_workers()


def test_state_dict_before_during_and_after_an_epoch(dataset, reference):
    url, _ = dataset
    loader = make_loader(url)
    fresh = loader.state_dict()
    assert fresh["epoch"] == 0
    assert fresh["plan"]["passes"][-1]["steps"] == 0
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    assert loader.state_dict()["plan"]["passes"][-1]["steps"] == 2
    del iterator
    ended = make_loader(url)
    run_epoch(ended)
    end_state = ended.state_dict()
    assert end_state["plan"]["passes"][-1]["steps"] == len(reference[0])
    resumed = make_loader(url)
    resumed.load_state_dict(end_state)
    assert resumed.state_dict() == end_state  # a loaded state reads back unchanged
    assert run_epoch(resumed) == []
    resumed.dataset.set_epoch(1)
    assert resumed.state_dict()["epoch"] == 1
    assert run_epoch(resumed) == reference[1]


def test_len_counts_partial_batches_of_every_worker(dataset):
    url, keys = dataset
    loader = make_loader(url, workers=2)
    batches = run_epoch(loader)
    assert len(batches) == len(loader)
    assert sum(len(b) for b in batches) == len(keys) == len(loader.dataset)


def test_resume_with_another_number_of_workers_in_a_new_loader(dataset):
    url, keys = dataset
    opener = functools.partial(LoaderSubject, url, None, batch_size=BATCH, shuffle_window=10, seed=3)
    head, state = take(opener(0, 1, 2, 0, None), 4)
    tail, _ = take(opener(0, 1, 1, 0, state), None)
    assert_exactly_once([k for b in head + tail for k in b], keys)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"drop_last": True}, "drop_last"), ({"in_order": False}, "in_order")],
)
def test_options_that_break_exact_resume_are_refused(dataset, kwargs, match):
    with pytest.raises(UsageError, match=match):
        make_loader(dataset[0], **kwargs)


def test_only_a_streaming_dataset(dataset):
    with pytest.raises(UsageError):
        shardstream.DataLoader([1, 2, 3])  # type: ignore[arg-type]


_INHERITED: list[object] = []  # made in the test's process before the workers fork


def _collector_view(sample):
    """What a worker's garbage collector walks: whether it still tracks an object its
    parent made before the fork, and how many objects it froze."""
    inherited = _INHERITED[0]
    walked = any(obj is inherited for obj in gc.get_objects())
    return {"__key__": sample["__key__"], "walked": walked, "frozen": gc.get_freeze_count()}


def test_a_fork_worker_freezes_what_it_inherited(dataset):
    """NOTE [ A worker's garbage collector ]: a fork worker's collections never walk the
    parent's objects (walking them copied their pages and took 0.4 s a collection),
    and the main process is left alone."""
    url, keys = dataset
    _INHERITED[:] = [[object()]]  # a tracked container, as most of a parent's heap is
    frozen_before = gc.get_freeze_count()
    dataset_ = shardstream.StreamingDataset(url, seed=3, decode=False, transform=_collector_view)
    loader = shardstream.DataLoader(
        dataset_, batch_size=BATCH, num_workers=2, multiprocessing_context="fork", collate_fn=list
    )
    samples = [sample for batch in loader for sample in batch]
    assert sorted(sample["__key__"] for sample in samples) == sorted(keys)
    assert not any(sample["walked"] for sample in samples)
    assert all(sample["frozen"] > 0 for sample in samples)
    assert gc.get_freeze_count() == frozen_before  # the main process froze nothing
    in_process = shardstream.DataLoader(dataset_, batch_size=BATCH, num_workers=0, collate_fn=list)
    assert all(sample["walked"] for batch in in_process for sample in batch)
