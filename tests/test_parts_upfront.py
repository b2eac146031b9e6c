"""NOTE [ Reads in parts ] in storage/cuts.py: once a pool measured a slow link, a long read
is cut up front by the same rule, with no probe of its own."""

from __future__ import annotations

import itertools
import os
import time

import pytest

from shardstream.storage import Storage
from shardstream.storage.cuts import CHUNK, PART_MIN, planned_parts
from shardstream.storage.expect import Expected
from shardstream.storage.parts import _Stream
from shardstream.storage.read_pool import LINK, ReadPool
from shardstream.storage.retried import RetriedIO
from shardstream.types import ByteRange

MB = 2**20


class _Measured:
    """A stream as ``ReadPool.measured`` and ``cuts.cut`` see it: a latency and a rate
    (the other tests of parts take it from here)."""

    def __init__(self, latency: float, rate: float) -> None:
        self.latency, self._rate = latency, rate

    def rate(self) -> float:
        return self._rate


def asked_streams(monkeypatch) -> list[ByteRange | None]:  # type: ignore[no-untyped-def]
    """The range of every GET ``RetriedIO.stream`` sends from now on, in order (the other
    tests of parts take it from here)."""
    asked: list[ByteRange | None] = []
    stream = RetriedIO.stream

    def recorded(self, path, rng, size):  # type: ignore[no-untyped-def]
        asked.append(rng)
        return stream(self, path, rng, size)

    monkeypatch.setattr(RetriedIO, "stream", recorded)
    return asked


def test_a_read_is_cut_up_front_only_once_the_pool_measured_a_slow_link():
    pool = ReadPool(8)
    rng = ByteRange(0, 12 * MB)
    try:
        assert planned_parts(rng, pool) == [rng]  # nothing measured: the read probes
        pool.measured(_Measured(0.03, 40e6))  # type: ignore[arg-type]
        parts = planned_parts(rng, pool)
        assert len(parts) > 1
        assert parts[0].start == rng.start
        assert parts[-1].end == rng.end
        assert all(a.end == b.start for a, b in itertools.pairwise(parts))
        assert min(part.length for part in parts) >= PART_MIN
        pool.measured(_Measured(0.03, 1e12))  # type: ignore[arg-type]
        pool.measured(_Measured(0.03, 1e12))  # type: ignore[arg-type]
        assert planned_parts(rng, pool) == [rng]  # the median link is fast: no cut
        pool.proven_fast()
        assert planned_parts(rng, pool) == [rng]
    finally:
        pool.close()


def test_a_slow_link_whose_parts_would_not_last_their_latencies_reads_on():
    pool = ReadPool(8)
    try:
        pool.measured(_Measured(5.0, 40e6))  # type: ignore[arg-type]  # a part would be 400 MB
        assert planned_parts(ByteRange(0, 12 * MB), pool) == [ByteRange(0, 12 * MB)]
    finally:
        pool.close()


@pytest.mark.s3
def test_a_read_cut_up_front_asks_for_its_parts_only_and_gives_every_byte(s3, monkeypatch):
    base, options = s3
    data = os.urandom(12 * MB + 5)
    Storage(base + "/o", options).write("blob", data)
    asked = asked_streams(monkeypatch)
    storage, pool = Storage(base + "/o", options), ReadPool(4)
    try:
        pool.measured(_Measured(0.03, 40e6))  # type: ignore[arg-type]
        whole = ByteRange(0, len(data))
        planned = planned_parts(whole, pool)  # before the read's own GETs are measured
        assert len(planned) > 1
        got = storage.read_parts("blob", whole, expect=Expected(len(data)), pool=pool)
        assert bytes(got) == data
        assert sorted(asked, key=lambda r: r.start if r else -1) == planned
    finally:
        pool.close()
        storage.close()


def test_a_slow_verdict_is_measured_again_after_reads_that_measured_nothing():
    """Reads cut up front into parts too short to give a rate measure nothing: after LINK of
    them in a row the next read probes, so a link once slow is not taken as slow for good."""
    pool = ReadPool(8)
    rng = ByteRange(0, 12 * MB)
    try:
        pool.measured(_Measured(0.03, 40e6))  # type: ignore[arg-type]
        cut = [len(planned_parts(rng, pool)) > 1 for _ in range(LINK + 1)]
        assert cut == [True] * LINK + [False]  # the last one probes
        pool.measured(_Measured(0.03, 40e6))  # type: ignore[arg-type]  # its probe measured
        assert len(planned_parts(rng, pool)) > 1
    finally:
        pool.close()


class _Body:
    """A GET's body: ``chunks`` of CHUNK bytes, then its end."""

    def __init__(self, chunks: int) -> None:
        self.left = chunks * CHUNK

    def readinto(self, view: memoryview) -> int:
        n = min(len(view), self.left)
        view[:n] = b"x" * n
        self.left -= n
        return n

    def close(self) -> None:
        pass


class _IO:
    def stream(self, path, rng, size):  # type: ignore[no-untyped-def]
        return _Body(-(-rng.length // CHUNK))

    def retry(self, attempt, *args):  # type: ignore[no-untyped-def]
        return attempt()


def test_a_gets_rate_ends_with_its_last_byte_not_when_it_is_asked():
    """A read's first GET is measured after its other parts are in: the time it then waited
    is not its connection's, and must not lower the rate the pool cuts by."""
    stream = _Stream(_IO(), "blob", ByteRange(0, 4 * CHUNK), None, False, None)  # type: ignore[arg-type]
    buffer = bytearray(4 * CHUNK)

    class _Sink:
        def view(self, chunk: ByteRange) -> memoryview:
            return memoryview(buffer)[chunk.start : chunk.end]

        def done(self, chunk: ByteRange, view: memoryview) -> None:
            pass

    stream.read_to(4 * CHUNK, _Sink())  # type: ignore[arg-type]
    rate = stream.rate()
    assert rate is not None
    time.sleep(0.2)  # as if waiting for the read's other parts
    assert stream.rate() == rate
