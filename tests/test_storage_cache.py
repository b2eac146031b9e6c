"""The local shard cache: whole-object downloads, LRU eviction, atomicity, sharing between processes."""

from __future__ import annotations

import multiprocessing
import os
import random
import uuid

import pytest

from shardstream.errors import TransientStorageError, UsageError
from shardstream.storage import ShardCache, Storage
from shardstream.storage.cache import MARKER
from shardstream.storage.cached import cache_key
from shardstream.types import ByteRange

SIZE = 100_000
SHARDS = {f"shard-{i:06d}.tar": random.Random(i).randbytes(SIZE) for i in range(3)}


@pytest.fixture
def source():
    """A memory:// dataset with three shards, and a cleanup."""
    storage = Storage(f"memory://cache-{uuid.uuid4().hex[:8]}")
    for name, data in SHARDS.items():
        storage.write(name, data)
    yield storage
    for name in storage.list_files():
        storage.delete(name)


def _entries(cache_dir) -> list[str]:
    return sorted(n for n in os.listdir(cache_dir) if n.startswith("sscache-") and not n.endswith(".lock"))


def test_first_ranged_read_caches_the_whole_shard(source, tmp_path):
    cached = Storage(source.url, cache_dir=str(tmp_path))
    assert cached.read("shard-000000.tar", ByteRange(10, 20)) == SHARDS["shard-000000.tar"][10:20]
    entry = cached._cache.entry_path(cache_key(cached, "shard-000000.tar"))
    with open(entry, "rb") as f:
        assert f.read() == SHARDS["shard-000000.tar"]
    source.delete("shard-000000.tar")  # later reads come from the local copy
    assert cached.read("shard-000000.tar", ByteRange(500, 90_000)) == SHARDS["shard-000000.tar"][500:90_000]
    assert cached.read("shard-000000.tar") == SHARDS["shard-000000.tar"]
    with cached.open("shard-000000.tar") as f:
        f.seek(SIZE - 5)
        assert f.read() == SHARDS["shard-000000.tar"][-5:]
    assert os.path.exists(tmp_path / MARKER)


def test_lru_eviction_keeps_recent_entries_and_foreign_files(source, tmp_path):
    (tmp_path / "notes.txt").write_text("mine, not the cache's")
    (tmp_path / "sscache-not-a-cache-entry").write_bytes(b"x" * SIZE)
    cached = Storage(source.url, cache_dir=str(tmp_path), cache_limit=int(2.5 * SIZE))
    cache = cached._cache
    path = {name: cache.entry_path(cache_key(cached, name)) for name in SHARDS}
    cached.read("shard-000000.tar", ByteRange(0, 1))
    cached.read("shard-000001.tar", ByteRange(0, 1))
    cached.read("shard-000000.tar", ByteRange(1, 2))  # 0 is now more recent than 1
    cached.read("shard-000002.tar", ByteRange(0, 1))  # over the limit: 1 goes
    assert os.path.exists(path["shard-000000.tar"])
    assert not os.path.exists(path["shard-000001.tar"])
    assert os.path.exists(path["shard-000002.tar"])
    assert cache.total_bytes() == 2 * SIZE
    assert (tmp_path / "notes.txt").read_text() == "mine, not the cache's"
    assert (tmp_path / "sscache-not-a-cache-entry").read_bytes() == b"x" * SIZE
    # an evicted shard comes back on its next read
    assert cached.read("shard-000001.tar", ByteRange(7, 9)) == SHARDS["shard-000001.tar"][7:9]


def test_an_entry_larger_than_the_limit_is_still_served(source, tmp_path):
    cached = Storage(source.url, cache_dir=str(tmp_path), cache_limit=10)
    for name, data in SHARDS.items():
        assert cached.read(name, ByteRange(5, 50)) == data[5:50]
    assert len(_entries(tmp_path)) == 1


