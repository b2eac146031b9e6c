"""NOTE [ A link's latency before its reads ] in storage/cuts.py: before a pool measured
anything, its storage's time to answer small GETs decides whether a long read is cut up
front."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardstream
from shardstream.dataset.budget import DEFAULT_READ_BUDGET, LONG_LINK_READ_BUDGET, default_read_budget
from shardstream.dataset.mixture_reader import MixtureReader
from shardstream.pack import ShardWriter
from shardstream.storage import Storage, s3read
from shardstream.storage.cuts import (
    LONG_LATENCY,
    PART_LATENCIES,
    PART_MAX,
    PART_MIN,
    PARTS,
    part_bytes,
    planned_parts,
)
from shardstream.storage.expect import Expected
from shardstream.storage.read_pool import ReadPool
from shardstream.storage.s3read import SMALL_ANSWER
from shardstream.testing import WanProxy
from shardstream.types import ByteRange
from tests.test_parts_upfront import _Measured, asked_streams

MB = 2**20


def test_a_late_answering_storage_cuts_a_fresh_pools_first_read_into_parts():
    pool = ReadPool(8)
    rng = ByteRange(0, 12 * MB)
    try:
        parts = planned_parts(rng, pool, LONG_LATENCY * 3)
        assert len(parts) == PARTS
        assert parts[0].start == rng.start
        assert parts[-1].end == rng.end
        assert min(part.length for part in parts) >= PART_MIN
        assert planned_parts(rng, pool, LONG_LATENCY / 10) == [rng]  # loopback: it probes
        assert planned_parts(rng, pool, None) == [rng]  # no GET yet: it probes
        assert planned_parts(ByteRange(0, PART_MIN + 5), pool, 1.0) == [ByteRange(0, PART_MIN + 5)]
        pool.proven_fast()
        assert planned_parts(rng, pool, 1.0) == [rng]
    finally:
        pool.close()


def test_a_long_read_over_a_long_link_has_a_part_per_part_max_and_elsewhere_parts():
    """A shuffled window of large shards is a few long reads: PARTS of each would leave the
    long link's connections half used (NOTE [ Reads in parts ])."""
    pool = ReadPool(16)
    long = ByteRange(0, 12 * PART_MAX)
    try:
        parts = planned_parts(long, pool, LONG_LATENCY)  # nothing measured yet
        assert len(parts) == 12 > PARTS
        assert (parts[0].start, parts[-1].end) == (long.start, long.end)
        assert max(part.length for part in parts) <= PART_MAX
        assert len(planned_parts(ByteRange(0, 3 * PART_MAX), pool, LONG_LATENCY)) == PARTS  # shorter: PARTS
        longest = planned_parts(ByteRange(0, 64 * PART_MAX), pool, LONG_LATENCY)
        assert len(longest) == pool.threads  # no more parts than the pool has threads
        pool.measured(_Measured(0.05, 40e6))  # type: ignore[arg-type]  # a slow link measured
        assert len(planned_parts(long, pool, LONG_LATENCY)) == 12
        assert len(planned_parts(long, pool, LONG_LATENCY / 10)) == PARTS  # a short link: the server's copies
        assert len(planned_parts(long, pool, None)) == PARTS
    finally:
        pool.close()


def test_what_the_pool_measured_goes_before_the_storages_answers():
    pool = ReadPool(8)
    rng = ByteRange(0, 12 * MB)
    try:
        pool.measured(_Measured(0.03, 1e12))  # type: ignore[arg-type]  # its GETs were fast
        assert planned_parts(rng, pool, 1.0) == [rng]
    finally:
        pool.close()


@pytest.mark.s3
def test_the_first_long_read_after_a_small_get_over_a_long_link_asks_for_parts_only(
    s3, moto_server, monkeypatch
):
    base, options = s3
    data = os.urandom(12 * MB + 5)
    Storage(base + "/o", options).write("blob", data)
    Storage(base + "/o", options).write("small", b"x" * 100)
    asked = asked_streams(monkeypatch)
    with WanProxy(moto_server.endpoint, latency=0.06, bandwidth=0) as proxy:
        storage = Storage(base + "/o", dict(options, endpoint_url=proxy.endpoint))
        pool = ReadPool(8)
        try:
            whole = ByteRange(0, len(data))
            assert storage.read("small") == b"x" * 100
            assert storage._io.latency() >= LONG_LATENCY
            got = storage.read_parts("blob", whole, expect=Expected(len(data)), pool=pool)
            assert bytes(got) == data
            assert len(asked) == PARTS  # no probe: every GET asks for one part
            assert None not in asked
            assert whole not in asked
            assert sorted(r.start for r in asked if r)[0] == 0
        finally:
            pool.close()
            storage.close()


