"""NOTE [ Whole shards at once ]: a window that reads all of each of its shards GETs them
with their sidecars, not after them; the sidecars are still checked first."""

from __future__ import annotations

import json
import threading
import tracemalloc

import pytest

import shardstream
from shardstream.errors import ShardstreamError
from shardstream.storage import Storage
from tests.faultproxy import FaultProxy

SUFFIXES = {"tar": ".tar", "parquet": ".parquet"}


class SidecarsHeld(FaultProxy):
    """Holds every sidecar GET until some shard GET has arrived, or ``hold`` seconds have
    passed (``timed_out`` counts those): a reader that asks for the shards only once it has
    their sidecars waits out every hold."""

    def __init__(self, upstream: str, suffix: str, hold: float) -> None:
        super().__init__(upstream, seed=0, error_rate=0, reset_rate=0, truncate_rate=0)
        self.suffix, self.hold = suffix, hold
        self.shard_asked = threading.Event()
        self.timed_out = 0
        self.shards: list[str] = []

    def decide(self, method: str, path: str, byte_range: str) -> str:
        name = path.split("?")[0].rsplit("/", 1)[-1]
        if method == "GET" and name.endswith(self.suffix + ".idx") and not self.shard_asked.wait(self.hold):
            with self._lock:
                self.timed_out += 1
        elif method == "GET" and name.endswith(self.suffix):
            with self._lock:
                self.shards.append(name)
            self.shard_asked.set()
        return super().decide(method, path, byte_range)


def _pack(
    url: str, options: dict, fmt: str, *, shards: int = 4, samples: int = 30
) -> list[tuple[str, bytes]]:
    from shardstream.pack import ShardWriter

    written = []
    with ShardWriter(url, format=fmt, samples_per_shard=samples, storage_options=options) as writer:
        for i in range(shards * samples):
            sample = {"__key__": f"{i:06d}", "bin": i.to_bytes(4, "big") * 100}
            writer.write(sample)
            written.append((sample["__key__"], sample["bin"]))
    return written


def _stream(url: str, options: dict, **kwargs: object) -> list[tuple[str, bytes]]:
    dataset = shardstream.StreamingDataset(url, storage_options=options, decode=False, **kwargs)
    try:
        return [(s["__key__"], bytes(s["bin"])) for s in dataset]
    finally:
        dataset.storage.close()


@pytest.mark.s3
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_a_window_of_whole_shards_gets_them_with_their_sidecars(s3, moto_server, fmt):
    base, options = s3
    written = _pack(base + "/ds", options, fmt)
    with SidecarsHeld(moto_server.endpoint, SUFFIXES[fmt], hold=5) as proxy:
        got = _stream(base + "/ds", dict(options, endpoint_url=proxy.endpoint), shuffle=False)
    assert got == written
    assert proxy.timed_out == 0  # before: the shards were asked for once their sidecars came
    assert len(proxy.shards) == len(set(proxy.shards)) == 4  # each shard once, whole


@pytest.mark.s3
def test_a_window_over_the_budget_or_of_parts_of_shards_reads_its_sidecars_first(s3, moto_server):
    base, options = s3
    written = _pack(base + "/ds", options, "tar")
    endpoint = moto_server.endpoint
    # the shards do not fit in 1 KiB (one window, shuffled: unshuffled, it would be read in
    # pieces of a sample, NOTE [ Unshuffled windows in pieces ])
    with SidecarsHeld(endpoint, ".tar", hold=0.3) as proxy:
        through = dict(options, endpoint_url=proxy.endpoint)
        got = _stream(base + "/ds", through, shuffle=True, shuffle_window=120, read_budget=1024)
    assert sorted(got) == written
    assert proxy.shards
    assert proxy.timed_out == 4  # every sidecar before any shard
    with SidecarsHeld(endpoint, ".tar", hold=0.3) as proxy:  # windows of half shards
        got = _stream(
            base + "/ds", dict(options, endpoint_url=proxy.endpoint), shuffle=False, shuffle_window=15
        )
    assert got == written
    assert proxy.shards
    assert proxy.timed_out >= 1  # the first window's sidecar before any shard


@pytest.mark.s3
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_a_manifest_that_miscounts_a_whole_shard_fails_on_its_sidecar_before_allocating(s3, fmt):
    base, options = s3
    _pack(base + "/ds", options, fmt)
    storage = Storage(base + "/ds", options)
    data = json.loads(storage.read(".shardstream/manifest.json"))
    claimed = 10**12  # the window's run is then [0, claimed) of this shard: all of it, as counted
    data["shards"][1]["samples"] = claimed
    data["num_samples"] = sum(s["samples"] for s in data["shards"])
    storage.write(".shardstream/manifest.json", json.dumps(data).encode())
    storage.close()
    tracemalloc.start()
    try:
        with pytest.raises(ShardstreamError, match=f"the manifest says {claimed}") as caught:
            for _ in shardstream.StreamingDataset(base + "/ds", storage_options=options, shuffle=False):
                pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.shard == data["shards"][1]["path"]
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB allocated before the check"


@pytest.mark.s3
def test_the_whole_shards_of_a_window_that_also_reads_part_of_one_go_with_the_sidecars(s3, moto_server):
    base, options = s3
    written = _pack(base + "/ds", options, "tar")
    # windows of 45 samples: shard 0 and the first half of shard 1, then the rest of
    # shard 1 and shard 2, ...: shard 0 is GET whole with the sidecars, shard 1's half after
    with SidecarsHeld(moto_server.endpoint, ".tar", hold=5) as proxy:
        got = _stream(
            base + "/ds", dict(options, endpoint_url=proxy.endpoint), shuffle=False, shuffle_window=45
        )
    assert got == written
    assert proxy.timed_out == 0  # before: the first window's sidecars came before any shard
    assert proxy.shards[0] == "shard-000000.tar"
