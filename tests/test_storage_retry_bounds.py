"""What RetryPolicy.timeout bounds, and what a retry costs (issue 10): NOTE [ Bounded
waits ] in shardstream/storage/retry.py."""

from __future__ import annotations

import uuid

import pytest

from shardstream.errors import TransientStorageError
from shardstream.storage import RetryPolicy, Storage
from shardstream.storage import backend as backend_module
from shardstream.storage import retry as retry_module


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(retry_module, "_clock", lambda: now[0])
    monkeypatch.setattr(retry_module, "_sleep", lambda seconds: None)
    return now


@pytest.fixture
def memory():
    store = Storage(f"memory://retry-bounds-{uuid.uuid4().hex}", retry=RetryPolicy(attempts=8, timeout=60))
    yield store
    if store.fs.exists(store._root):
        store.fs.rm(store._root, recursive=True)


def _slow_and_failing(clock, real, failures):
    calls = []

    def upload(*args, **kwargs):  # each try runs 100 s on the fake clock
        calls.append(clock[0])
        clock[0] += 100.0
        if len(calls) <= failures:
            raise ConnectionResetError("connection reset")
        return real(*args, **kwargs)

    return upload, calls


def test_an_upload_longer_than_the_timeout_keeps_its_attempts(clock, memory, monkeypatch):
    upload, calls = _slow_and_failing(clock, memory.fs.pipe_file, failures=5)
    monkeypatch.setattr(memory.fs, "pipe_file", upload)
    memory.write("shard.bin", b"x" * 100)
    assert len(calls) == 6
    assert memory.read("shard.bin") == b"x" * 100


def test_a_streamed_upload_longer_than_the_timeout_keeps_its_attempts(clock, memory, monkeypatch):
    upload, calls = _slow_and_failing(clock, memory.fs.put_file, failures=7)
    monkeypatch.setattr(memory.fs, "put_file", upload)
    with memory.writer("shard.bin") as f:
        f.write(b"y" * 100)
    assert len(calls) == 8


def test_an_upload_still_stops_after_its_attempts(clock, memory, monkeypatch):
    upload, calls = _slow_and_failing(clock, memory.fs.pipe_file, failures=100)
    monkeypatch.setattr(memory.fs, "pipe_file", upload)
    with pytest.raises(TransientStorageError, match="after 8 tries"):
        memory.write("shard.bin", b"x")
    assert len(calls) == 8


def test_reads_are_still_bounded(clock, memory, monkeypatch):
    memory.write("shard.bin", b"x")
    read, calls = _slow_and_failing(clock, memory.fs.cat_file, failures=100)
    monkeypatch.setattr(memory.fs, "cat_file", read)
    with pytest.raises(TransientStorageError, match="after 1 tries"):  # no try starts past the deadline
        memory.read("shard.bin")
    assert len(calls) == 1


def test_the_timeouts_text_is_made_only_for_an_error(monkeypatch):
    made = []
    real = backend_module.timeouts_of
    monkeypatch.setattr(backend_module, "timeouts_of", lambda options: made.append(1) or real(options))
    store = Storage("s3://bucket/ds")
    assert store._retry(lambda: 42, "read", "shard.bin") == 42
    assert made == []

    def timed_out():
        raise TimeoutError("timed out")

    store = Storage("s3://bucket/ds", retry=RetryPolicy(attempts=2, base_delay=0))
    with pytest.raises(TransientStorageError, match="each try: "):
        store._retry(timed_out, "read", "shard.bin")
    assert made == [1]
