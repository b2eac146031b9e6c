"""NOTE [ Reads in parts ] in storage/cuts.py: the reads in flight carrying FAST_CONNECTION
together stop the cuts on a short link only. Over a long link (a connection carries at
least PART_MIN bytes per latency) each connection is held by its round trips, so reads are
still cut, by the probe and up front, however much the others carry together."""

from __future__ import annotations

import pytest

from shardstream.storage.cuts import FAST_CONNECTION, PART_MIN, PROBE, cut, long_link, planned_parts
from shardstream.storage.read_pool import ReadPool
from shardstream.types import ByteRange
from tests.test_parts_upfront import _Measured

MB = 2**20


@pytest.fixture
def pool():
    pool = ReadPool(16)
    yield pool
    pool.close()


def _busy(pool: ReadPool, latency: float) -> list[_Measured]:
    """GETs of the pool being read that carry FAST_CONNECTION together, over ``latency``."""
    others = [_Measured(latency, FAST_CONNECTION / 4) for _ in range(5)]
    for other in others:
        pool.reading(other, True)  # type: ignore[arg-type]
    return others


def test_a_link_is_long_where_a_connection_carries_a_part_per_latency():
    assert long_link(0.03, 40e6)  # the WAN proxy's: 30 ms, 40 MB/s a response
    assert long_link(0.05, PART_MIN / 0.05)
    assert not long_link(0.001, 200e6)  # loopback
    assert not long_link(0.05, PART_MIN / 0.05 / 2)


def test_a_probed_read_over_a_long_link_is_cut_while_the_others_carry_a_fast_total(pool):
    slow = _Measured(0.03, 40e6)
    rest = ByteRange(PROBE, 32 * MB)
    _busy(pool, 0.03)
    assert pool.rate() >= FAST_CONNECTION
    parts = cut(rest, slow, pool)  # type: ignore[arg-type]
    assert len(parts) > 1
    assert parts[0].start == rest.start
    assert parts[-1].end == rest.end


def test_a_probed_read_over_a_short_link_is_not_cut_while_the_others_carry_a_fast_total(pool):
    slow = _Measured(0.001, 40e6)
    rest = ByteRange(PROBE, 32 * MB)
    assert len(cut(rest, slow, pool)) > 1  # type: ignore[arg-type]
    _busy(pool, 0.001)
    assert cut(rest, slow, pool) == [rest]  # type: ignore[arg-type]


def test_a_read_over_a_long_link_is_cut_up_front_while_the_others_carry_a_fast_total(pool):
    rng = ByteRange(0, 16 * MB)
    pool.measured(_Measured(0.03, 40e6))  # type: ignore[arg-type]
    _busy(pool, 0.03)
    assert len(planned_parts(rng, pool)) > 1


def test_a_read_over_a_short_link_is_not_cut_up_front_while_the_others_carry_a_fast_total(pool):
    rng = ByteRange(0, 16 * MB)
    pool.measured(_Measured(0.002, 40e6))  # type: ignore[arg-type]
    assert len(planned_parts(rng, pool)) > 1
    _busy(pool, 0.002)
    assert planned_parts(rng, pool) == [rng]
