"""Prefetcher: results in submission order, errors where they belong, bounded work, no leaked threads."""

from __future__ import annotations

import threading
import time

import pytest

from shardstream.errors import UsageError
from shardstream.storage import Prefetcher


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("shardstream-prefetch")]


def test_results_come_back_in_submission_order():
    def fetch(i: int) -> int:
        time.sleep(0.002 * ((7 * i) % 5))  # later items often finish first
        return i * i

    with Prefetcher(fetch, threads=4, max_pending=6) as prefetcher:
        for i in range(40):
            prefetcher.submit(i)
        assert [prefetcher.next() for _ in range(40)] == [i * i for i in range(40)]
        assert prefetcher.pending == 0
    assert _prefetch_threads() == []


def test_an_error_is_raised_for_its_own_item_only():
    def fetch(i: int) -> int:
        if i == 3:
            raise ValueError(f"item {i} is bad")
        return i

    with Prefetcher(fetch, threads=2) as prefetcher:
        for i in range(6):
            prefetcher.submit(i)
        assert [prefetcher.next() for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ValueError, match="item 3 is bad"):
            prefetcher.next()
        assert [prefetcher.next() for _ in range(2)] == [4, 5]


def test_at_most_max_pending_fetches_run_ahead():
    release = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    def fetch(i: int) -> int:
        with lock:
            started.append(i)
        release.wait(timeout=30)
        return i

    prefetcher = Prefetcher(fetch, threads=8, max_pending=3)
    for i in range(10):
        prefetcher.submit(i)  # never blocks
    assert prefetcher.pending == 10
    deadline = time.monotonic() + 30
    while len(started) < 3 and time.monotonic() < deadline:  # 8 threads, but only 3 may start
        time.sleep(0.001)
    with lock:
        assert sorted(started) == [0, 1, 2]
    release.set()
    assert prefetcher.next() == 0
    with lock:
        assert len(started) <= 4  # 3 ahead, plus 1 refilled after the first was claimed
    assert [prefetcher.next() for _ in range(9)] == list(range(1, 10))
    prefetcher.close()


def test_close_cancels_queued_work_and_joins_threads():
    calls: list[int] = []

    def fetch(i: int) -> int:
        calls.append(i)
        time.sleep(0.01)
        return i

    prefetcher = Prefetcher(fetch, threads=2, max_pending=4)
    for i in range(50):
        prefetcher.submit(i)
    assert prefetcher.next() == 0
    prefetcher.close()
    prefetcher.close()  # idempotent
    assert len(calls) <= 5
    assert _prefetch_threads() == []
    with pytest.raises(UsageError):
        prefetcher.submit(1)
    with pytest.raises(UsageError):
        prefetcher.next()


def test_misuse_is_a_usage_error():
    with pytest.raises(UsageError):
        Prefetcher(str, threads=0)
    with Prefetcher(str) as prefetcher, pytest.raises(UsageError, match="nothing submitted"):
        prefetcher.next()
