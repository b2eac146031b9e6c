"""NOTE [ Reads in parts ] in storage/cuts.py: once a GET of a pool carried
FAST_CONNECTION since its headers, over FAST_PROOF bytes, the pool cuts no more reads."""

from __future__ import annotations

import os

import pytest

from shardstream.storage import Storage
from shardstream.storage.cuts import PROBE, cut
from shardstream.storage.expect import Expected
from shardstream.storage.read_pool import ReadPool
from shardstream.types import ByteRange

MB = 2**20


class _Stream:
    """A stream as ``cuts.cut`` sees it: a latency and a rate."""

    def __init__(self, rate: float) -> None:
        self.latency, self._rate = 0.03, rate

    def rate(self) -> float:
        return self._rate


def test_a_pool_whose_get_carried_a_fast_rate_cuts_no_more_reads():
    pool = ReadPool(8)
    rest = ByteRange(PROBE, 32 * MB)
    slow = _Stream(40e6)
    assert len(cut(rest, slow, pool)) > 1  # type: ignore[arg-type]
    assert not pool.fast
    # once a GET of it carried FAST_CONNECTION since its headers (read_long tells it so),
    # later slow ones are slowed by CPU, not the wire
    pool.proven_fast()
    assert pool.fast
    assert cut(rest, slow, pool) == [rest]  # type: ignore[arg-type]
    pool.close()


@pytest.mark.s3
def test_a_pool_is_proven_fast_only_by_a_get_that_carried_it(s3, moto_server, monkeypatch):
    from shardstream.storage import cuts

    # every connection counts as fast (none proven on a loaded machine otherwise), then none
    url, options, data = _blob(s3, 12 * MB + 5)
    for fast, proven in ((0, True), (float("inf"), False)):
        monkeypatch.setattr(cuts, "FAST_CONNECTION", fast)
        monkeypatch.setattr(cuts, "PART_LATENCIES", 1e9)  # never cut: the GET reads on, chunk by chunk
        storage, pool = Storage(url, options), ReadPool(4)
        try:
            got = storage.read_parts("blob", ByteRange(0, len(data)), expect=Expected(len(data)), pool=pool)
            assert bytes(got) == data
            assert pool.fast is proven
        finally:
            pool.close()
            storage.close()


def _blob(s3, size: int):  # type: ignore[no-untyped-def]
    base, options = s3
    data = os.urandom(size)
    Storage(base + "/o", options).write("blob", data)
    return base + "/o", options, data


def test_a_stream_carries_a_rate_only_once_it_read_enough(monkeypatch):
    from shardstream.storage import parts

    clock = [100.0]
    monkeypatch.setattr(parts.time, "monotonic", lambda: clock[0])
    stream = parts._Stream(None, "p", ByteRange(0, 64 * MB), None, False, None)  # type: ignore[arg-type]
    stream._opened_at, stream._opened_time = 0, 100.0
    stream.pos = 2 * MB
    clock[0] = 100.01
    assert stream.carried(4 * MB) == 0.0  # too few bytes to tell
    stream.pos = 8 * MB
    clock[0] = 100.02
    assert abs(stream.carried(4 * MB) - 8 * MB / 0.02) < 1
