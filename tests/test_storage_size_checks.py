"""What a checked read costs and how a short one is classed (issue 10): NOTE [ One size
check per object ] in shardstream/storage/expect.py."""

from __future__ import annotations

import uuid

import pytest

from shardstream.errors import StorageError
from shardstream.storage import Expected, RetryPolicy, Storage
from shardstream.types import ByteRange

DATA = bytes(range(256)) * 4096  # 1 MiB


class Counting:
    """A proxy over a file system that counts calls of the methods that make requests."""

    def __init__(self, fs):
        self._fs = fs
        self.calls: dict[str, int] = {}
        self.short_bodies = 0

    def __getattr__(self, name):
        attr = getattr(self._fs, name)
        if name not in ("info", "cat_file", "invalidate_cache"):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            result = attr(*args, **kwargs)
            if name == "cat_file" and self.short_bodies:
                self.short_bodies -= 1
                return result[: len(result) // 2]
            return result

        return counted


@pytest.fixture
def storage():
    url = f"memory://size-checks-{uuid.uuid4().hex}"
    store = Storage(url, retry=RetryPolicy(attempts=3, base_delay=0))
    store.write("shard.bin", DATA)
    counting = Counting(store.fs)
    store._backend._fs = counting
    yield store, counting
    store.fs.rm(store._root, recursive=True)


def test_ranged_reads_ask_the_size_once_per_object(storage):
    store, counting = storage
    expect = Expected(len(DATA))
    for start in range(0, 25 * 40_000, 40_000):
        assert (
            store.read("shard.bin", ByteRange(start, start + 100), expect=expect) == DATA[start : start + 100]
        )
    assert counting.calls["cat_file"] == 25
    assert counting.calls["info"] == 1


def test_whole_reads_are_checked_by_their_length_alone(storage):
    store, counting = storage
    for _ in range(3):
        assert store.read("shard.bin", expect=Expected(len(DATA))) == DATA
    assert counting.calls == {"cat_file": 3}


def test_a_ranged_read_of_a_changed_object_still_fails_at_first(storage):
    store, counting = storage
    with pytest.raises(StorageError, match="changed since the manifest"):
        store.read("shard.bin", ByteRange(0, 10), expect=Expected(len(DATA) + 1))
    assert "cat_file" not in counting.calls


def test_a_size_is_asked_again_after_a_write(storage):
    store, _ = storage
    store.read("shard.bin", ByteRange(0, 10), expect=Expected(len(DATA)))
    store.write("shard.bin", DATA[:1000])
    with pytest.raises(StorageError, match="changed since the manifest"):
        store.read("shard.bin", ByteRange(0, 10), expect=Expected(len(DATA)))


def test_a_short_whole_body_of_an_unchanged_object_is_retried(storage):
    store, counting = storage
    counting.short_bodies = 1
    assert store.read("shard.bin", expect=Expected(len(DATA))) == DATA
    assert counting.calls["cat_file"] == 2


def test_a_whole_read_of_a_changed_object_is_permanent(storage):
    store, counting = storage
    with pytest.raises(StorageError, match="changed since the manifest"):
        store.read("shard.bin", expect=Expected(len(DATA) - 1))
    assert counting.calls["cat_file"] == 1


def test_a_forked_process_asks_the_size_again(storage, monkeypatch):
    store, counting = storage
    expect = Expected(len(DATA))
    store.read("shard.bin", ByteRange(0, 10), expect=expect)
    import shardstream.storage.backend as core

    child = core.os.getpid() + 1
    monkeypatch.setattr(core.os, "getpid", lambda: child)
    store._backend._fs, store._backend._fs_pid = counting, child  # keep counting in the "child"
    store.read("shard.bin", ByteRange(0, 10), expect=expect)
    assert counting.calls["info"] == 2