def test_a_part_lasts_one_latency_where_small_gets_answer_late_and_two_elsewhere():
    full = 40e6 * 0.05 * PART_LATENCIES
    assert part_bytes(0.05, 40e6, LONG_LATENCY) == full / 2  # the latency is the wire's
    assert part_bytes(0.05, 40e6, LONG_LATENCY / 5) == full  # the server's work on a large object
    assert part_bytes(0.05, 40e6, None) == full
    pool = ReadPool(8)
    try:  # 50 ms at 40 MB/s: parts of 2 MB, so an 8 MiB read takes all PARTS (of 4 MB: 3)
        pool.measured(_Measured(0.05, 40e6))  # type: ignore[arg-type]
        assert len(planned_parts(ByteRange(0, 8 * MB), pool, LONG_LATENCY)) == PARTS
        assert len(planned_parts(ByteRange(0, 8 * MB), pool, None)) == 3
    finally:
        pool.close()


@pytest.mark.s3
def test_only_small_gets_tell_the_links_latency(s3):
    base, options = s3
    storage = Storage(base + "/o", options)
    try:
        storage.write("big", b"x" * (SMALL_ANSWER + 1))
        storage.write("small", b"x")
        storage.read("big")
        assert storage._io.latency() is None  # its time to headers holds the server's work
        storage.read("small")
        assert storage._io.latency() is not None
    finally:
        storage.close()


@pytest.mark.s3
def test_a_small_get_sent_beside_an_open_stream_tells_nothing(s3, monkeypatch):
    """It may wait behind the stream at a busy server (NOTE [ A link's latency before its reads ])."""
    base, options = s3
    monkeypatch.setattr(s3read, "_STREAMING", [])
    storage = Storage(base + "/o", options)
    try:
        storage.write("big", b"x" * (4 * MB))
        storage.write("small", b"x")
        body = storage._io.stream("big", ByteRange(0, 4 * MB), 4 * MB)
        storage.read("small")
        assert storage._io.latency() is None
        body.close()
        storage.read("small")
        assert storage._io.latency() is not None
    finally:
        storage.close()


def test_the_default_read_budget_doubles_where_small_gets_answer_late():
    assert default_read_budget(LONG_LATENCY / 10) == DEFAULT_READ_BUDGET
    assert default_read_budget(None) == DEFAULT_READ_BUDGET
    assert default_read_budget(LONG_LATENCY) == LONG_LINK_READ_BUDGET == 2 * DEFAULT_READ_BUDGET


@pytest.mark.s3
def test_a_reader_over_a_long_link_takes_the_long_links_budget_and_a_given_one_is_kept(s3, moto_server):
    """NOTE [ Read budget ]: a read holds its bytes a round trip longer over a long link."""
    base, options = s3
    url = base + "/ds"
    with ShardWriter(url, format="tar", samples_per_shard=4, storage_options=options) as writer:
        for i in range(8):
            writer.write({"__key__": f"{i:03d}", "bin": b"x" * 100})
    near = shardstream.StreamingDataset(url, storage_options=options)
    assert near.kind.window_reader().budget.limit == DEFAULT_READ_BUDGET  # type: ignore[union-attr]
    with WanProxy(moto_server.endpoint, latency=0.06, bandwidth=0) as proxy:
        far = dict(options, endpoint_url=proxy.endpoint)
        dataset = shardstream.StreamingDataset(url, storage_options=far)  # its manifest's GET answers late
        assert dataset.kind.window_reader().budget.limit == LONG_LINK_READ_BUDGET  # type: ignore[union-attr]
        assert len(list(dataset)) == 8
        given = shardstream.StreamingDataset(url, storage_options=far, read_budget=3 * MB)
        assert given.kind.window_reader().budget.limit == 3 * MB  # type: ignore[union-attr]
        # a mixture's one budget: the largest its streams' readers take, a far stream's here
        readers = [near.kind.window_reader(), dataset.kind.window_reader()]  # type: ignore[union-attr]
        mixed = MixtureReader(readers, np.array([0, 2]), prefetch=1)
        assert mixed.budget is not None
        assert mixed.budget.limit == LONG_LINK_READ_BUDGET
