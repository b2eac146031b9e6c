"""MapDataset batches on object storage at their request floor (NOTE [ Batch fetches ]): one
ranged GET per shard a batch touches, all in flight at once, nothing else on the wire (no
HEAD, no sidecar once loaded), the samples exact and in the caller's order; and the pool
whose threads linger between batches (NOTE [ Threads that linger ])."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import CancelledError

import pytest

import shardstream
from shardstream.dataset.indexes import INDEX_CACHE_SIZE
from shardstream.errors import FormatError, StorageError, UsageError
from shardstream.pack import ShardWriter
from shardstream.storage import Storage
from shardstream.storage.idle_pool import IdlePool
from shardstream.testing import WanProxy
from tests.faultproxy import FaultProxy

SHARDS, PER_SHARD, SIZE = 6, 20, 10_000


class Counter(FaultProxy):
    """Forwards everything, and records each request's method, object name and Range."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, seed=0, error_rate=0, reset_rate=0, truncate_rate=0)
        self.seen: list[tuple[str, str, str]] = []

    def decide(self, method: str, path: str, byte_range: str) -> str:
        with self._lock:
            self.seen.append((method, path.split("?")[0].rsplit("/", 1)[-1], byte_range))
        return super().decide(method, path, byte_range)


def payload(i: int) -> bytes:
    return bytes([i % 251]) * SIZE


def pack(url: str, options: dict) -> None:
    with ShardWriter(url, format="tar", samples_per_shard=PER_SHARD, storage_options=options) as writer:
        for i in range(SHARDS * PER_SHARD):
            writer.write({"__key__": f"k{i:05d}", "bin": payload(i), "cls": b"%d" % (i % 7)})


def inner_indices(seed: int) -> list[int]:
    """Random indices, none a shard's first or last sample (so no read is the whole
    object), in every shard, with a repeat."""
    rng = random.Random(seed)
    chosen = [
        shard * PER_SHARD + rng.randrange(1, PER_SHARD - 1) for shard in range(SHARDS) for _ in range(3)
    ]
    rng.shuffle(chosen)
    return [*chosen, chosen[0]]


def check_samples(got: list, indices: list[int]) -> None:
    assert [sample["__key__"] for sample in got] == [f"k{i:05d}" for i in indices]
    assert [bytes(sample["bin"]) for sample in got] == [payload(i) for i in indices]
    assert [sample["cls"] for sample in got] == [i % 7 for i in indices]


@pytest.mark.s3
@pytest.mark.parametrize("verify", [True, False])
def test_a_batch_is_one_ranged_get_per_touched_shard_and_nothing_else(s3, moto_server, verify):
    base, options = s3
    pack(f"{base}/ds", options)
    with Counter(moto_server.endpoint) as proxy:
        through = dict(options, endpoint_url=proxy.endpoint)
        with shardstream.MapDataset(
            f"{base}/ds", storage_options=through, verify_checksums=verify
        ) as dataset:
            dataset.get_many([i * PER_SHARD for i in range(SHARDS)])  # the sidecars, loaded
            reader = dataset._opened().reader
            for seed in range(3):
                indices = inner_indices(seed)
                proxy.seen.clear()
                check_samples(dataset.get_many(indices), indices)
                seen = list(proxy.seen)
                assert {method for method, _, _ in seen} == {"GET"}, seen  # no HEAD, no LIST
                names = [name for _, name, _ in seen]
                assert sorted(names) == sorted(info.path for info in dataset.manifest.shards), seen
                for _, name, byte_range in seen:
                    shard = next(s for s, info in enumerate(dataset.manifest.shards) if info.path == name)
                    wanted = [dataset.locate(i)[1] for i in indices if dataset.locate(i)[0] == shard]
                    index = reader.index(shard)
                    first = index.byte_range(min(wanted), min(wanted) + 1)
                    last = index.byte_range(max(wanted), max(wanted) + 1)
                    if byte_range:
                        start, end = map(int, byte_range.removeprefix("bytes=").split("-"))
                    else:  # a checked read grown to all of a small shard: the whole object
                        assert verify
                        start, end = 0, dataset.manifest.shards[shard].bytes - 1
                    # from the first wanted sample to the last (grown to check blocks when checked)
                    assert start <= first.start
                    assert end + 1 >= last.end
                    if not verify:
                        assert (start, end + 1) == (first.start, last.end)


@pytest.mark.s3
def test_a_batchs_gets_are_all_in_flight_at_once(s3, moto_server):
    base, options = s3
    pack(f"{base}/ds", options)
    with WanProxy(moto_server.endpoint, latency=0.3, bandwidth=0) as proxy:
        through = dict(options, endpoint_url=proxy.endpoint)
        with shardstream.MapDataset(f"{base}/ds", storage_options=through) as dataset:
            dataset.get_many([i * PER_SHARD for i in range(SHARDS)])  # the sidecars, and the threads
            indices = inner_indices(7)
            proxy.reset_stats()
            check_samples(dataset.get_many(indices), indices)
            assert proxy.stats.gets == SHARDS
            assert proxy.stats.peak_in_flight == SHARDS