def test_wrong_size_entry_is_replaced(source, tmp_path):
    cached = Storage(source.url, cache_dir=str(tmp_path))
    cached.read("shard-000000.tar", ByteRange(0, 1))
    source.write("shard-000000.tar", b"rewritten, shorter")  # not through the cached Storage
    fresh = Storage(source.url, cache_dir=str(tmp_path))  # a new process would start like this
    assert fresh.read("shard-000000.tar") == b"rewritten, shorter"
    entry = fresh._cache.entry_path(cache_key(fresh, "shard-000000.tar"))
    with open(entry, "wb") as f:  # a torn copy left by something else
        f.write(b"rewr")
    assert (
        Storage(source.url, cache_dir=str(tmp_path)).read("shard-000000.tar", ByteRange(0, 9)) == b"rewritten"
    )


def test_writes_and_deletes_through_the_cached_storage_drop_the_entry(source, tmp_path):
    cached = Storage(source.url, cache_dir=str(tmp_path))
    cached.read("shard-000000.tar", ByteRange(0, 1))
    cached.write("shard-000000.tar", b"new bytes")
    assert cached.read("shard-000000.tar") == b"new bytes"
    cached.delete("shard-000000.tar")
    assert _entries(tmp_path) == []


def test_download_is_never_visible_half_done_and_failure_leaves_nothing(tmp_path):
    cache = ShardCache(str(tmp_path))
    entry = cache.entry_path("memory://x/a.tar")
    seen = []

    def download(tmp: str, size: int) -> None:
        with open(tmp, "wb") as f:
            f.write(b"half")
            f.flush()
            seen.append(os.path.exists(entry))
            raise ConnectionResetError("reset mid-download")

    with pytest.raises(ConnectionResetError):
        cache.fetch("memory://x/a.tar", lambda: 8, download)
    assert seen == [False]
    assert sorted(os.listdir(tmp_path)) == [MARKER, os.path.basename(entry) + ".lock"]


def test_short_download_is_rejected(tmp_path):
    cache = ShardCache(str(tmp_path))

    def download(tmp: str, size: int) -> None:
        with open(tmp, "wb") as f:
            f.write(b"1234")

    with pytest.raises(TransientStorageError, match="got 4 of 8 bytes"):
        cache.fetch("memory://x/a.tar", lambda: 8, download)
    assert _entries(tmp_path) == []


def test_local_storage_is_not_cached_and_limit_needs_a_dir(tmp_path):
    local = Storage(str(tmp_path / "ds"), cache_dir=str(tmp_path / "cache"))
    local.write("a.bin", b"abc")
    assert local.read("a.bin", ByteRange(1, 2)) == b"b"
    assert not (tmp_path / "cache").exists()
    with pytest.raises(UsageError):
        Storage("memory://x", cache_limit=10)
    with pytest.raises(UsageError):
        ShardCache(str(tmp_path), limit=-1)


@pytest.mark.s3
def test_two_processes_share_one_cache_dir(s3, tmp_path):
    base, options = s3
    writer = Storage(base, options)
    for name, data in SHARDS.items():
        writer.write(name, data)
    writer.close()
    cached = Storage(base, options, cache_dir=str(tmp_path / "cache"), cache_limit=10 * SIZE)
    context = multiprocessing.get_context("fork")
    orders = [sorted(SHARDS), sorted(SHARDS, reverse=True)]
    processes = [context.Process(target=_read_everything, args=(cached, order)) for order in orders]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0]
    names = sorted(os.listdir(tmp_path / "cache"))
    assert not [n for n in names if n.startswith(".sscache-tmp-")]  # no half downloads left
    assert len(_entries(tmp_path / "cache")) == len(SHARDS)
    for name, data in SHARDS.items():
        with open(cached._cache.entry_path(cache_key(cached, name)), "rb") as f:
            assert f.read() == data


def _read_everything(storage: Storage, order: list[str]) -> None:
    for name in order:
        data = SHARDS[name]
        for start in range(0, SIZE, 25_000):
            if storage.read(name, ByteRange(start, start + 1000)) != data[start : start + 1000]:
                raise SystemExit(7)
    storage.close()
