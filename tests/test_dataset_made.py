"""A dataset checks what it can when it is made, and is one class whatever it streams:
one per-process ``DatasetSource`` per dataset (or per stream), options defined once."""

from __future__ import annotations

import os
import pickle

import pytest

import shardstream
from shardstream import Stream
from shardstream.dataset import options as dataset_options
from shardstream.dataset.source import DatasetSource
from shardstream.errors import NotADatasetError, UsageError
from shardstream.plan import PlanConfig
from tests.resume_harness import write_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    made = tmp_path_factory.mktemp("made")
    write_dataset(str(made / "a"), [5, 6])
    write_dataset(str(made / "b"), [4])
    return made


def test_a_url_that_is_not_a_dataset_fails_when_the_dataset_is_made(tmp_path):
    for make in (shardstream.StreamingDataset, shardstream.MapDataset):
        with pytest.raises(NotADatasetError):
            make(str(tmp_path / "typo"))
    with pytest.raises(NotADatasetError):
        shardstream.StreamingDataset([str(tmp_path / "typo")])


def test_a_mixture_sized_two_ways_fails_when_made(root):
    with pytest.raises(UsageError, match="every stream a weight, or none"):
        shardstream.StreamingDataset([Stream(str(root / "a"), weight=1), Stream(str(root / "b"))])


def test_seq_len_on_a_dataset_of_samples_fails_when_made(root):
    with pytest.raises(UsageError, match="token dataset"):
        shardstream.StreamingDataset(str(root / "a"), seq_len=8)


def test_one_class_streams_a_url_or_a_mixture(root):
    one = shardstream.StreamingDataset(str(root / "a"), decode=False)
    mixed = shardstream.StreamingDataset([str(root / "a"), str(root / "b")], decode=False)
    assert type(one) is type(mixed) is shardstream.StreamingDataset
    assert "__new__" not in vars(shardstream.StreamingDataset)
    assert [type(source) for source in mixed.sources] == [DatasetSource, DatasetSource]
    assert mixed.datasets == mixed.sources
    assert mixed.datasets[1].manifest.num_samples == 4
    assert one.sources[0].manifest is one.manifest
    with pytest.raises(UsageError, match=r"dataset\.sources\[i\]\.storage"):
        _ = mixed.storage
    with pytest.raises(UsageError, match="a mixture's"):
        _ = one.quotas
    assert len(list(mixed)) == 15


def test_a_source_pickles_with_its_manifest_and_opens_its_own_storage(root, monkeypatch):
    dataset = shardstream.StreamingDataset([str(root / "a"), str(root / "b")], decode=False)
    storages = [source.storage for source in dataset.sources]
    again = pickle.loads(pickle.dumps(dataset))

    def no_reads(*args, **kwargs):
        raise AssertionError("the manifest travels with the dataset")

    monkeypatch.setattr("shardstream.dataset.source.read_streamable_manifest", no_reads)
    assert [s.manifest.num_samples for s in again.sources] == [11, 4]
    assert all(a.storage is not b for a, b in zip(again.sources, storages, strict=True))
    assert len(list(again)) == 15


def test_the_storage_is_made_anew_after_fork(root):
    source = shardstream.MapDataset(str(root / "a")).source
    parent = source.storage
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.write(write, b"new" if source.storage is not parent else b"same")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    assert answer == b"new"
    assert source.storage is parent


def test_every_keyword_keeps_working_and_a_misspelled_one_is_a_type_error(root):
    url = str(root / "a")
    with pytest.raises(TypeError, match="unexpected keyword argument 'shufle'"):
        shardstream.StreamingDataset(url, shufle=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'on_error'"):
        shardstream.MapDataset(url, on_error="skip")
    with pytest.raises(TypeError, match="unexpected keyword argument 'windows'"):
        shardstream.ShardSampler([3, 4], windows=2)
    dataset = shardstream.StreamingDataset(
        url, shuffle=False, seed=3, drop_last=True, shuffle_window=2, local_reads="copy", read_budget=1 << 20
    )
    assert dataset.config.plan == PlanConfig(shuffle=False, seed=3, drop_last=True, shuffle_window=2)
    assert (dataset.config.read.local_reads, dataset.config.read.read_budget) == ("copy", 1 << 20)


def test_the_plan_options_are_the_plan_configs():
    assert {
        "shuffle",
        "seed",
        "drop_last",
        "shuffle_window",
        "order",
        "global_batch_size",
        "read_lanes",
    } == dataset_options.PLAN_OPTIONS
    sampler = shardstream.ShardSampler([3, 4], num_replicas=1, rank=0, seed=2, shuffle_window=3)
    assert sampler.config == PlanConfig(seed=2, shuffle_window=3)