@pytest.mark.s3
def test_more_shards_than_threads_is_still_one_get_each_and_exact(s3, moto_server):
    base, options = s3
    pack(f"{base}/ds", options)
    with Counter(moto_server.endpoint) as proxy:
        through = dict(options, endpoint_url=proxy.endpoint)
        with shardstream.MapDataset(f"{base}/ds", storage_options=through, read_threads=2) as dataset:
            dataset.get_many([i * PER_SHARD for i in range(SHARDS)])
            indices = inner_indices(3)
            proxy.seen.clear()
            check_samples(dataset.get_many(indices), indices)
            assert len(proxy.seen) == SHARDS
            assert dataset._opened().batches.pool.running <= 2


@pytest.mark.s3
def test_sidecars_are_read_once_however_many_shards_random_batches_touch(s3, moto_server):
    # NOTE [ Sidecars of random batches ]: more shards than a streamed window's LRU holds
    base, options = s3
    shards = INDEX_CACHE_SIZE + 12
    with ShardWriter(f"{base}/many", format="tar", samples_per_shard=3, storage_options=options) as writer:
        for i in range(shards * 3):
            writer.write({"__key__": f"k{i:05d}", "cls": b"%d" % i})
    with Counter(moto_server.endpoint) as proxy:
        through = dict(options, endpoint_url=proxy.endpoint)
        with shardstream.MapDataset(f"{base}/many", storage_options=through) as dataset:
            for seed in range(3):
                indices = [3 * shard + random.Random(seed).randrange(3) for shard in range(shards)]
                random.Random(seed).shuffle(indices)
                proxy.seen.clear()
                got = dataset.get_many(indices)
                assert [sample["cls"] for sample in got] == indices
                sidecars = [name for _, name, _ in proxy.seen if name.endswith(".idx")]
                assert len(sidecars) == (shards if seed == 0 else 0)
                assert len(proxy.seen) - len(sidecars) == shards


@pytest.mark.s3
def test_a_missing_or_corrupt_shard_fails_the_batch_naming_it(s3):
    base, options = s3
    pack(f"{base}/ds", options)
    storage = Storage(f"{base}/ds", options)
    indices = inner_indices(5)
    with shardstream.MapDataset(f"{base}/ds", storage_options=options) as dataset:
        dataset.get_many(indices)
        shard = dataset.manifest.shards[2].path
        data = bytearray(storage.read(shard))
        data[data.index(payload(2 * PER_SHARD + 5)[:100])] ^= 0xFF
        storage.write(shard, bytes(data))
        with pytest.raises(FormatError, match="checksum mismatch") as failed:
            dataset.get_many([2 * PER_SHARD + 5, 4])
        assert shard in str(failed.value)
        assert "dataset index" in str(failed.value)
        storage.delete(shard)
        with pytest.raises(StorageError) as failed:
            dataset.get_many(indices)
        assert shard in str(failed.value)
        check_samples(dataset.get_many([4, 1]), [4, 1])  # the other shards still read
    storage.close()


@pytest.mark.s3
def test_the_batch_threads_linger_then_end(s3):
    base, options = s3
    pack(f"{base}/ds", options)
    dataset = shardstream.MapDataset(f"{base}/ds", storage_options=options)
    dataset.get_many(inner_indices(1))
    pool = dataset._opened().batches.pool
    first = {t for t in threading.enumerate() if t.name.startswith("shardstream-batch")}
    assert 1 <= len(first) <= SHARDS
    assert pool.running == len(first)
    check_samples(dataset.get_many(inner_indices(2)), inner_indices(2))
    assert all(thread.is_alive() for thread in first)
    dataset.close()
    assert pool.running == 0
    assert not [t for t in threading.enumerate() if t in first]


# -- the pool ----------------------------------------------------------------------------


def test_an_idle_pool_grows_to_its_work_and_its_threads_end_when_idle():
    pool = IdlePool(8, idle=0.2, name="test-idle")
    gate = threading.Event()
    futures = [pool.submit(gate.wait, 5) for _ in range(3)]
    assert pool.running == 3  # one thread for each piece of work in flight, no more
    gate.set()
    assert [f.result() for f in futures] == [True] * 3
    names = {pool.submit(lambda: threading.current_thread().name).result() for _ in range(20)}
    assert len(names) <= 3
    assert pool.running <= 3
    deadline = time.monotonic() + 5
    while pool.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.running == 0  # they ended, idle
    assert pool.submit(sum, [1, 2]).result() == 3  # and a new one starts for new work
    pool.shutdown()
    assert pool.running == 0


def test_an_idle_pool_bounds_its_threads_passes_errors_and_cancels_on_shutdown():
    pool = IdlePool(2, idle=5)
    gate = threading.Event()
    running = [pool.submit(gate.wait, 5) for _ in range(2)]
    queued = [pool.submit(int, "7") for _ in range(3)]
    assert pool.running == 2
    failed = pool.submit(int, "x")
    gate.set()
    assert [f.result() for f in running + queued] == [True, True, 7, 7, 7]
    with pytest.raises(ValueError, match="invalid literal"):
        failed.result()
    gate.clear()
    started = threading.Semaphore(0)

    def hold() -> bool:
        started.release()
        return gate.wait(5)

    busy = [pool.submit(hold) for _ in range(2)]
    for _ in busy:
        assert started.acquire(timeout=5)  # both running: shutdown lets them finish
    later = pool.submit(int, "1")
    threading.Timer(0.2, gate.set).start()
    pool.shutdown(wait=True, cancel_futures=True)
    assert all(f.result() for f in busy)
    with pytest.raises(CancelledError):
        later.result()
    assert pool.running == 0
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(int, "1")
    with pytest.raises(UsageError):
        IdlePool(0, idle=1)
