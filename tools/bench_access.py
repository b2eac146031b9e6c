"""Random access: ``shardstream.MapDataset`` against the alternatives, measured in the same run.

    python tools/bench_access.py [--quick] [--only local,s3,seaweedfs,wan] [--repeat 5] [--record]

- local: ``dataset[i]`` for random ``i`` (the same indices for everyone), one process, on
  the small-sample corpus of tools/bench_stream.py (~300 B, three fields, decoded:
  text, integer, JSON): shardstream (checked reads, the default; and with
  ``verify_checksums=False``) vs MosaicML Streaming on the same samples written with
  ``streaming.MDSWriter`` (columns str, int, json: the same decode level), local only,
  through both of its documented paths (``dataset[i]`` and ``dataset.get_item(i)``); the
  target is >= 2x the faster of the two in each round. The indices repeat from round to
  round, so these are steady-state figures (files open, CRCs of the samples recorded,
  page cache warm) for both; "a new dataset" is shardstream's first reads: a dataset
  made in the round, which loads its sidecars and checks whole blocks.
- s3 (moto, in another process) and seaweedfs (SeaweedFS, a real S3 server in Go, ``weed
  mini`` as shardstream.testing starts it; one at a time on a machine): ``get_many`` of
  256 random indices vs one sequential read of as many bytes as those samples hold
  (``Storage.read`` of one ranged GET, and boto3 ``get_object``): the target is a batch
  in at most 2x the time of that read. Batches rotate through 8 index sets, sidecars
  loaded (the warm-up's). Also the GETs and bytes a batch makes, and the batch against
  its floor on that server (NOTE [ Batch fetches ]): one ranged GET for each shard it
  touches, from the first byte of its samples there to the last, all at once in threads
  already started (``Storage.read``, no checks, nothing decoded), rotating through the
  same index sets; the target is a batch in at most 1.5x the floor's time. Below that
  floor, one small GET for each shard (the requests alone, no bytes) is printed too:
  reading fewer bytes than the floor takes more GETs, which cost more on these servers.
- wan: the same on moto behind ``shardstream.testing.wanproxy`` in its own process (30 ms
  before each request, 40 MB/s per response, as tools/bench_wan.py): on loopback a request
  costs CPU (client and server) that is many times one read's, so the floor above is far
  from 2x there; over a network a batch's requests in flight cost about one latency.

Rates, rounds and ratios are measured as in tools/bench_stream.py (warm-up, rotating
rounds, paired median ratios); the machine is shared, so take the ratios, not the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from bench_stream import ROOT, MotoProcess, measure, report, small_sample, write_tar

sys.path.insert(0, str(ROOT))

import shardstream
from shardstream.storage import Storage
from shardstream.types import ByteRange

BATCH = 256


def import_mosaic() -> types.ModuleType | None:
    """``streaming`` (MosaicML), or None. Its package root imports its vision, text and
    multimodal examples (torchvision, transformers): stubbed when they cannot load, as
    only ``MDSWriter`` and ``StreamingDataset`` are measured."""
    try:
        import streaming

        return streaming
    except ImportError as error:
        if not (error.name or "").startswith("transformers"):  # else: stubbed below, as broken
            return None
    except Exception:  # a broken optional dependency of its examples
        for name in list(sys.modules):
            if name == "streaming" or name.startswith(("streaming.", "transformers")):
                del sys.modules[name]
    for name in ("streaming.vision", "streaming.multimodal", "streaming.text"):
        sys.modules[name] = types.ModuleType(name)
    try:
        import transformers.feature_extraction_utils
        import transformers.tokenization_utils_base  # noqa: F401
    except Exception:
        for name, attr in (
            ("feature_extraction_utils", "BatchFeature"),
            ("tokenization_utils_base", "BatchEncoding"),
        ):
            module = types.ModuleType(f"transformers.{name}")
            setattr(module, attr, type(attr, (), {}))
            sys.modules[module.__name__] = module
        sys.modules.setdefault("transformers", types.ModuleType("transformers"))
    try:
        import streaming

        return streaming
    except Exception as error:
        print(f"mosaicml-streaming cannot be imported: {error!r}")
        return None


def mds_sample(i: int) -> dict:
    raw = small_sample(i)
    return {
        "key": raw["__key__"],
        "txt": raw["txt"].decode(),
        "cls": int(raw["cls"]),
        "json": json.loads(raw["json"]),
    }


def write_mds(streaming: types.ModuleType, directory: str, count: int) -> None:
    columns = {"key": "str", "txt": "str", "cls": "int", "json": "json"}
    with streaming.MDSWriter(out=directory, columns=columns, size_limit="64mb") as writer:
        for i in range(count):
            writer.write(mds_sample(i))


def lookups(get: Callable[[int], object], indices: list[int]) -> Callable[[], int]:
    def run() -> int:
        for i in indices:
            get(i)
        return len(indices)

    return run


def bench_local(work: str, count: int, reads: int, repeat: int, recorded: dict[str, float]) -> None:
    url = os.path.join(work, "small")
    write_tar(url, map(small_sample, range(count)), 10_000)
    indices = [random.Random(0).randrange(count) for _ in range(reads)]
    checked, unchecked = shardstream.MapDataset(url), shardstream.MapDataset(url, verify_checksums=False)

    def fresh() -> int:  # first reads: a new dataset loads its sidecars and checks whole blocks
        with shardstream.MapDataset(url) as dataset:
            return lookups(dataset.__getitem__, indices)()

    contenders: dict[str, Callable[[], int]] = {
        "shardstream": lookups(checked.__getitem__, indices),
        "shardstream unchecked": lookups(unchecked.__getitem__, indices),
        "shardstream, a new dataset": fresh,
    }
    streaming = import_mosaic()
    if streaming is not None:
        directory = os.path.join(work, "small-mds")
        write_mds(streaming, directory, count)
        mosaic = streaming.StreamingDataset(local=directory, shuffle=False, batch_size=1)
        got, want = mosaic[indices[0]], checked[indices[0]]
        if (got["key"], got["txt"], got["cls"], got["json"]) != tuple(
            want[k] for k in ("__key__", "txt", "cls", "json")
        ):
            raise SystemExit("MosaicML and shardstream disagree on a sample")
        # its fastest documented path: get_item skips __getitem__'s dispatch on the index type
        contenders["mosaicml"] = lookups(mosaic.__getitem__, indices)
        contenders["mosaicml get_item"] = lookups(mosaic.get_item, indices)
    rates = measure(contenders, repeat)
    report(
        f"random access: dataset[i] for {reads:,} random i of {count:,} x ~300 B, decoded, local, one process",
        rates,
    )
    if "mosaicml" in rates.names:
        # against the faster of MosaicML's two paths in each round
        ratios = rates.ratios(["mosaicml", "mosaicml get_item"])
        met = "met" if sorted(ratios)[len(ratios) // 2] >= 2 else "MISSED"
        recorded["dataset[i] / MosaicML's, checked"] = round(sorted(ratios)[len(ratios) // 2], 2)
        print(
            f"  shardstream / fastest mosaicml = {rates.ratio(['mosaicml', 'mosaicml get_item'])}; "
            f"target >= 2x: {met}"
        )
    checked.close()
    unchecked.close()


class SeaweedProcess:
    """SeaweedFS (``weed mini``, a real S3 server in Go) on 127.0.0.1, as the tests start it."""

    def __init__(self, bucket: str) -> None:
        from shardstream.testing import SeaweedFS

        self.server = SeaweedFS()
        self.server.start()
        try:
            self.server.create_bucket(bucket)
        except BaseException:
            self.server.stop()
            raise

    def options(self) -> dict:
        return self.server.storage_options()

    def stop(self) -> None:
        self.server.stop()


class WanMotoProcess:
    """moto behind ``shardstream.testing.wanproxy`` in its own process (30 ms before each
    request, 40 MB/s per response, as tools/bench_wan.py): object storage over a network."""

    def __init__(self, bucket: str) -> None:
        from bench_wan import ProxyProcess

        self.server = MotoProcess(bucket)
        try:
            self.proxy = ProxyProcess(self.server.options()["endpoint_url"], 0.03, 40e6)
        except BaseException:
            self.server.stop()
            raise

    def options(self) -> dict:
        return {**self.server.options(), "endpoint_url": self.proxy.endpoint}

    def stop(self) -> None:
        self.proxy.stop()
        self.server.stop()


WHERE = {
    "moto": "moto, loopback",
    "seaweedfs": "seaweedfs, loopback",
    "wan": "moto behind a 30 ms, 40 MB/s proxy",
}
SERVERS = {"moto": MotoProcess, "seaweedfs": SeaweedProcess, "wan": WanMotoProcess}
LABELS = {"moto": "moto", "seaweedfs": "SeaweedFS", "wan": "WAN proxy"}  # in --record's ratios


def bench_s3(name: str, count: int, repeat: int, recorded: dict[str, float]) -> None:
    import boto3

    server_name, server = name, SERVERS[name]("bench")
    try:
        options, url = server.options(), "s3://bench/small"
        write_tar(url, map(small_sample, range(count)), 1_000, options)
        dataset = shardstream.MapDataset(url, storage_options=options)
        # without the block CRCs: a checked read of one ~3 KiB sample reads its 64 KiB block(s)
        unchecked = shardstream.MapDataset(url, storage_options=options, verify_checksums=False)
        rng = random.Random(1)
        batches = [[rng.randrange(count) for _ in range(BATCH)] for _ in range(8)]
        turn = iter(range(1 << 30))
        sample_bytes = _sample_bytes(dataset, batches[0])
        shard = dataset.manifest.shards[0]
        storage = Storage(url, options)
        span = ByteRange(0, min(sample_bytes, shard.bytes))
        client = boto3.client(
            "s3",
            endpoint_url=options["endpoint_url"],
            aws_access_key_id=options["key"],
            aws_secret_access_key=options["secret"],
            region_name="us-east-1",
        )

        def batch() -> int:
            dataset.get_many(batches[next(turn) % len(batches)])
            return 1

        def batch_unchecked() -> int:
            unchecked.get_many(batches[next(turn) % len(batches)])
            return 1

        def one_read() -> int:
            storage.read(shard.path, span)
            return 1

        def boto() -> int:
            key = f"small/{shard.path}"
            client.get_object(Bucket="bench", Key=key, Range=f"bytes=0-{span.end - 1}")["Body"].read()
            return 1

        # The floor of a batch on this server (NOTE [ Batch fetches ]): one ranged GET for each
        # shard it touches, from its first wanted byte to its last, all at once, in threads
        # already running; and, below it, one small GET for each (what the requests alone cost).
        spans = [_spans(dataset, indices) for indices in batches]
        firsts = [(path, ByteRange(rng.start, rng.start + 1)) for path, rng in spans[0]]
        floor_pool = ThreadPoolExecutor(max(map(len, spans)))
        list(floor_pool.map(lambda item: storage.read(*item), firsts))  # its threads started

        def per_shard() -> int:
            list(floor_pool.map(lambda item: storage.read(*item), spans[next(turn) % len(spans)]))
            return 1

        def small_per_shard() -> int:
            list(floor_pool.map(lambda item: storage.read(*item), firsts))
            return 1

        contenders = {
            "shardstream": batch,
            "shardstream unchecked": batch_unchecked,
            "one read": one_read,
            "floor: a GET per shard": per_shard,
            "one small GET per shard": small_per_shard,
        }
        rates = measure({**contenders, "boto3 one read": boto}, repeat)
        report(
            f"S3 ({WHERE[name]}): a batch of {BATCH} random indices of {count:,} x ~300 B vs one read of "
            f"their {sample_bytes:,} bytes",
            rates,
            unit="batches/s",
        )
        where = LABELS[server_name]
        for name, which in (("shardstream", dataset), ("shardstream unchecked", unchecked)):
            ratios = rates.ratios(["one read"], name)
            median = sorted(ratios)[len(ratios) // 2]
            met = "met" if median >= 0.5 else "MISSED"
            print(f"  {name}: batch time / one read's time = {1 / median:.1f}x; target <= 2x: {met}")
            if name == "shardstream":
                recorded[f"batch of {BATCH} / one read, {where}"] = round(1 / median, 2)
            ratios = rates.ratios(["floor: a GET per shard"], name)
            median = sorted(ratios)[len(ratios) // 2]
            met = "met" if median >= 1 / 1.5 else "MISSED"
            print(f"  {name}: batch time / the floor's time = {1 / median:.2f}x; target <= 1.5x: {met}")
            suffix = "" if name == "shardstream" else " unchecked"
            recorded[f"batch of {BATCH}{suffix} / its floor, {where}"] = round(1 / median, 2)
            _requests(which, batches[0], sample_bytes)
        touched = len(spans[0])
        floor_bytes = sum(rng.length for _, rng in spans[0])
        for row, what, key in (
            (
                "floor: a GET per shard",
                f"one GET for each of the {touched} shards, {floor_bytes:,} bytes",
                "floor",
            ),
            ("one small GET per shard", f"one small GET for each of the {touched} shards", "small GETs"),
        ):
            ratios = rates.ratios(["one read"], row)
            median = sorted(ratios)[len(ratios) // 2]
            print(f"  {row}: {what}, at once, takes {1 / median:.1f}x one read's time")
            recorded[f"{key} / one read, {where}"] = round(1 / median, 2)
        floor_pool.shutdown()
        storage.close()
        dataset.close()
        unchecked.close()
    finally:
        server.stop()


def _spans(dataset: shardstream.MapDataset, indices: list[int]) -> list[tuple[str, ByteRange]]:
    """For each shard the samples at ``indices`` lie in: its path, and its bytes from the
    first of them to the last (tar headers included)."""
    reader = dataset._opened().reader
    spans: dict[int, ByteRange] = {}
    for i in indices:
        shard, position = dataset.locate(i)
        rng = reader.index(shard).byte_range(position, position + 1)
        seen = spans.get(shard, rng)
        spans[shard] = ByteRange(min(seen.start, rng.start), max(seen.end, rng.end))
    shards = dataset.manifest.shards
    return [(shards[shard].path, rng) for shard, rng in sorted(spans.items())]


def _sample_bytes(dataset: shardstream.MapDataset, indices: list[int]) -> int:
    """The bytes the samples at ``indices`` hold in their shards (tar headers included)."""
    reader = dataset._opened().reader
    total = 0
    for i in indices:
        shard, position = dataset.locate(i)
        total += reader.index(shard).byte_range(position, position + 1).length
    return total


def _requests(dataset: shardstream.MapDataset, indices: list[int], sample_bytes: int) -> None:
    """Print the GETs a batch makes (each one, whatever path made it: parts of a long read
    too), counted where botocore hands them to urllib3."""
    import urllib3.connectionpool

    gets: list[int] = []
    pool = urllib3.connectionpool.HTTPConnectionPool
    original = pool.urlopen

    def counting(self: urllib3.connectionpool.HTTPConnectionPool, method: str, url: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        response = original(self, method, url, *args, **kwargs)
        if method == "GET":
            gets.append(int(response.headers.get("Content-Length", 0)))
        return response

    pool.urlopen = counting  # type: ignore[method-assign]
    try:
        dataset.get_many(indices)
    finally:
        pool.urlopen = original  # type: ignore[method-assign]
    print(
        f"  a batch makes {len(gets)} GETs of {sum(gets):,} bytes, for {len(set(indices))} samples of "
        f"{sample_bytes:,} bytes"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, one repeat")
    parser.add_argument(
        "--only", default="local,s3", help="sections: local, s3 (moto), seaweedfs, wan (moto behind a proxy)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds after the warm-up")
    parser.add_argument(
        "--record",
        action="store_true",
        help="append the ratios to docs/benchmarks.json (claim random-access)",
    )
    args = parser.parse_args()
    recorded: dict[str, float] = {}
    only = set(args.only.split(","))
    repeat = 1 if args.quick else args.repeat
    count, reads, s3_count = (20_000, 2_000, 5_000) if args.quick else (100_000, 20_000, 20_000)
    work = tempfile.mkdtemp(prefix="bench-access-")
    try:
        if "local" in only:
            bench_local(work, count, reads, repeat, recorded)
        if "s3" in only:
            bench_s3("moto", s3_count, repeat, recorded)
        if "seaweedfs" in only:
            bench_s3("seaweedfs", s3_count, repeat, recorded)
        if "wan" in only:
            bench_s3("wan", s3_count, repeat, recorded)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.record and recorded:
        from results import command_line, record

        record("random-access", command_line(), {}, ratios=recorded)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
