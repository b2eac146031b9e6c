"""Start at scale for ``MapDataset``: one manifest read per job, as a ``StreamingDataset``'s
(NOTE [ One manifest read per job ] in shardstream/dataset/startup.py): the ranks of a
node share one read through the node's locked copy, and under torch.distributed (its
calls stood in for) a rank takes rank 0's broadcast only for its own dataset. Every
dataset still gives its exact samples.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

import shardstream
from tests import test_start_storm
from tests.test_start_storm import MANIFEST, SIZES, FakeGroup, sent_by_rank_0

counted = test_start_storm.counted  # the fixture: a dataset behind a counting proxy

OFFSETS = [sum(SIZES[:shard]) for shard in range(len(SIZES))]


def key_of(i: int) -> str:
    """The key of sample ``i`` in manifest order, as tests.resume_harness writes it."""
    shard = max(s for s, start in enumerate(OFFSETS) if start <= i)
    return f"s{shard:03d}-{i - OFFSETS[shard]:04d}"


def check_exact(dataset: shardstream.MapDataset) -> None:
    assert len(dataset) == sum(SIZES)
    assert dataset[0]["__key__"] == key_of(0)
    assert dataset[-1]["__key__"] == key_of(sum(SIZES) - 1)
    picked = [79, 3, 40, 3, 12, 66]
    assert [s["__key__"] for s in dataset.get_many(picked)] == [key_of(i) for i in picked]


def as_rank(monkeypatch, rank: int, world: int = 4) -> None:
    """This process as rank ``rank`` of ``world`` that a launcher started (no process group)."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", str(rank))


def test_ranks_on_one_node_share_one_manifest_read(counted, tmp_path, monkeypatch):
    url, options, proxy = counted
    node_a, node_b = tmp_path / "a", tmp_path / "b"
    node_a.mkdir()
    node_b.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(node_a))
    as_rank(monkeypatch, 0)
    first = shardstream.MapDataset(url, storage_options=options, decode=False)
    as_rank(monkeypatch, 1)
    second = shardstream.MapDataset(url, storage_options=options, decode=False)
    assert proxy.of(MANIFEST) == 1
    assert second.source.fingerprint == first.source.fingerprint
    monkeypatch.setattr(tempfile, "tempdir", str(node_b))  # another node
    as_rank(monkeypatch, 2)
    shardstream.MapDataset(url, storage_options=options, decode=False)
    assert proxy.of(MANIFEST) == 2
    # a node's copy that is not the dataset it names (its fingerprint does not match) is read again
    (copy,) = (node_b / f"shardstream-start-{os.getuid()}").glob("manifest-*.json")
    record = json.loads(copy.read_text())
    record["digest"] = "0" * 32
    copy.write_text(json.dumps(record))
    as_rank(monkeypatch, 3)
    third = shardstream.MapDataset(url, storage_options=options, decode=False)
    assert proxy.of(MANIFEST) == 3
    assert third.source.fingerprint == first.source.fingerprint
    for dataset in (first, second, third):
        check_exact(dataset)
        dataset.close()
    assert proxy.of(MANIFEST) == 3  # reading samples never reads the manifest again


def test_a_streaming_and_a_map_dataset_of_one_node_share_one_read(counted, tmp_path, monkeypatch):
    url, options, proxy = counted
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    as_rank(monkeypatch, 0, world=2)
    shardstream.StreamingDataset(url, storage_options=options)
    as_rank(monkeypatch, 1, world=2)
    with shardstream.MapDataset(url, storage_options=options, decode=False) as dataset:
        check_exact(dataset)
    assert proxy.of(MANIFEST) == 1


def test_share_manifest_false_or_one_rank_reads_its_own(counted, tmp_path, monkeypatch):
    url, options, proxy = counted
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shardstream.MapDataset(url, storage_options=options)  # one rank alone: no node copy
    assert list(tmp_path.iterdir()) == []
    as_rank(monkeypatch, 1)
    for _ in range(2):
        shardstream.MapDataset(url, storage_options=options, share_manifest=False)
    assert list(tmp_path.iterdir()) == []
    assert proxy.of(MANIFEST) == 3


# -- the broadcast's rule, with torch.distributed's calls stood in for -----------------------


@pytest.fixture
def two_local(tmp_path):
    from tests.resume_harness import write_dataset

    write_dataset(str(tmp_path / "one"), SIZES)
    write_dataset(str(tmp_path / "other"), SIZES[::-1])  # the same shard sizes, other contents
    return str(tmp_path / "one"), str(tmp_path / "other")


def test_a_rank_takes_the_broadcast_manifest_of_its_own_dataset(two_local, monkeypatch):
    one, _ = two_local
    sent = sent_by_rank_0(one)
    FakeGroup([sent]).install(monkeypatch)
    dataset = shardstream.MapDataset(one, decode=False)
    assert dataset.manifest is sent[1]
    check_exact(dataset)


def test_a_rank_never_takes_the_manifest_of_another_dataset(two_local, monkeypatch):
    one, other = two_local
    key, manifest, fingerprint = sent_by_rank_0(other)
    own_key, _, own_fingerprint = sent_by_rank_0(one)
    for sent in (
        [(key, manifest, fingerprint)],  # rank 0 was given another dataset
        [(own_key, manifest, own_fingerprint)],  # this name, but not the dataset the fingerprint names
        None,  # rank 0's read failed: read our own
    ):
        FakeGroup(sent).install(monkeypatch)
        dataset = shardstream.MapDataset(one, decode=False)
        assert dataset.manifest is not manifest
        assert dataset.source.fingerprint == own_fingerprint
        check_exact(dataset)


def test_share_manifest_false_joins_no_broadcast(two_local, monkeypatch):
    one, _ = two_local
    group = FakeGroup(None)
    group.install(monkeypatch)

    def refused(objects, src=0, group=None):
        raise AssertionError("a dataset made with share_manifest=False joined a broadcast")

    import torch.distributed as dist

    monkeypatch.setattr(dist, "broadcast_object_list", refused)
    check_exact(shardstream.MapDataset(one, decode=False, share_manifest=False))
