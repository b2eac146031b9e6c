"""Long copy reads of a local folder go into read buffers (NOTE [ Local reads into buffers ]
in shardstream/storage/ranged.py): the same bytes as a plain read, still copies (a shard
cut short in place is an error, never a crash), and samples stay ``bytes``."""

from __future__ import annotations

import os

import pytest

import shardstream
from shardstream.errors import ShardstreamError, StorageError
from shardstream.pack import ShardWriter
from shardstream.storage import Storage, local, ranged
from shardstream.storage.expect import Expected
from shardstream.storage.ranged import RangedReads
from shardstream.types import ByteRange


@pytest.fixture
def blob(tmp_path):
    data = os.urandom(3 * 2**20 + 12345)
    (tmp_path / "blob").write_bytes(data)
    return tmp_path, data


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(ranged, "LOCAL_BUFFERED", 4096)


def test_a_long_copy_read_comes_in_a_buffer_with_the_same_bytes(blob, small_threshold):
    root, data = blob
    with Storage(str(root)) as storage:
        reads = RangedReads(storage, threads=4, local_reads="copy")
        try:
            expect = Expected(len(data))
            part = reads.read("blob", ByteRange(1000, len(data) - 7), expect)
            assert isinstance(part, memoryview)
            assert bytes(part) == data[1000:-7]
            told: list[int] = []
            whole = reads.read("blob", None, expect, told.append)
            assert bytes(whole) == data
            assert sum(told) == len(data)
            short = reads.read("blob", ByteRange(5, 100), expect)
            assert type(short) is bytes
            assert short == data[5:100]
        finally:
            reads.close()


def test_read_range_into_stops_at_the_end_of_the_file(blob):
    root, data = blob
    out = memoryview(bytearray(100))
    assert local.read_range_into(str(root / "blob"), len(data) - 40, out) == 40
    assert bytes(out[:40]) == data[-40:]


def test_a_buffered_read_of_a_file_cut_short_is_an_error(blob, small_threshold):
    root, data = blob
    with Storage(str(root)) as storage:
        reads = RangedReads(storage, threads=1, local_reads="copy")
        try:
            os.truncate(root / "blob", len(data) // 2)
            with pytest.raises(StorageError):
                reads.read("blob", ByteRange(0, len(data)), None)
            with pytest.raises(StorageError):
                reads.read("blob", ByteRange(0, len(data)), Expected(len(data)))
        finally:
            reads.close()


def write(url, count=60):
    with ShardWriter(url, format="tar", samples_per_shard=25) as writer:
        for i in range(count):
            writer.write({"__key__": f"{i:05d}", "bin": os.urandom(3000 + i), "cls": b"%d" % i})


def test_samples_of_buffered_reads_are_the_bytes_of_the_shards(tmp_path, small_threshold):
    url = str(tmp_path / "ds")
    write(url)
    kept = [
        dict(s) for s in shardstream.StreamingDataset(url, decode=False, shuffle=False, local_reads="map")
    ]
    got = list(shardstream.StreamingDataset(url, decode=False, shuffle=False))
    assert all(type(s["bin"]) is bytes and type(s["cls"]) is bytes for s in got)
    assert [(s["__key__"], s["bin"], s["cls"]) for s in got] == [
        (s["__key__"], bytes(s["bin"]), bytes(s["cls"])) for s in kept
    ]


def test_a_shard_cut_short_in_place_fails_the_epoch_without_a_crash(tmp_path, small_threshold):
    url = str(tmp_path / "ds")
    write(url)
    dataset = shardstream.StreamingDataset(url, decode=False, shuffle=False)
    shard = os.path.join(url, dataset.manifest.shards[1].path)
    os.truncate(shard, os.path.getsize(shard) // 2)
    with pytest.raises(ShardstreamError):
        list(dataset)
