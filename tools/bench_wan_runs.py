"""The per-process half of tools/bench_wan.py: the corpora in each tool's format, and one
run of one contender (its cold epoch, and its warm one where it has a cache), in a fresh
process forked from bench_wan's forkserver. See bench_wan.py for what is measured."""

from __future__ import annotations

import concurrent.futures
import gc
import importlib
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_stream import MB, proc_status

import shardstream
from shardstream.pack import ShardWriter

BUCKET = "bench"


def _stub_broken_torchvision() -> None:
    """MosaicML Streaming imports torchvision at import time (for its vision datasets,
    unused here); a torchvision that does not match torch fails there. Then give it a
    stand-in with the two names it imports, so the streaming part still runs."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        import importlib.machinery
        import types

        names = (
            "torchvision",
            "torchvision.datasets",
            "torchvision.transforms",
            "torchvision.transforms.functional",
        )
        for name in names:
            module = sys.modules[name] = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        functional = sys.modules["torchvision.transforms.functional"]
        sys.modules["torchvision.datasets"].VisionDataset = object  # type: ignore[attr-defined]
        functional.to_tensor = None  # type: ignore[attr-defined]


_stub_broken_torchvision()  # here, not where streaming is imported: the forkserver preloads it


# -- the corpora (written once, not timed) ----------------------------------------------------


def large_sample(i: int) -> dict:
    return {"__key__": f"{i:07d}", "bin": random.Random(i).randbytes(MB - 64), "cls": b"%d" % i}


def upload_dir(client, local: str, prefix: str) -> None:  # type: ignore[no-untyped-def]
    for name in sorted(os.listdir(local)):
        client.upload_file(os.path.join(local, name), BUCKET, f"{prefix}/{name}")


def write_corpus(name: str, make, count: int, per_shard: int, work: str, env: dict) -> dict:  # type: ignore[no-untyped-def]
    """The corpus in every format; returns where each is."""
    import boto3

    options = storage_options(env["AWS_ENDPOINT_URL"], env)
    client = boto3.client("s3", **boto_kwargs(env["AWS_ENDPOINT_URL"], env))
    where = {"count": count}
    for fmt in ("tar", "parquet"):
        url = where[fmt] = f"s3://{BUCKET}/{name}-{fmt}"
        with ShardWriter(url, format=fmt, samples_per_shard=per_shard, storage_options=options) as w:
            for i in range(count):
                w.write(make(i))
    local = where["local"] = os.path.join(work, f"{name}-local")
    with ShardWriter(local, format="tar", samples_per_shard=per_shard) as w:
        for i in range(count):
            w.write(make(i))
    manifest = shardstream.StreamingDataset(local).manifest
    where["tar_keys"] = [f"{name}-tar/{s.path}" for s in manifest.shards]
    where["tar_sizes"] = [s.bytes for s in manifest.shards]
    shard_bytes = max(where["tar_sizes"])
    try:
        from litdata.streaming.writer import BinaryWriter

        directory = os.path.join(work, f"{name}-litdata")
        writer = BinaryWriter(directory, chunk_bytes=shard_bytes)
        for i in range(count):
            writer.add_item(i, make(i))
        writer.done()
        writer.merge(1)  # node_rank None: index.json itself, not a node's part of it
        upload_dir(client, directory, f"{name}-litdata")
        where["litdata"] = f"s3://{BUCKET}/{name}-litdata"
    except ImportError:
        print("litdata: not installed")
    try:
        _stub_broken_torchvision()
        from streaming import MDSWriter

        directory = os.path.join(work, f"{name}-mds")
        columns = {"key": "str", **{k: "bytes" for k in make(0) if k != "__key__"}}
        with MDSWriter(out=directory, columns=columns, size_limit=shard_bytes) as writer:
            for i in range(count):
                sample = make(i)
                writer.write({"key": sample.pop("__key__"), **sample})
        upload_dir(client, directory, f"{name}-mds")
        where["mosaic"] = f"s3://{BUCKET}/{name}-mds"
    except ImportError:
        print("mosaicml-streaming: not installed")
    return where


def boto_kwargs(endpoint: str, env: dict) -> dict:
    from botocore.config import Config

    return {
        "endpoint_url": endpoint,
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": "us-east-1",
        "config": Config(max_pool_connections=32),
    }


def storage_options(endpoint: str, env: dict) -> dict:
    return {"endpoint_url": endpoint, "key": env["AWS_ACCESS_KEY_ID"], "secret": env["AWS_SECRET_ACCESS_KEY"]}


# -- one run, in a fresh process --------------------------------------------------------------


# shardstream as it read before issue 9 (one read at a time): the memory figure's baseline
ONE_READ = "shardstream tar one read"


def epochs(spec: dict, cache: str) -> list:  # type: ignore[type-arg]
    """The iterables of this run's epochs: cold, then warm (the same dataset again) if the
    tool has a cache. The cold one opens the dataset inside the timing, for every tool."""
    tool = spec["tool"]
    if tool.startswith("boto3"):
        return [Lazy(lambda: boto3_epoch(spec))]
    if tool == "webdataset":
        return [Lazy(lambda: webdataset_dataset(spec))]
    opener = {"litdata": litdata_dataset, "mosaic": mosaic_dataset}.get(tool, shardstream_dataset)
    opened: list = []  # type: ignore[type-arg]
    cold = Lazy(lambda: opened.append(opener(spec, cache)) or opened[0])
    if tool in ("shardstream tar", "shardstream parquet", ONE_READ):
        return [cold]
    return [cold, Lazy(lambda: opened[0])]  # "local disk" too: what a warm cache must match


def shardstream_dataset(spec: dict, cache: str):  # type: ignore[no-untyped-def]
    tool, where = spec["tool"], spec["where"]
    local = tool == "local disk"
    corpus = {"shardstream parquet": "parquet"}.get(tool, "tar")  # the tar corpus unless named
    url = where["local"] if local else where[corpus]
    extra: dict = {"cache_dir": cache} if tool.endswith("cache") else {}
    if tool == ONE_READ:
        extra["read_concurrency"] = 1  # the reader before issue 9: one read, one window ahead
    options = None if local else storage_options(spec["endpoint"], spec["env"])
    return shardstream.StreamingDataset(url, storage_options=options, shuffle=False, decode=False, **extra)


def litdata_dataset(spec: dict, cache: str):  # type: ignore[no-untyped-def]
    import litdata
    import litdata.streaming.downloader as downloader

    # Its obstore client (async ranged GETs, its fast path) refuses an http:// endpoint
    # unless allow_http is among its client options, which LitData does not expose.
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}
    options = boto_kwargs(spec["endpoint"], spec["env"])
    del options["config"], options["region_name"]
    return litdata.StreamingDataset(spec["where"]["litdata"], cache_dir=cache, storage_options=options)


def webdataset_dataset(spec: dict):  # type: ignore[no-untyped-def]
    import s3fs
    import webdataset as wds

    fs = s3fs.S3FileSystem(**storage_options(spec["endpoint"], spec["env"]))
    # webdataset's gopen has no s3:// scheme; its docs stream object storage through
    # ``pipe:`` and a CLI (no aws CLI here). This is the same in-process, through s3fs,
    # without a process per shard.
    importlib.import_module("webdataset.gopen").gopen_schemes["s3"] = (
        lambda url, mode="rb", bufsize=8192, **kw: fs.open(
            url, mode, block_size=8 * MB, cache_type="readahead"
        )
    )
    urls = [f"s3://{BUCKET}/{key}" for key in spec["where"]["tar_keys"]]
    return wds.WebDataset(urls, shardshuffle=False, empty_check=False)


def mosaic_dataset(spec: dict, cache: str):  # type: ignore[no-untyped-def]
    env = {k: v for k, v in spec["env"].items() if k != "AWS_ENDPOINT_URL"}
    os.environ.update(S3_ENDPOINT_URL=spec["endpoint"], **env)
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return StreamingDataset(remote=spec["where"]["mosaic"], local=cache, shuffle=False, batch_size=1)


class Lazy:
    """An epoch whose iterable is made when the epoch starts (inside the timing)."""

    def __init__(self, make) -> None:  # type: ignore[no-untyped-def]
        self.make = make

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.make())


def boto3_epoch(spec: dict) -> range:
    """Every shard's bytes by plain ``get_object``; counts as the corpus' samples."""
    boto3_gets(spec)
    return range(spec["where"]["count"])


def boto3_gets(spec: dict) -> list[int]:
    import boto3

    client = boto3.client("s3", **boto_kwargs(spec["endpoint"], spec["env"]))
    keys, sizes = spec["where"]["tar_keys"], spec["where"]["tar_sizes"]
    if spec["tool"] == "boto3":  # whole shards, one after another
        return [len(client.get_object(Bucket=BUCKET, Key=key)["Body"].read()) for key in keys]
    part = max(256 * 1024, sum(sizes) // 64)  # enough parts to keep 16 requests in flight
    parts = [(k, o, min(o + part, n)) for k, n in zip(keys, sizes, strict=True) for o in range(0, n, part)]

    def get(item: tuple[str, int, int]) -> int:
        key, start, stop = item
        return len(
            client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{stop - 1}")["Body"].read()
        )

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(get, parts))


def proxy_call(spec: dict, what: str) -> dict:
    if not spec.get("proxy"):
        return {}
    method = "POST" if what == "reset" else "GET"
    request = urllib.request.Request(f"{spec['proxy']}/__wanproxy__/{what}", method=method)
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def fresh_process() -> None:
    """Before a run: what the forkserver preloaded is left out of this process's garbage
    collections. A collection walks every object and writes to each, so the first one in a
    fork child copied every page the preload holds (~120 MB: 1 s of the first sample)."""
    gc.freeze()


def own_cpu() -> float:
    """CPU seconds of this process and the children it waited for (a tool's helpers)."""
    return sum(sum(resource.getrusage(who)[:2]) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def process_cpu(pid: int | None) -> float:
    """CPU seconds another process (the S3 server) spent so far; 0 where there is none."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_one(spec: dict) -> dict:
    """One run (a cold epoch, and a warm one for a tool with a cache), in this process."""
    fresh_process()
    cache = tempfile.mkdtemp(prefix="bench-wan-cache-")
    try:
        result: dict = {"epochs": []}
        for number, epoch in enumerate(epochs(spec, os.path.join(cache, "c"))):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the RSS now
            start_rss = proc_status("self", "VmRSS")
            proxy_call(spec, "reset")
            cpu, server_cpu = own_cpu(), process_cpu(spec.get("server_pid"))
            started, items = time.perf_counter(), 0
            for _ in epoch:
                items += 1
            elapsed = time.perf_counter() - started
            stats = proxy_call(spec, "stats")
            cpu, server_cpu = own_cpu() - cpu, process_cpu(spec.get("server_pid")) - server_cpu
            result["epochs"].append(
                {
                    "name": ("warm" if number else "cold"),
                    "seconds": elapsed,
                    "items": items,
                    "rss": proc_status("self", "VmHWM"),
                    "rss_growth": proc_status("self", "VmHWM") - start_rss,
                    "gets": stats.get("gets"),
                    "peak_in_flight": stats.get("peak_in_flight"),
                    "cpu": {"run": cpu, "proxy": stats.get("cpu_seconds"), "server": server_cpu},
                }
            )
        return result
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def first_sample(spec: dict) -> dict:
    """Time to the first sample of rank 5 of 64, from a new dataset (imports done)."""
    fresh_process()
    proxy_call(spec, "reset")
    started = time.perf_counter()
    dataset = shardstream.StreamingDataset(
        spec["url"], storage_options=storage_options(spec["endpoint"], spec["env"]), num_replicas=64, rank=5
    )
    next(iter(dataset))
    elapsed = time.perf_counter() - started
    return {
        "seconds": elapsed,
        "gets": proxy_call(spec, "stats")["gets"],
        "rss": proc_status("self", "VmHWM"),
    }
