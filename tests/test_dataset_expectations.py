"""An iteration does no O(shards) work to check its reads (issue 10): the Expected of a
manifest are made once and shared by every reader of it."""

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
    monkeypatch.setattr(fetch, "_shared", [], raising=False)
    first = list(dataset)
    per_manifest = len(made)
    assert 0 < per_manifest <= 2 * SHARDS
    for epoch in range(1, 4):
        dataset.set_epoch(epoch)
        assert sorted(s["__key__"] for s in dataset) == sorted(s["__key__"] for s in first)
    assert len(made) == per_manifest


def test_readers_of_one_manifest_get_one_read_only_mapping(dataset):
    one = fetch.ByteFetcher(dataset.storage, dataset.manifest)._expected
    two = fetch.ByteFetcher(dataset.storage, dataset.manifest)._expected
    assert one is two
    assert one[dataset.manifest.shards[0].path].sha256 == dataset.manifest.shards[0].sha256
    with pytest.raises(TypeError):
        one["x"] = None  # type: ignore[index]
