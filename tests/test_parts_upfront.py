"""NOTE [ Reads in parts ] in storage/parts.py: once a pool measured a slow link, a long read
is cut up front by the same rule, with no probe of its own."""

from __future__ import annotations

import itertools
import os

import pytest

from shardstream.storage import Storage
from shardstream.storage.expect import Expected
from shardstream.storage.parts import PART_MIN, ReadPool, _planned
from shardstream.storage.retried import RetriedIO
from shardstream.types import ByteRange

MB = 2**20


class _Measured:
    """A stream as ``ReadPool.measured`` sees it: a latency and a rate."""

    def __init__(self, latency: float, rate: float) -> None:
        self.latency, self._rate = latency, rate

    def rate(self) -> float:
        return self._rate


def test_a_read_is_cut_up_front_only_once_the_pool_measured_a_slow_link():
    pool = ReadPool(8)
    rng = ByteRange(0, 12 * MB)
    try:
        assert _planned(rng, pool) == [rng]  # nothing measured: the read probes
        pool.measured(_Measured(0.03, 40e6))  # type: ignore[arg-type]
        parts = _planned(rng, pool)
        assert len(parts) > 1
        assert parts[0].start == rng.start
        assert parts[-1].end == rng.end
        assert all(a.end == b.start for a, b in itertools.pairwise(parts))
        assert min(part.length for part in parts) >= PART_MIN
        pool.measured(_Measured(0.03, 1e12))  # type: ignore[arg-type]
        pool.measured(_Measured(0.03, 1e12))  # type: ignore[arg-type]
        assert _planned(rng, pool) == [rng]  # the median link is fast: no cut
        pool.proven_fast()
        assert _planned(rng, pool) == [rng]
    finally:
        pool.close()


def test_a_slow_link_whose_parts_would_not_last_their_latencies_reads_on():
    pool = ReadPool(8)
    try:
        pool.measured(_Measured(5.0, 40e6))  # type: ignore[arg-type]  # a part would be 400 MB
        assert _planned(ByteRange(0, 12 * MB), pool) == [ByteRange(0, 12 * MB)]
    finally:
        pool.close()


@pytest.mark.s3
def test_a_read_cut_up_front_asks_for_its_parts_only_and_gives_every_byte(s3, monkeypatch):
    base, options = s3
    data = os.urandom(12 * MB + 5)
    Storage(base + "/o", options).write("blob", data)
    asked: list[ByteRange | None] = []
    stream = RetriedIO.stream

    def recorded(self, path, rng, size):  # type: ignore[no-untyped-def]
        asked.append(rng)
        return stream(self, path, rng, size)

    monkeypatch.setattr(RetriedIO, "stream", recorded)
    storage, pool = Storage(base + "/o", options), ReadPool(4)
    try:
        pool.measured(_Measured(0.03, 40e6))  # type: ignore[arg-type]
        whole = ByteRange(0, len(data))
        planned = _planned(whole, pool)  # before the read's own GETs are measured
        assert len(planned) > 1
        got = storage.read_parts("blob", whole, expect=Expected(len(data)), pool=pool)
        assert bytes(got) == data
        assert sorted(asked, key=lambda r: r.start if r else -1) == planned
    finally:
        pool.close()
        storage.close()
