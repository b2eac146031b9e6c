"""shardstream.testing.WanProxy: object storage as over a network (latency, a bandwidth cap
per response), and what an epoch through it does. Bounds are loose on purpose: timing is
for benchmarks (tools/bench_wan.py), these only check that the shaping happens at all."""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
import time
import urllib.request

import pytest

import shardstream
from shardstream.testing import WanProxy
from tests.resume_harness import write_dataset

MB = 1 << 20


def client(endpoint: str, options: dict):  # type: ignore[no-untyped-def]
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
        region_name="us-east-1",
        config=Config(max_pool_connections=16, retries={"max_attempts": 1}),
    )


@pytest.fixture
def blob(s3, moto_server):
    """``(bucket, key, data, options)``: a 1 MB object on moto."""
    base, options = s3
    bucket, data = base.removeprefix("s3://"), os.urandom(MB)
    client(moto_server.endpoint, options).put_object(Bucket=bucket, Key="blob.bin", Body=data)
    return bucket, "blob.bin", data, options


@pytest.mark.s3
def test_latency_delays_the_first_byte(blob, moto_server):
    bucket, key, _, options = blob
    with WanProxy(moto_server.endpoint, latency=0.2, bandwidth=0) as proxy:
        s3 = client(proxy.endpoint, options)
        started = time.monotonic()
        s3.head_object(Bucket=bucket, Key=key)
        assert time.monotonic() - started >= 0.2
        s3.close()
    assert proxy.stats.requests == 1
    assert proxy.stats.gets == 0


@pytest.mark.s3
def test_bandwidth_caps_a_response_and_bytes_arrive_whole(blob, moto_server):
    bucket, key, data, options = blob
    with WanProxy(moto_server.endpoint, latency=0, bandwidth=4 * MB) as proxy:
        s3 = client(proxy.endpoint, options)
        started = time.monotonic()
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        elapsed = time.monotonic() - started
        ranged = s3.get_object(Bucket=bucket, Key=key, Range="bytes=1000-1999")["Body"].read()
        s3.close()
        # The client has the last bytes before the proxy's handler ends its pacing wait and
        # counts them; stopping the proxy inside that wait aborts the count, not the bytes.
        deadline = time.monotonic() + 10
        while proxy.stats.in_flight and time.monotonic() < deadline:
            time.sleep(0.001)
    assert body == data
    assert ranged == data[1000:2000]
    assert elapsed >= 0.2  # 1 MB at 4 MB/s: 0.25 s at the least
    assert proxy.stats.gets == 2
    assert proxy.stats.bytes_out == MB + 1000


@pytest.mark.s3
def test_peak_in_flight_counts_concurrent_requests(blob, moto_server):
    bucket, key, data, options = blob
    with WanProxy(moto_server.endpoint, latency=0.1, bandwidth=8 * MB) as proxy:
        s3 = client(proxy.endpoint, options)

        def get(_: int) -> bytes:
            return s3.get_object(Bucket=bucket, Key=key)["Body"].read()

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            bodies = list(pool.map(get, range(6)))
        s3.close()
    assert proxy.stats.in_flight == 0  # stop() joined the handlers: every response was done
    assert all(body == data for body in bodies)
    assert proxy.stats.peak_in_flight >= 2
    assert proxy.stats.gets == 6


@pytest.mark.s3
def test_control_paths_answer_and_reset_the_counters(blob, moto_server):
    bucket, key, _, options = blob
    with WanProxy(moto_server.endpoint, latency=0, bandwidth=0) as proxy:
        s3 = client(proxy.endpoint, options)
        s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        s3.close()
        with urllib.request.urlopen(proxy.endpoint + "/__wanproxy__/stats") as answer:
            before = json.load(answer)
        assert before["gets"] == 1
        assert before["cpu_seconds"] > 0  # the process's CPU time since the proxy started
        reset = urllib.request.Request(proxy.endpoint + "/__wanproxy__/reset", method="POST")
        with urllib.request.urlopen(reset) as answer:
            after = json.load(answer)
        assert after["gets"] == 0
        assert 0 <= after["cpu_seconds"] < before["cpu_seconds"]
    assert proxy.stats.requests == 0  # the control paths are not counted


@pytest.mark.s3
def test_stop_ends_every_thread_even_mid_response(blob, moto_server):
    bucket, key, _, options = blob
    before = set(threading.enumerate())
    proxy = WanProxy(moto_server.endpoint, latency=0, bandwidth=64 * 1024).start()  # 16 s a GET
    s3 = client(proxy.endpoint, options)
    failed: list[BaseException] = []

    def get() -> None:
        try:
            s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as error:  # cut off by stop(): what this test wants
            failed.append(error)

    getter = threading.Thread(target=get)
    getter.start()
    while proxy.stats.in_flight == 0:
        time.sleep(0.01)
    proxy.stop()
    getter.join(timeout=30)
    s3.close()
    assert not getter.is_alive()
    assert failed
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


def _epoch(url: str, options: dict | None, **kwargs) -> list[str]:  # type: ignore[no-untyped-def]
    dataset = shardstream.StreamingDataset(
        url, storage_options=options, shuffle=True, seed=3, decode=False, **kwargs
    )
    return [sample["__key__"] for sample in dataset]


@pytest.mark.s3
@pytest.mark.parametrize("cache", [False, True])
def test_an_epoch_through_the_proxy_is_exact(s3, moto_server, tmp_path, cache):
    base, options = s3
    keys = write_dataset(base + "/ds", [40, 1, 25, 60, 33], options)
    local = tmp_path / "local"
    write_dataset(str(local), [40, 1, 25, 60, 33])
    with WanProxy(moto_server.endpoint, latency=0.01, bandwidth=4 * MB) as proxy:
        extra = {"cache_dir": str(tmp_path / "cache")} if cache else {}
        remote = _epoch(base + "/ds", dict(options, endpoint_url=proxy.endpoint), **extra)
        again = _epoch(base + "/ds", dict(options, endpoint_url=proxy.endpoint), **extra)
    assert sorted(remote) == sorted(keys)  # every sample once
    assert remote == _epoch(str(local), None)  # in the same order as from local files
    assert again == remote
    assert proxy.stats.gets > 0


@pytest.mark.s3
def test_requests_overlap_within_one_worker(s3, moto_server):
    """One process, no DataLoader workers, one 5 MB shard read start to end over a slow
    connection: after its first 2 MiB the reader cuts the rest into ranged GETs in flight
    together (NOTE [ Reads in parts ])."""
    from shardstream.pack import ShardWriter

    base, options = s3
    with ShardWriter(base + "/ds", format="tar", samples_per_shard=1000, storage_options=options) as writer:
        for i in range(1000):
            writer.write({"__key__": f"{i:06d}", "bin": os.urandom(5000)})
    with WanProxy(moto_server.endpoint, latency=0.05, bandwidth=8 * MB) as proxy:
        dataset = shardstream.StreamingDataset(
            base + "/ds", storage_options=dict(options, endpoint_url=proxy.endpoint), shuffle=False
        )
        proxy.reset_stats()  # opening the dataset (manifest) is not the epoch
        assert sum(1 for _ in dataset) == 1000
    assert proxy.stats.peak_in_flight >= 2
