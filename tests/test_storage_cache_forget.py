"""Writing or deleting a path through a cached Storage forgets every cached entry of it,
whatever content it was cached under (issue 10)."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from shardstream.storage import Expected, Storage
from shardstream.storage.cached import cache_key
from shardstream.types import ByteRange

DATA = b"shard bytes " * 1000


@pytest.fixture
def cached(tmp_path):
    store = Storage(f"memory://forget-{uuid.uuid4().hex}", cache_dir=str(tmp_path / "cache"))
    store.write("shard.tar", DATA)
    store.write("other.tar", DATA)
    yield store
    store.fs.rm(store._root, recursive=True)


def entries(store: Storage) -> list[str]:
    names = os.listdir(store.cache_dir)
    return sorted(n for n in names if n.startswith("sscache-") and not n.endswith(".lock"))


def fill(store: Storage, path: str) -> None:
    by_content = Expected(len(DATA), hashlib.sha256(DATA).hexdigest())
    assert store.read(path, ByteRange(0, 5), expect=by_content) == DATA[:5]
    assert store.read(path, ByteRange(0, 5)) == DATA[:5]  # an entry by name alone


@pytest.mark.parametrize("change", ["delete", "write"])
def test_a_changed_path_forgets_all_its_entries(cached, change):
    fill(cached, "shard.tar")
    fill(cached, "other.tar")
    assert len(entries(cached)) == 4
    if change == "delete":
        cached.delete("shard.tar")
    else:
        cached.write("shard.tar", b"new")
    left = entries(cached)
    assert len(left) == 2
    assert cached._cache.entry_path(cache_key(cached, "other.tar")).rsplit("/", 1)[1] in left
    if change == "write":
        assert cached.read("shard.tar") == b"new"


def test_forgetting_a_path_in_an_empty_cache_is_fine(cached, tmp_path):
    cached.delete("missing.tar")
    assert entries(cached) == []
