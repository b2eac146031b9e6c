"""Issue 9, the reading half: reads in parts (NOTE [ Reads in parts ]), windows fetched
ahead within a byte budget (NOTE [ Read budget ]), the cache filled as shards stream
(NOTE [ Filling the cache ]), all exact, fork- and spawn-safe."""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

import shardstream
from shardstream.dataset.budget import (
    FIRST_PIECE_SHARE,
    PIECES_IN_BUDGET,
    BudgetClosed,
    ReadBudget,
    in_pieces,
)
from shardstream.dataset.reader import WindowReader
from shardstream.errors import StorageError, UsageError
from shardstream.manifest import ShardInfo
from shardstream.plan import Run, Window
from shardstream.storage import Expected, ReadPool, RetryPolicy, Storage
from shardstream.storage.cuts import PART_MIN, PROBE, split
from shardstream.testing import WanProxy
from shardstream.types import ByteRange
from tests.faultproxy import FaultProxy
from tests.test_parts_upfront import _Measured

MB = 2**20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Recorder(FaultProxy):
    """Forwards everything, and records each GET's object name and Range."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, seed=0, error_rate=0, reset_rate=0, truncate_rate=0)
        self.gets: list[tuple[str, str]] = []

    def decide(self, method: str, path: str, byte_range: str) -> str:
        if method == "GET":
            with self._lock:
                self.gets.append((path.split("?")[0].rsplit("/", 1)[-1], byte_range))
        return super().decide(method, path, byte_range)

    def shard_gets(self) -> list[tuple[str, str]]:
        return [get for get in self.gets if get[0].endswith(".tar")]


def _pack(url: str, options: dict, *, shards: int, samples: int, size: int) -> dict[str, bytes]:
    from shardstream.pack import ShardWriter

    payloads = {}
    with ShardWriter(url, format="tar", samples_per_shard=samples, storage_options=options) as writer:
        for i in range(shards * samples):
            key = f"{i:06d}"
            payloads[key] = hashlib.sha256(key.encode()).digest() * (size // 32)
            writer.write({"__key__": key, "bin": payloads[key]})
    return payloads


def _stopped_and_resumed(
    url: str, options: dict, taken: int, **given: object
) -> tuple[list[str], shardstream.StreamingDataset]:
    """The keys of the first ``taken`` samples of an unshuffled epoch, and a new dataset
    resumed from the state it stopped at."""
    dataset = shardstream.StreamingDataset(url, storage_options=options, shuffle=False, **given)
    iterator = iter(dataset)
    head = [next(iterator)["__key__"] for _ in range(taken)]
    state = dataset.state_dict()
    iterator.close()
    dataset.storage.close()
    resumed = shardstream.StreamingDataset(url, storage_options=options, shuffle=False, **given)
    resumed.load_state_dict(state)
    return head, resumed


# -- parts --------------------------------------------------------------------------------


def test_split_cuts_long_reads_into_parts_that_tile_them():
    assert split(ByteRange(0, PART_MIN), 16) == [ByteRange(0, PART_MIN)]  # too short to cut
    parts = split(ByteRange(5, 5 + 10 * MB + 7), 4)
    assert len(parts) == 4
    assert parts[0].start == 5
    assert parts[-1].end == 5 + 10 * MB + 7
    assert all(a.end == b.start for a, b in itertools.pairwise(parts))
    assert all(part.length <= 8 * MB for part in split(ByteRange(0, 200 * MB)))


def test_a_read_is_not_cut_while_the_reads_in_flight_together_are_fast():
    from shardstream.storage.cuts import FAST_CONNECTION, cut

    pool = ReadPool(8)
    slow = _Measured(
        0.001, 40e6
    )  # 40 MB/s through 1 ms: a short link (over a long one, see test_parts_long_link)
    rest = ByteRange(PROBE, 32 * MB)
    pool.reading(slow, True)  # type: ignore[arg-type]
    assert len(cut(rest, slow, pool)) > 1  # type: ignore[arg-type]
    # other GETs of the window read as fast together: the process or the server is the limit
    others = [_Measured(0.03, FAST_CONNECTION / 2), _Measured(0.03, FAST_CONNECTION / 2)]
    for other in others:
        pool.reading(other, True)  # type: ignore[arg-type]
    assert cut(rest, slow, pool) == [rest]  # type: ignore[arg-type]
    for other in others:
        pool.reading(other, False)  # type: ignore[arg-type]
    assert len(cut(rest, slow, pool)) > 1  # type: ignore[arg-type]


def test_read_pool_refuses_no_threads_and_pickles_as_its_size():
    import pickle

    with pytest.raises(UsageError):
        ReadPool(0)
    pool = ReadPool(3)
    pool.submit(int).result()
    assert pickle.loads(pickle.dumps(pool)).threads == 3
    pool.close()


class RangeRecorder(WanProxy):
    """A WAN proxy that records the Range of each GET of ``blob``, in order."""

    def __init__(self, upstream: str, **shape: float) -> None:
        super().__init__(upstream, **shape)
        self.ranges: list[str] = []

    def respond(self, handler, body: bytes) -> int:  # type: ignore[no-untyped-def]
        if handler.command == "GET" and handler.path.split("?")[0].endswith("/blob"):
            with self._lock:
                self.ranges.append(handler.headers.get("Range", ""))
        return super().respond(handler, body)


def _blob(s3, size: int) -> tuple[str, dict, bytes]:  # type: ignore[no-untyped-def]
    base, options = s3
    data = os.urandom(size)
    Storage(base + "/o", options).write("blob", data)
    return base + "/o", options, data


def _read_through(proxy, url: str, options: dict, rng, size: int, **retry: float):  # type: ignore[no-untyped-def]
    storage = Storage(url, dict(options, endpoint_url=proxy.endpoint), retry=RetryPolicy(**retry))
    pool = ReadPool(8)
    try:
        return bytes(storage.read_parts("blob", rng, expect=Expected(size), pool=pool))
    finally:
        pool.close()
        storage.close()


@pytest.mark.s3
def test_a_long_read_on_a_fast_connection_is_one_get(s3, moto_server, monkeypatch):
    from shardstream.storage import cuts

    # moto copies the whole object for every GET: parts cut up front multiplied its work.
    # Every connection counts as fast here (how fast loopback is depends on the machine's load).
    monkeypatch.setattr(cuts, "FAST_CONNECTION", 0)
    url, options, data = _blob(s3, 12 * MB + 5)
    with RangeRecorder(moto_server.endpoint, latency=0, bandwidth=0) as proxy:
        whole = _read_through(proxy, url, options, None, len(data))
        ranged = _read_through(proxy, url, options, ByteRange(1000, 9 * MB), len(data))
    assert whole == data
    assert ranged == data[1000 : 9 * MB]
    assert proxy.ranges == ["", f"bytes=1000-{9 * MB - 1}"]  # a plain GET of the whole object


@pytest.mark.s3
def test_a_long_read_on_a_slow_connection_is_cut_into_parts_that_tile_it(s3, moto_server, monkeypatch):
    from shardstream.storage import cuts

    # Every rate counts as slow: bytes that waited in the socket's buffers can make even a
    # capped connection look fast for a while, and this test must not depend on timing.
    monkeypatch.setattr(cuts, "FAST_CONNECTION", float("inf"))
    monkeypatch.setattr(cuts, "PART_LATENCIES", 0)  # parts of PART_MIN, however long the latency
    url, options, data = _blob(s3, 6 * MB + 7)
    with RangeRecorder(moto_server.endpoint, latency=0.01, bandwidth=8 * MB) as proxy:
        got = _read_through(proxy, url, options, None, len(data))
    assert got == data
    first, *parts = proxy.ranges
    assert first == ""
    assert parts
    spans = sorted(tuple(map(int, r.removeprefix("bytes=").split("-"))) for r in parts)
    assert spans[-1][1] == len(data) - 1
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(spans))
    assert spans[0][0] >= PROBE  # the probe's bytes are never asked for again


@pytest.mark.s3
def test_a_read_is_cut_into_parts_that_last_their_latencies_or_not_at_all(s3, moto_server, monkeypatch):
    from shardstream.storage import cuts

    # A slow connection, but parts that would each last a fraction of the latency: the
    # GET reads on (moto served this 12 MiB read as 2 GETs, each copying the object).
    monkeypatch.setattr(cuts, "FAST_CONNECTION", float("inf"))
    monkeypatch.setattr(cuts, "PART_LATENCIES", 1e9)
    url, options, data = _blob(s3, 12 * MB + 5)
    with RangeRecorder(moto_server.endpoint, latency=0.01, bandwidth=0) as proxy:
        assert _read_through(proxy, url, options, None, len(data)) == data
    assert proxy.ranges == [""]
    # Cut, it is cut into at most PARTS parts, however long each is (6 of 8 MiB before).
    monkeypatch.setattr(cuts, "PART_LATENCIES", 0)
    url, options, data = _blob(s3, 45 * MB)
    with RangeRecorder(moto_server.endpoint, latency=0.01, bandwidth=0) as proxy:
        assert _read_through(proxy, url, options, None, len(data)) == data
    assert len(proxy.ranges) == cuts.PARTS  # the first GET (its probe and the first part), and the rest


@pytest.mark.s3
def test_parts_keep_at_most_gets_in_flight(s3, moto_server, monkeypatch):
    from shardstream.storage import cuts

    monkeypatch.setattr(cuts, "FAST_CONNECTION", float("inf"))  # every connection slow,
    monkeypatch.setattr(cuts, "PART_LATENCIES", 0)  # every part worth its latency
    url, options, data = _blob(s3, 12 * MB + 5)
    storage = Storage(url, options)
    pool = ReadPool(8)
    try:
        for limit, gets in ((1, 1), (2, 2), (3, 3)):  # the read alone: it is 1 GET in flight
            monkeypatch.setattr(cuts, "GETS_IN_FLIGHT", limit)
            with RangeRecorder(moto_server.endpoint, latency=0, bandwidth=0) as proxy:
                storage = Storage(url, dict(options, endpoint_url=proxy.endpoint))
                got = bytes(storage.read_parts("blob", None, expect=Expected(len(data)), pool=pool))
                storage.close()
            assert got == data
            assert len(proxy.ranges) == gets
            assert pool.gets == 0  # every GET counted out again
        pool.count_gets(1)  # another long read of the worker's in flight: no room for a part
        monkeypatch.setattr(cuts, "GETS_IN_FLIGHT", 2)
        with RangeRecorder(moto_server.endpoint, latency=0, bandwidth=0) as proxy:
            storage = Storage(url, dict(options, endpoint_url=proxy.endpoint))
            assert bytes(storage.read_parts("blob", None, expect=Expected(len(data)), pool=pool)) == data
            storage.close()
        assert proxy.ranges == [""]
        assert pool.gets == 1
    finally:
        pool.close()


@pytest.mark.s3
def test_a_read_cut_short_asks_again_for_the_rest_only(s3, moto_server, monkeypatch):
    from shardstream.storage import cuts

    monkeypatch.setattr(cuts, "FAST_CONNECTION", 0)  # never cut into parts: one GET and its retries
    url, options, data = _blob(s3, 5 * MB + 12345)
    # every new request is cut off halfway (the same one asked again goes through)
    with FaultProxy(
        moto_server.endpoint, seed=3, error_rate=0, reset_rate=0, truncate_rate=1, max_faults_in_a_row=1
    ) as proxy:
        got = _read_through(proxy, url, options, None, len(data), attempts=20, base_delay=0.001)
    assert got == data
    asked = [rng for (_, path, rng), n in proxy._seen.items() for _ in range(n) if path.endswith("/blob")]
    assert asked[0] == ""
    assert len(asked) > 2
    starts = [int(r.removeprefix("bytes=").split("-")[0]) for r in asked[1:]]
    assert starts == sorted(starts)
    assert starts[0] > 0
    assert all(r.endswith(f"-{len(data) - 1}") for r in asked[1:])


@pytest.mark.s3
def test_parts_are_byte_identical_when_requests_fail(s3, moto_server, monkeypatch):
    from shardstream.storage import cuts

    monkeypatch.setattr(cuts, "FAST_CONNECTION", float("inf"))  # every long read is cut,
    monkeypatch.setattr(cuts, "PART_LATENCIES", 0)  # into parts of PART_MIN
    url, options, data = _blob(s3, 5 * MB + 12345)
    # 9 in 10 new requests fail (a request meets at most 4 faults): 20 tries are plenty
    with FaultProxy(moto_server.endpoint, seed=3, error_rate=0.5, reset_rate=0.2, truncate_rate=0.2) as proxy:
        retry = {"attempts": 20, "base_delay": 0.001, "max_delay": 0.01}
        whole = _read_through(proxy, url, options, None, len(data), **retry)
        ranged = _read_through(proxy, url, options, ByteRange(1000, 5 * MB), len(data), **retry)
    assert whole == data
    assert ranged == data[1000 : 5 * MB]
    assert proxy.faults() > 0
    assert len(proxy._seen) >= 2 + 2 * 2  # two probes and their parts (and retries of the rest)


# -- the budget ---------------------------------------------------------------------------


def test_budget_hands_out_bytes_in_ticket_order_and_close_wakes_waiters():
    budget = ReadBudget(100)
    budget.take(0, 60)
    budget.fetched(0)
    budget.take(1, 60)  # over the limit, but only one other window holds bytes, all in
    order: list[int] = []

    def late(ticket: int, size: int) -> None:
        try:
            budget.take(ticket, size)
            order.append(ticket)
        except BudgetClosed:
            order.append(-ticket)

    threads = [threading.Thread(target=late, args=(3, 10)), threading.Thread(target=late, args=(2, 10))]
    for thread in threads:
        thread.start()
    budget.give_back(0)  # 60 held by one window: ticket 2 fits (70), then 3 (80)
    threads[1].join(5)
    threads[0].join(5)
    assert order == [2, 3]
    waiter = threading.Thread(target=late, args=(4, 1000))
    waiter.start()
    budget.close()
    waiter.join(5)
    assert order == [2, 3, -4]
    assert budget.peak == 120


def test_a_fetch_that_fails_before_taking_gives_back_its_turn():
    budget = ReadBudget(100)
    second = threading.Thread(target=budget.take, args=(1, 10))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # ticket 0's turn
    budget.give_back(0)  # its fetch failed before it took anything
    second.join(5)
    assert not second.is_alive()
    assert budget.held == 10
    assert budget._windows == 1


def test_a_window_over_the_room_left_waits_until_most_of_the_one_before_is_in():
    # NOTE [ Read budget ]: beside a window still arriving, one that does not fit goes
    # once at most half the budget of the other is still to come, not before.
    budget = ReadBudget(100)
    budget.take(0, 80)
    went = threading.Event()
    second = threading.Thread(target=lambda: (budget.take(1, 80), went.set()))
    second.start()
    budget.arrived(0, 20)
    assert not went.wait(0.2)  # 60 still to come
    budget.arrived(0, 15)  # 45: at most half of 100
    assert went.wait(5)
    second.join(5)
    budget.fetched(1)  # all of window 1 in: a third may not go beside two windows
    third = threading.Thread(target=lambda: budget.take(2, 80))
    third.start()
    third.join(0.2)
    assert third.is_alive()
    budget.give_back(0)  # one window left, all of it in
    third.join(5)
    assert not third.is_alive()
    assert budget.held == 160
    assert budget.peak == 160


@pytest.mark.s3
def test_the_window_being_taken_keeps_its_share_until_the_next_is_asked_for(s3):
    # A slow caller holds a window's samples (about its bytes) while later windows are
    # fetched: with them, at most two windows, as the reader before issue 9 held.
    base, options = s3
    _pack(base + "/ds", options, shards=6, samples=10, size=64 * 1024)
    storage = Storage(base + "/ds", options)
    # shuffled, so each window is read whole (NOTE [ Unshuffled windows in pieces ])
    dataset = shardstream.StreamingDataset(
        base + "/ds", storage_options=options, shuffle=True, seed=3, shuffle_window=5
    )
    plan = dataset.make_plan(num_workers=1, consume=False)
    reader = WindowReader(storage, storage.read_manifest(), read_budget=1, read_concurrency=4)
    assert reader.budget is not None
    windows = 0
    for _, samples, _ in reader.stream(plan.worker_windows(0, 0)):
        windows += 1
        time.sleep(0.3)  # the fetches ahead go as far as the budget lets them
        assert reader.budget._windows <= 2
        assert reader.budget.held >= sum(len(s["bin"]) for s in samples)
    assert windows == 12
    assert reader.budget.held == 0
    storage.close()


@pytest.mark.s3
def test_a_window_larger_than_the_budget_is_not_read_beside_one_still_arriving(s3, monkeypatch):
    # Windows of 5 samples of 64 KiB (one read each) and a budget of 200 KiB: each window
    # goes beside the one before only once at most 100 KiB of it is still to come, here
    # once its read is done. It used to go at once: two windows arriving together, with a
    # caller faster than the wire both in memory (NOTE [ Read budget ]).
    from shardstream.dataset.fetch import ByteFetcher

    base, options = s3
    payloads = _pack(base + "/ds", options, shards=6, samples=10, size=64 * 1024)
    storage = Storage(base + "/ds", options)
    # shuffled, so each window is read whole (NOTE [ Unshuffled windows in pieces ])
    dataset = shardstream.StreamingDataset(
        base + "/ds", storage_options=options, shuffle=True, seed=3, shuffle_window=5
    )
    plan = dataset.make_plan(num_workers=1, consume=False)
    reader = WindowReader(storage, storage.read_manifest(), read_budget=200 * 1024, read_concurrency=4)
    spans: list[tuple[float, float]] = []
    read = ByteFetcher.read

    def slow_read(self, path, rng):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        time.sleep(0.1)  # a slow wire: the next window's fetch has time to start beside it
        data = read(self, path, rng)
        if path.endswith(".tar"):
            spans.append((started, time.monotonic()))
        return data

    monkeypatch.setattr(ByteFetcher, "read", slow_read)
    got = {}
    for _, samples, _ in reader.stream(plan.worker_windows(0, 0)):
        got.update((s["__key__"], s["bin"]) for s in samples)
    assert got == payloads
    spans.sort()
    assert len(spans) == 12  # a read per window
    overlaps = [b for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    assert not overlaps
    assert reader.budget is not None
    assert reader.budget.held == 0
    storage.close()


@pytest.mark.s3
def test_windows_fetched_ahead_stay_within_the_budget(s3):
    base, options = s3
    payloads = _pack(base + "/ds", options, shards=6, samples=10, size=64 * 1024)
    storage = Storage(base + "/ds", options)
    manifest = storage.read_manifest()
    # shuffled, so each window is read whole (NOTE [ Unshuffled windows in pieces ])
    dataset = shardstream.StreamingDataset(
        base + "/ds", storage_options=options, shuffle=True, seed=3, shuffle_window=5
    )
    plan = dataset.make_plan(num_workers=1, consume=False)
    budget = 300 * 1024  # about half a window of 10 samples
    reader = WindowReader(storage, manifest, read_budget=budget, read_concurrency=4)
    got = {}
    for _, samples, _ in reader.stream(plan.worker_windows(0, 0)):
        got.update((s["__key__"], s["bin"]) for s in samples)
    assert got == payloads
    assert reader.budget is not None
    largest = reader.budget.largest  # a window's reads: its samples grown to whole check blocks
    assert 0 < largest < 2 * budget
    assert 0 < reader.budget.peak <= max(budget, 2 * largest)
    assert reader.budget.held == 0
    serial = WindowReader(storage, manifest, read_concurrency=1)  # reads as before issue 9
    assert serial.budget is None
    assert serial.bytes._pool is None
    storage.close()


def _shard(samples: int, size: int) -> ShardInfo:
    return ShardInfo(path="s.tar", samples=samples, bytes=samples * size, sha256="", index="s.idx")


def test_an_unshuffled_window_is_taken_in_pieces_of_at_most_the_limit_with_shards_kept_whole():
    shards = [_shard(30, MB)] * 3 + [_shard(100, MB)]
    runs = [Run(0, 5, 30), Run(1, 0, 30), Run(2, 0, 30), Run(3, 0, 100)]
    window = Window(runs, np.arange(sum(map(len, runs))), in_run_order=True)
    pieces = list(in_pieces(iter([window]), shards, 32 * MB))
    assert [piece.runs for piece in pieces] == [
        (Run(0, 5, 30),),  # 25 MB: the next shard does not fit beside it, and is not cut to
        (Run(1, 0, 30),),
        (Run(2, 0, 30),),
        (Run(3, 0, 25),),  # a shard longer than the limit alone: cut evenly
        (Run(3, 25, 50),),
        (Run(3, 50, 75),),
        (Run(3, 75, 100),),
    ]
    assert all(piece.in_run_order and list(piece.order) == list(range(len(piece))) for piece in pieces)
    assert [len(piece) for piece in in_pieces(iter([window]), shards, 1)] == [1] * len(window)
    # a piece of less than half the limit joins the one before it (or the first the next)
    tail = Window([Run(0, 0, 30), Run(1, 0, 30), Run(2, 0, 15)], np.arange(75), in_run_order=True)
    assert [piece.runs for piece in in_pieces(iter([tail]), shards, 64 * MB)] == [tail.runs]
    head = Window([Run(0, 20, 30), Run(1, 0, 30), Run(2, 0, 30)], np.arange(70), in_run_order=True)
    assert [piece.runs for piece in in_pieces(iter([head]), shards, 32 * MB)] == [
        (Run(0, 20, 30), Run(1, 0, 30)),
        (Run(2, 0, 30),),
    ]
    # a window that fits, a shuffled one and one whose runs the plan does not know up front pass as they are
    small = Window([Run(0, 0, 10), Run(1, 0, 10)], np.arange(20), in_run_order=True)
    shuffled = Window(runs, np.arange(len(window))[::-1].copy())
    resumed = Window.lazy((0,), lambda: ((Run(0, 0, 30),), np.arange(30)), in_run_order=True)
    assert [
        w is v
        for w, v in zip(
            in_pieces(iter([small, shuffled, resumed]), shards, 32 * MB),
            [small, shuffled, resumed],
            strict=True,
        )
    ] == [True] * 3


def test_an_iterations_first_piece_begins_with_a_short_head():
    shards = [_shard(32, MB)] * 3
    limit = 32 * MB
    first = Window([Run(0, 0, 32), Run(1, 0, 32)], np.arange(64), in_run_order=True)
    later = Window([Run(2, 0, 32)], np.arange(32), in_run_order=True)
    pieces = [piece.runs for piece in in_pieces(iter([first, later]), shards, limit, head=True)]
    share = max(1, limit // FIRST_PIECE_SHARE // MB)  # samples of a MB in the head (one at least)
    assert pieces == [(Run(0, 0, share),), (Run(0, share, 32),), (Run(1, 0, 32),), (Run(2, 0, 32),)]
    # a first window of one piece has its head too; one not in run order passes as it is
    small = Window([Run(0, 0, 10), Run(1, 0, 10)], np.arange(20), in_run_order=True)
    assert [piece.runs for piece in in_pieces(iter([small]), shards, limit, head=True)] == [
        (Run(0, 0, share),),
        (Run(0, share, 10), Run(1, 0, 10)),
    ]
    shuffled = Window(first.runs, np.arange(64)[::-1].copy())
    assert next(in_pieces(iter([shuffled, later]), shards, limit, head=True)) is shuffled


@pytest.mark.s3
def test_an_unshuffled_window_larger_than_the_budget_streams_in_pieces_exactly(s3, moto_server):
    # Windows of 3 shards (the default 4, evened out over 6) and a budget of as many pieces
    # as it holds (PIECES_IN_BUDGET), each of a shard and a byte: each shard is a piece of
    # its own, one plain GET (the first shard two ranged ones: the iteration's first piece
    # begins with a short head), and the pieces held stay within the budget.
    base, options = s3
    payloads = _pack(base + "/ds", options, shards=6, samples=10, size=64 * 1024)
    shard_bytes = max(info.bytes for info in Storage(base + "/ds", options).read_manifest().shards)
    budget = PIECES_IN_BUDGET * (shard_bytes + 1)
    with Recorder(moto_server.endpoint) as proxy:
        through = dict(options, endpoint_url=proxy.endpoint)
        storage = Storage(base + "/ds", through)
        dataset = shardstream.StreamingDataset(
            base + "/ds", storage_options=through, shuffle=False, read_budget=budget
        )
        plan = dataset.make_plan(num_workers=1, consume=False)
        assert len(list(plan.worker_windows(0, 0))) == 2
        reader = WindowReader(storage, storage.read_manifest(), read_budget=budget, read_concurrency=4)
        taken, keys = 0, []
        for window, samples, _ in reader.stream(plan.worker_windows(0, 0)):
            taken += 1
            assert len({run.shard for run in window.runs}) == 1
            keys += [s["__key__"] for s in samples]
        assert reader.budget is not None
        assert 0 < reader.budget.peak <= budget
        assert reader.budget.held == 0
        gets = proxy.shard_gets()
        storage.close()
        # the same samples through the dataset, stopped inside a piece and resumed
        dataset.storage.close()
        head, resumed = _stopped_and_resumed(base + "/ds", through, 15, read_budget=budget)
        rest = [s["__key__"] for s in resumed]
        resumed.storage.close()
    assert taken == 7  # the first piece begins with a short one: its head
    assert keys == sorted(payloads) == head + rest  # manifest order, every sample once
    # each shard in one plain GET, once, but the first: its head, then its rest
    assert [path for path, rng in gets if rng] == ["shard-000000.tar"] * 2
    assert sorted(path for path, rng in gets if not rng) == [f"shard-00000{i}.tar" for i in range(1, 6)]


@pytest.mark.s3
def test_an_unshuffled_window_resumed_part_way_streams_in_pieces_within_the_budget(s3):
    # Windows of 3 shards, resumed inside the first shard: the rest of that window is
    # still taken in pieces (about a shard each), not the rest of three shards at once.
    base, options = s3
    payloads = _pack(base + "/ds", options, shards=6, samples=10, size=64 * 1024)
    storage = Storage(base + "/ds", options)
    manifest = storage.read_manifest()
    budget = PIECES_IN_BUDGET * (max(info.bytes for info in manifest.shards) + 1)
    head, resumed = _stopped_and_resumed(base + "/ds", options, 5)
    windows = list(resumed.make_plan(num_workers=1, consume=False).worker_windows(0, 0))
    assert windows[0].known_runs is not None  # its runs known up front: it can be taken in pieces
    assert sum(map(len, windows[0].known_runs)) == 25
    reader = WindowReader(storage, manifest, read_budget=budget, read_concurrency=4)
    pieces, keys = [], []
    for window, samples, _ in reader.stream(iter(windows)):
        pieces.append(window.runs)
        keys += [s["__key__"] for s in samples]
    assert reader.budget is not None
    assert 0 < reader.budget.peak <= budget
    storage.close()
    resumed.storage.close()
    assert head + keys == sorted(payloads)
    # the iteration's short head, then the rest of shard 0 (half a piece) with shard 1,
    # then a piece a shard
    assert pieces == [
        (Run(0, 5, 6),),
        (Run(0, 6, 10), Run(1, 0, 10)),
        *((Run(shard, 0, 10),) for shard in range(2, 6)),
    ]


def test_read_options_are_checked():
    with pytest.raises(UsageError, match="read_budget"):
        shardstream.StreamingDataset("/nowhere", read_budget=0)
    with pytest.raises(UsageError, match="read_concurrency"):
        shardstream.StreamingDataset("/nowhere", read_concurrency=True)


# -- an epoch through the WAN proxy, the cache ---------------------------------------------


@pytest.mark.s3
def test_an_epoch_through_the_wan_proxy_is_exact_with_requests_in_flight(s3, moto_server):
    base, options = s3
    payloads = _pack(base + "/ds", options, shards=4, samples=8, size=256 * 1024)
    with WanProxy(moto_server.endpoint, latency=0.01, bandwidth=50 * MB) as proxy:
        dataset = shardstream.StreamingDataset(
            base + "/ds", storage_options=dict(options, endpoint_url=proxy.endpoint), shuffle=True, seed=1
        )
        proxy.reset_stats()
        got = [(s["__key__"], s["bin"]) for s in dataset]
        dataset.storage.close()
    assert sorted(got) == sorted(payloads.items())
    assert proxy.stats.peak_in_flight >= 2


def _cached_through(
    proxy: Recorder, url: str, options: dict, cache: os.PathLike
) -> shardstream.StreamingDataset:
    """``url`` unshuffled, read through ``proxy`` into the cache at ``cache``."""
    return shardstream.StreamingDataset(
        url, storage_options=dict(options, endpoint_url=proxy.endpoint), shuffle=False, cache_dir=str(cache)
    )


@pytest.mark.s3
def test_the_cache_is_filled_on_the_cold_epoch_and_read_on_the_warm_one(
    s3, moto_server, tmp_path, monkeypatch
):
    from shardstream.storage import cuts

    monkeypatch.setattr(cuts, "FAST_CONNECTION", 0)  # a fast connection, whatever the machine's load
    base, options = s3
    payloads = _pack(base + "/ds", options, shards=3, samples=10, size=300 * 1024)
    with Recorder(moto_server.endpoint) as proxy:
        dataset = _cached_through(proxy, base + "/ds", options, tmp_path / "cache")
        cold = {s["__key__"]: s["bin"] for s in dataset}
        cold_gets = proxy.shard_gets()
        proxy.gets.clear()
        dataset.set_epoch(1)
        warm = {s["__key__"]: s["bin"] for s in dataset}
        dataset.storage.close()
    assert cold == warm == payloads
    assert len({name for name, _ in cold_gets}) == 3
    assert sorted(rng for _, rng in cold_gets) == [""] * 3  # each in one plain GET
    assert proxy.shard_gets() == []  # the warm epoch asked the store for no shard bytes
    entries = [n for n in os.listdir(tmp_path / "cache") if n.startswith("sscache-") and "." not in n]
    assert len(entries) == 6  # 3 shards and their sidecars
    assert not [n for n in os.listdir(tmp_path / "cache") if n.startswith(".sscache-tmp")]


@pytest.mark.s3
def test_a_cache_fill_of_a_whole_shard_read_with_its_sidecar_is_cut_into_parts(
    s3, moto_server, tmp_path, monkeypatch
):
    # A window of whole shards GETs them beside their sidecars (NOTE [ Whole shards at
    # once ]); with cache_dir that read fills the entry, in parts where the wire is slow,
    # as any other fill (it went to Storage.read, which has no pool: one GET per shard)
    from shardstream.storage import cuts

    monkeypatch.setattr(cuts, "FAST_CONNECTION", float("inf"))  # every rate counts as slow
    monkeypatch.setattr(cuts, "PART_LATENCIES", 0)  # parts of PART_MIN, however long the latency
    base, options = s3
    payloads = _pack(base + "/ds", options, shards=2, samples=3, size=2 * MB)
    with Recorder(moto_server.endpoint) as proxy:
        dataset = _cached_through(proxy, base + "/ds", options, tmp_path / "cache")
        got = {s["__key__"]: s["bin"] for s in dataset}
        dataset.storage.close()
    assert got == payloads
    ranges = [rng for _, rng in proxy.shard_gets()]
    assert sorted(ranges)[:2] == ["", ""]  # each shard's first GET, whole
    assert len(ranges) > 2  # and parts beside them


@pytest.mark.s3
@pytest.mark.parametrize("cut", [False, True])
def test_a_cache_fill_hashes_the_bytes_as_they_pass_and_reads_nothing_back(s3, tmp_path, monkeypatch, cut):
    import builtins

    from shardstream.storage import cuts

    if cut:  # parts that may complete out of order, each hashed in its turn
        monkeypatch.setattr(cuts, "FAST_CONNECTION", float("inf"))
        monkeypatch.setattr(cuts, "PART_LATENCIES", 0)
    url, options, data = _blob(s3, 6 * MB + 3)
    read_back: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if ".sscache-tmp-" in str(file) and ("r" in mode or "+" in mode):
            read_back.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    def spy_os_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if ".sscache-tmp-" in str(path) and flags & os.O_ACCMODE != os.O_WRONLY:
            read_back.append(str(path))
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    pool = ReadPool(4)
    good = Storage(url, options, cache_dir=str(tmp_path / "good"))
    bad = Storage(url, options, cache_dir=str(tmp_path / "bad"))
    try:
        expect = Expected(len(data), hashlib.sha256(data).hexdigest())
        assert bytes(good.map("blob", ByteRange(0, len(data)), expect=expect, pool=pool)) == data
        with pytest.raises(StorageError, match="its sha256 is"):  # a wrong hash is still caught
            bad.map("blob", ByteRange(0, 10), expect=Expected(len(data), "0" * 64), pool=pool)
    finally:
        pool.close()
        good.close()
        bad.close()
    assert read_back == []  # the sha256 was taken on the way, not from the file afterwards
    assert not [
        n
        for n in os.listdir(tmp_path / "bad")
        if n.startswith(("sscache-", ".sscache-tmp")) and "." not in n[1:]
    ]


def _epoch_keys(url: str, options: dict, cache_dir: str, queue) -> None:  # type: ignore[no-untyped-def]
    dataset = shardstream.StreamingDataset(url, storage_options=options, shuffle=False, cache_dir=cache_dir)
    queue.put(sorted(hashlib.sha256(s["bin"]).hexdigest() for s in dataset))
    dataset.storage.close()


@pytest.mark.s3
def test_processes_sharing_a_cache_dir_each_read_exactly(s3, tmp_path):
    base, options = s3
    payloads = _pack(base + "/ds", options, shards=3, samples=6, size=200 * 1024)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    cache_dir = str(tmp_path / "cache")
    processes = [
        context.Process(target=_epoch_keys, args=(base + "/ds", options, cache_dir, queue)) for _ in range(3)
    ]
    for process in processes:
        process.start()
    results = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
    queue.close()
    queue.join_thread()
    expected = sorted(hashlib.sha256(p).hexdigest() for p in payloads.values())
    assert results == [expected] * 3
    assert all(process.exitcode == 0 for process in processes)


@pytest.mark.s3
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_concurrently_after_the_parent_did(s3, context):
    base, options = s3
    payloads = _pack(base + "/ds", options, shards=4, samples=5, size=400 * 1024)
    dataset = shardstream.StreamingDataset(base + "/ds", storage_options=options, shuffle=False)
    assert sum(1 for _ in dataset) == 20  # the parent made its read pools and clients first
    loader = shardstream.DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context=context, collate_fn=None
    )
    got = {s["__key__"]: s["bin"] for s in loader}
    assert got == payloads
    dataset.storage.close()


# -- small samples -------------------------------------------------------------------------


def test_pack_says_when_tar_members_are_small_and_names_parquet(tmp_path):
    from shardstream.pack.api import advise_format, pack

    source = tmp_path / "src"
    source.mkdir()
    for i in range(50):
        (source / f"{i:04d}.txt").write_bytes(b"x" * 250)
        (source / f"{i:04d}.cls").write_bytes(b"%d" % (i % 3))
    small = pack(str(source), str(tmp_path / "tar"), format="tar", workers=1)
    assert "--format parquet" in (advise_format(small) or "")
    big = tmp_path / "big"
    big.mkdir()
    for i in range(5):
        (big / f"{i:04d}.bin").write_bytes(os.urandom(20000))
    assert advise_format(pack(str(big), str(tmp_path / "tar-big"), format="tar", workers=1)) is None
    parquet = pack(str(source), str(tmp_path / "pq"), format="parquet", workers=1)
    assert advise_format(parquet) is None


@pytest.mark.parametrize("summed_by", ["sha256", "crc32"])
def test_a_cache_fill_sums_pieces_in_order_and_uses_their_buffers_again(tmp_path, summed_by):
    from shardstream.storage.cached import _Crc32, _FileSink
    from shardstream.storage.cuts import CHUNK

    data = os.urandom(3 * CHUNK + 100)
    pieces = [ByteRange(start, min(start + CHUNK, len(data))) for start in range(0, len(data), CHUNK)]
    fd = os.open(tmp_path / "entry", os.O_WRONLY | os.O_CREAT)
    summing = hashlib.sha256() if summed_by == "sha256" else _Crc32()
    sink = _FileSink(fd, summing=summing, disk_error=lambda error, url: StorageError(str(error)), url="u")
    buffers = []
    for piece in [pieces[1], pieces[0], pieces[3], pieces[2]]:  # out of order, as parts arrive
        view = sink.view(piece)
        view[:] = data[piece.start : piece.end]
        buffers.append(view.obj)
        sink.done(piece, view)
    os.close(fd)
    assert (tmp_path / "entry").read_bytes() == data
    if isinstance(summing, _Crc32):
        assert summing.value == zlib.crc32(data)
    else:
        assert summing.hexdigest() == hashlib.sha256(data).hexdigest()
    # pieces 1 and 0 were summed once 0 came: piece 3 took one of their buffers, not new memory
    assert any(buffers[2] is b for b in buffers[:2])


EXIT_HOLDING_AN_ITERATOR = """
import json, sys
import shardstream

def main():
    url, options = sys.argv[1], json.loads(sys.argv[2])
    dataset = shardstream.StreamingDataset(url, storage_options=options, decode=False, read_budget=1)
    global batches  # held to the end: the script exits with fetches waiting for room
    batches = iter(shardstream.DataLoader(dataset, batch_size=4, num_workers=0))
    next(batches)
    print("one batch", flush=True)

if __name__ == "__main__":
    main()
"""


def test_a_process_exits_while_its_stream_waits_for_room(s3, tmp_path):
    # The fetches ahead waited for a share of the budget that nobody gave back, and the
    # interpreter joins their threads at exit: the script hung there (NOTE [ Read budget ]).
    base, options = s3
    _pack(base + "/ds", options, shards=40, samples=10, size=16 * 1024)  # 10 windows
    script = tmp_path / "exit.py"
    script.write_text(EXIT_HOLDING_AN_ITERATOR)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, str(script), base + "/ds", json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=60,  # a hang fails here; the exit itself takes about a second
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "one batch"
    assert "Exception ignored" not in done.stderr
