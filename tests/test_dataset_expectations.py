"""An iteration does no O(shards) work to check its reads (issue 10): the Expected of a
manifest are made once per dataset and process, and shared by every reader it makes."""

from __future__ import annotations

import pytest

import shardstream
from shardstream.dataset import fetch
from shardstream.pack import ShardWriter

SHARDS, PER_SHARD = 6, 5


@pytest.fixture
def dataset(tmp_path):
    url = str(tmp_path / "ds")
    with ShardWriter(url, samples_per_shard=PER_SHARD) as writer:
        for i in range(SHARDS * PER_SHARD):
            writer.write({"__key__": f"s{i:04d}", "txt": str(i).encode()})
    return shardstream.StreamingDataset(url, decode=False, shuffle=True)


def test_iterations_share_the_expectations_of_their_manifest(dataset, monkeypatch):
    made = []

    class Counted(fetch.Expected):
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(fetch, "Expected", Counted)
    first = list(dataset)
    per_manifest = len(made)
    assert 0 < per_manifest <= 2 * SHARDS
    for epoch in range(1, 4):
        dataset.set_epoch(epoch)
        assert sorted(s["__key__"] for s in dataset) == sorted(s["__key__"] for s in first)
    assert len(made) == per_manifest


def test_the_readers_of_a_dataset_get_one_read_only_mapping(dataset):
    list(dataset)
    one = dataset.sources[0].expectations()
    dataset.set_epoch(1)
    list(dataset)
    assert dataset.sources[0].expectations() is one
    assert one[dataset.manifest.shards[0].path].sha256 == dataset.manifest.shards[0].sha256
    with pytest.raises(TypeError):
        one["x"] = None  # type: ignore[index]
    other = shardstream.StreamingDataset(dataset.url, decode=False)
    list(other)
    assert other.sources[0].expectations() is not one  # another dataset: its own
    assert fetch.ByteFetcher(dataset.storage, expected=one)._expected is one
