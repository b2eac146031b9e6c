"""A 503/429 storm with Retry-After (NOTE [ Throttled tries ], NOTE [ Paced start ]): readers
bound to ranks and workers start one epoch together against S3 behind a proxy that
throttles above a request rate; every reader finishes its epoch with exactly its plan's
samples, and no throttle reaches a user."""

from __future__ import annotations

import hashlib
import threading
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

import shardstream
from shardstream.pack import ShardWriter
from shardstream.storage import pacing
from shardstream.storage.pacing import StartPacing
from shardstream.topology import Detector
from tests.faultproxy import RateLimitProxy

WORLD, WORKERS = 2, 2
SHARDS, SAMPLES = 4, 12


def _payload(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest() * 64


def _pack(url: str, options: dict) -> None:
    with ShardWriter(url, format="tar", samples_per_shard=SAMPLES, storage_options=options) as writer:
        for i in range(SHARDS * SAMPLES):
            key = f"{i:06d}"
            writer.write({"__key__": key, "bin": _payload(key)})


def _no_dist() -> None:
    return None


def _read_epoch(
    url: str, options: dict, rank: int, worker: int, start_rate: float | None, go: threading.Barrier
):
    """One reader's epoch: (the keys it yielded, the keys its plan says, payloads all right)."""
    info = types.SimpleNamespace(id=worker, num_workers=WORKERS)
    go.wait()  # every reader starts at once: its manifest, sidecars and first data together
    dataset = shardstream.StreamingDataset(
        url,
        storage_options=options,
        num_replicas=WORLD,
        rank=rank,
        topology=Detector(dist_fn=_no_dist, environ={}, worker_info_fn=lambda: info),
        shuffle=True,
        seed=7,
        shuffle_window=10,
        decode=False,
        start_rate=start_rate,
    )
    samples = list(dataset)
    got = [sample["__key__"] for sample in samples]
    intact = all(sample["bin"] == _payload(sample["__key__"]) for sample in samples)
    shards = dataset.manifest.shards
    plan = dataset.make_plan(num_workers=WORKERS, consume=False)
    # ShardWriter numbers its shards in the order it writes them: shard j holds keys j*SAMPLES...
    assert [s.path for s in shards] == sorted(s.path for s in shards)
    assert all(s.samples == SAMPLES for s in shards)
    want = [f"{shard * SAMPLES + index:06d}" for shard, index in plan.worker_samples(rank, worker)]
    return got, want, intact


@pytest.mark.s3
@pytest.mark.parametrize(("start_rate", "http_date"), [(None, True), (15.0, False)], ids=["unpaced", "paced"])
def test_every_reader_finishes_its_epoch_exact_through_a_throttle_storm(
    s3, moto_server, start_rate, http_date
):
    """Unpaced, the readers' first requests come at once and meet a storm of 503s and 429s
    (Retry-After as an HTTP date); paced under the proxy's rate, they meet few (Retry-After
    in seconds). Either way every reader gets exactly its plan."""
    base, options = s3
    url = base + "/storm"
    _pack(url, options)
    readers = [(rank, worker) for rank in range(WORLD) for worker in range(WORKERS)]
    go = threading.Barrier(len(readers))
    with RateLimitProxy(moto_server.endpoint, rate=20, burst=2, retry_after=1, http_date=http_date) as proxy:
        through = dict(options, endpoint_url=proxy.endpoint)
        with ThreadPoolExecutor(len(readers)) as pool:
            futures = {
                reader: pool.submit(_read_epoch, url, through, *reader, start_rate, go) for reader in readers
            }
            # a 503 or 429 that reached a user would raise here
            results = {reader: future.result() for reader, future in futures.items()}
    everything = []
    for reader, (got, want, intact) in results.items():
        assert got == want, f"rank {reader[0]} worker {reader[1]}"
        assert intact
        everything += got
    assert sorted(everything) == [f"{i:06d}" for i in range(SHARDS * SAMPLES)]  # each sample once
    assert proxy.stats["forward"] >= len(readers)
    if start_rate is None:
        assert proxy.throttled() > 0  # a storm it was: a 503 or 429 met, retried, never seen
    else:  # the readers' first requests went through this process's gate, and it is spent
        assert pacing.gate(StartPacing(start_rate)).open
