"""``local_reads``: shards of a local folder copied (``pread``) or memory-mapped.

Mapping is what makes small local samples fast, and it is only safe where nothing
truncates a shard in place while it is read (NOTE [ Getting the bytes ] in
shardstream/dataset/fetch.py): the user's choice (``"map"``), or a read-only mount
(``"auto"``). These tests check which path each setting takes, that both yield the same
samples, and that a mapped read still checks the shard against the manifest.
"""

from __future__ import annotations

import mmap
import os

import pytest

import shardstream
from shardstream.errors import StorageError, UsageError
from shardstream.pack import ShardWriter
from shardstream.storage import Storage, local


@pytest.fixture
def maps(monkeypatch):
    """The mmap.mmap calls made while the test runs (wherever storage maps from)."""
    calls = []
    original = mmap.mmap

    def recording(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", recording)
    return calls


def write(url, fmt="tar", count=300):
    with ShardWriter(url, format=fmt, samples_per_shard=70) as writer:
        for i in range(count):
            writer.write({"__key__": f"{i:05d}", "txt": f"sample {i} ".encode() * 5, "cls": b"%d" % (i % 7)})


def epoch(url, **options):
    dataset = shardstream.StreamingDataset(
        url, decode=False, shuffle=True, seed=3, shuffle_window=50, **options
    )
    return [(s["__key__"], bytes(s["txt"]), bytes(s["cls"])) for s in dataset]


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_map_and_copy_yield_the_same_samples(tmp_path, fmt, maps):
    url = str(tmp_path / "d")
    write(url, fmt)
    copied = epoch(url, local_reads="copy")
    assert not maps, "copy mapped a local file"
    mapped = epoch(url, local_reads="map")
    assert maps, "map did not map the shards"
    assert mapped == copied
    assert len({key for key, _, _ in mapped}) == 300


def test_auto_copies_on_a_writable_mount_and_maps_on_a_read_only_one(tmp_path, maps, monkeypatch):
    url = str(tmp_path / "d")
    write(url)
    assert not Storage(url).read_only_mount
    expected = epoch(url)  # the default is "auto"
    assert not maps, "auto mapped a file on a writable mount"

    real = os.statvfs

    class ReadOnly:
        def __init__(self, result):
            self.f_flag = result.f_flag | os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", lambda path: ReadOnly(real(path)))
    assert local.on_read_only_mount(url)
    assert Storage(url).read_only_mount
    assert epoch(url) == expected
    assert maps, "auto did not map on a read-only mount"


def test_a_mapped_read_checks_the_shard_against_the_manifest(tmp_path):
    """A shard of another size than the manifest says is refused before it is mapped, as
    a copied read refuses it (a mapping of a shorter file would die with SIGBUS)."""
    url = str(tmp_path / "d")
    write(url)
    path = os.path.join(url, "shard-000001.tar")
    os.truncate(path, os.path.getsize(path) - 1024)
    with pytest.raises(StorageError, match="changed since the manifest was written") as info:
        epoch(url, local_reads="map")
    assert info.value.shard == "shard-000001.tar"


def test_local_reads_is_validated(tmp_path):
    url = str(tmp_path / "d")
    write(url, count=5)
    with pytest.raises(UsageError, match="local_reads must be one of"):
        shardstream.StreamingDataset(url, local_reads="mmap")
