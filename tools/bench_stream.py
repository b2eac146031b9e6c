"""Streaming throughput: shardstream against the alternatives, measured in the same run.

    python tools/bench_stream.py [--quick] [--only small,large,s3,loader,order,mix,wan] [--repeat 5]
        [--s3-server moto|seaweedfs] [--wan] [--order-topology 1x2] [--order-samples N]
        [--order-window SHARDS]

- small: 100k samples of three fields (~300 B): shardstream vs ``webdataset.WebDataset``
  on the same tar shards and ``litdata.StreamingDataset`` on the same samples in its own
  format; no decoding, no shuffle, one process, local files. Also shardstream with
  ``verify_checksums=False``: the cost of checking every read; with ``decode=True``
  (text, integer, JSON): the cost of decoding; and with ``local_reads="map"``: shards
  mapped rather than copied (the default copies, which a shard truncated in place cannot
  crash), checked and unchecked; and Parquet shards of the same samples (given as bytes,
  as a folder gives them), with and without decoding.
- large: 2k samples of 1 MB, local: shardstream vs ``open().read()`` of every shard.
- s3: large samples on moto's S3 server (a separate process on 127.0.0.1): shardstream (an
  epoch of an opened dataset, and a first epoch with a new dataset) vs boto3 ``get_object``
  of the same shards, one after another (the target) and in as many threads as
  shardstream's reader uses (for reference); and the time to the first batch.
- loader: ``shardstream.DataLoader`` with 2 workers: samples/s and peak RSS per worker.
- wan: object storage over a simulated network (latency, a bandwidth cap per response),
  shardstream against LitData, WebDataset and MosaicML Streaming, cold and warm epochs;
  not in the default sections (minutes); see tools/bench_wan.py, which also runs alone.
- mix: a mixture of three streams (50%, 30% and 20% of the shards, each taken once)
  against one dataset of the same shards, shuffled, one process: small samples
  undecoded and decoded, and large ones, local, and large ones on moto's S3; target
  mixture / one dataset >= 0.9x.
  Also the peak RSS of an epoch of each, in a fresh process (the whole process at its
  peak in the epoch, and what the epoch added to it); target mixture / one dataset <= 1.1x.
- order: ``order="global"`` (default read lanes, NOTE [ Global order ]) against the
  local order, shuffled, through ``shardstream.DataLoader`` with 2 workers, on the small
  and the large samples on moto's S3 (loopback), or SeaweedFS's with ``--s3-server
  seaweedfs``, read through a WAN-shaped proxy with ``--wan``; ``--order-topology 8x4``
  measures rank 0 of 8 ranks with 4 workers, ``--order-samples`` sets the small samples'
  count (10,000 to a shard), ``--order-window 4`` also runs the global order with a
  window of 4 shards (its default before NOTE [ Global window ]; its requests fall with
  the window: NOTE [ Lane groups ]); target global / local >= 0.9x. Also the peak RSS
  an epoch adds to one process reading rank 0 of 1 and of R ranks without workers, each
  order: the global order's default window is longer on small samples (NOTE [ Global
  window ]), and a worker whose share of one is more than the local order's window
  holds that share.

How rates are measured (the machine is shared and noisy): each contender runs once
untimed (warm-up: page cache, imports, connections, server-side caches), then
``--repeat`` timed rounds; in each round every contender runs once, in an order that
rotates from round to round, so a burst of load hits all of them alike. A rate is the
median over the rounds, and a ratio ``shardstream / other`` is the median of the ratios
within each round (paired), which a slow drift of the machine's load cancels out of.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import itertools
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import shardstream
from shardstream.dataset.fetch import READ_THREADS
from shardstream.pack import ShardWriter

MB = 1 << 20


@dataclass(frozen=True)
class Rates:
    """Items/s and CPU seconds of each contender in each timed round (see the docstring)."""

    rounds: list[dict[str, float]]
    cpu: list[dict[str, float]]

    def rate(self, name: str) -> float:
        return statistics.median(r[name] for r in self.rounds)

    def cpu_time(self, name: str) -> float:
        return statistics.median(r[name] for r in self.cpu)

    def ratios(self, others: list[str], ours: str = "shardstream") -> list[float]:
        """Per round: ``ours`` / the best of ``others`` in that round."""
        return [r[ours] / max(r[o] for o in others) for r in self.rounds]

    def ratio(self, others: list[str], ours: str = "shardstream") -> str:
        """The median paired ratio, and the spread over rounds (how noisy the machine was)."""
        ratios = self.ratios(others, ours)
        return f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})"

    @property
    def names(self) -> list[str]:
        return list(self.rounds[0])


def measure(contenders: dict[str, Callable[[], int]], repeat: int) -> Rates:
    """Warm up each contender, then ``repeat`` rounds in rotating order (see the docstring)."""
    for run in contenders.values():
        run()
    names = list(contenders)
    rounds: list[dict[str, float]] = []
    cpu: list[dict[str, float]] = []
    for number in range(max(1, repeat)):
        rates, seconds = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
        for name in names[number % len(names) :] + names[: number % len(names)]:
            started, cpu_started = time.perf_counter(), time.process_time()
            count = contenders[name]()
            rates[name] = count / (time.perf_counter() - started)
            seconds[name] = time.process_time() - cpu_started
        rounds.append(rates)
        cpu.append(seconds)
    return Rates(rounds, cpu)


def report(title: str, measured: Rates, unit: str = "samples/s") -> None:
    """Median rates, paired ratios, and this process's CPU time per run (all threads, user
    + sys; a server process is not counted): less load-dependent than the rates. Rows
    named ``shardstream...`` are ours; each other row gets the ratio of each of ours to it."""
    print(f"\n{title}; median of {len(measured.rounds)} rounds")
    ours = [name for name in measured.names if name.startswith("shardstream")]
    width = max(12, *map(len, measured.names))
    for name in measured.names:
        cpu = f"   (CPU {measured.cpu_time(name):.2f} s/run)"
        print(f"  {name:<{width}} {measured.rate(name):>12,.0f} {unit}{cpu}")
        if name not in ours:
            for mine in ours:
                print(f"  {'':<{width}}   {mine} / {name} = {measured.ratio([name], mine)}")


# The command line that --record stores with each result (tools/results.py); "" records nothing.
RECORD = ""


def paired(rates: Rates, others: list[str], ours: str = "shardstream") -> float:
    return statistics.median(rates.ratios(others, ours))


def recorded(claim: str, figures: dict[str, float], ratios: dict[str, float] | None = None) -> None:
    """Append a result to the results file when run with --record."""
    if RECORD:
        from results import record

        record(claim, RECORD, figures, ratios=ratios)


def count_samples(iterable) -> int:  # type: ignore[no-untyped-def]
    count = 0
    for _ in iterable:
        count += 1
    return count


# -- data -------------------------------------------------------------------------------------


def small_sample(i: int) -> dict:
    return {
        "__key__": f"{i:09d}",
        "txt": (b"lorem ipsum dolor sit amet %d " % i) * 6,
        "cls": b"%d" % (i % 1000),
        "json": b'{"id": %d, "source": "bench", "tags": ["a", "b", "c"]}' % i,
    }


def write_tar(url: str, samples, per_shard: int, options: dict | None = None, format: str = "tar") -> None:  # type: ignore[no-untyped-def]
    with ShardWriter(url, format=format, samples_per_shard=per_shard, storage_options=options) as writer:
        for sample in samples:
            writer.write(sample)


def tar_paths(url: str) -> list[str]:
    return [os.path.join(url, s.path) for s in shardstream.StreamingDataset(url).manifest.shards]


def write_litdata(directory: str, samples) -> bool:  # type: ignore[no-untyped-def]
    try:
        from litdata.streaming.writer import BinaryWriter
    except ImportError:
        return False
    writer = BinaryWriter(directory, chunk_bytes="64MB")
    for i, sample in enumerate(samples):
        writer.add_item(i, sample)
    writer.done()
    writer.merge(1, 0)
    return True


# -- the benchmarks ---------------------------------------------------------------------------


def bench_small(work: str, count: int, repeat: int) -> None:
    url = os.path.join(work, "small")
    write_tar(url, map(small_sample, range(count)), 10_000)
    parquet = os.path.join(work, "small-parquet")  # the same samples, given as bytes, as a folder gives them
    write_tar(parquet, map(small_sample, range(count)), 10_000, format="parquet")
    contenders: dict[str, Callable[[], int]] = {
        "shardstream": lambda: count_samples(shardstream.StreamingDataset(url, shuffle=False, decode=False)),
        # the same without the block CRCs of NOTE [ Checksummed reads ]: what checking costs
        "shardstream unchecked": lambda: count_samples(
            shardstream.StreamingDataset(url, shuffle=False, decode=False, verify_checksums=False)
        ),
        # decoded (text, integer, JSON; NOTE [ Bulk decode ]): what decoding costs
        "shardstream decoded": lambda: count_samples(shardstream.StreamingDataset(url, shuffle=False)),
        # Parquet shards of the same samples (typed columns: NOTE [ Typed columns ])
        "shardstream parquet": lambda: count_samples(
            shardstream.StreamingDataset(parquet, shuffle=False, decode=False)
        ),
        "shardstream parquet decoded": lambda: count_samples(
            shardstream.StreamingDataset(parquet, shuffle=False)
        ),
        # shards mapped instead of copied (local_reads="map", NOTE [ Getting the bytes ])
        "shardstream mapped": lambda: count_samples(
            shardstream.StreamingDataset(url, shuffle=False, decode=False, local_reads="map")
        ),
        "shardstream mapped unchecked": lambda: count_samples(
            shardstream.StreamingDataset(
                url, shuffle=False, decode=False, local_reads="map", verify_checksums=False
            )
        ),
    }
    import webdataset as wds

    paths = tar_paths(url)
    contenders["webdataset"] = lambda: count_samples(
        wds.WebDataset(paths, shardshuffle=False, empty_check=False)
    )
    litdata_dir = os.path.join(work, "small-litdata")
    if write_litdata(litdata_dir, map(small_sample, range(count))):
        import litdata

        contenders["litdata"] = lambda: count_samples(litdata.StreamingDataset(litdata_dir, shuffle=False))
    else:
        print("litdata: not installed")
    rates = measure(contenders, repeat)
    report(f"small samples: {count:,} x ~300 B, 3 fields, local, no decode, no shuffle, one process", rates)
    others = [name for name in rates.names if not name.startswith("shardstream")]
    print(f"  shardstream / best other = {rates.ratio(others)}; target >= 2x (copies: the default here)")
    print(f"  shardstream mapped / best other = {rates.ratio(others, 'shardstream mapped')}; target >= 2x")
    # A tar member takes a 512 B header and pads to 512 B: ~300 B samples are ~10x their
    # bytes on disk, and a copy read moves them all. Parquet shards of the same samples
    # are as compact as LitData's own format.
    parquet_ratio = rates.ratio(others, "shardstream parquet")
    print(f"  shardstream Parquet / best other = {parquet_ratio}; target >= 2x (copies: the default here)")
    print(f"  checked / unchecked reads = {rates.ratio(['shardstream unchecked'])} (copies); target >= 0.95x")
    mapped = rates.ratio(["shardstream mapped unchecked"], "shardstream mapped")
    print(f"  checked / unchecked reads = {mapped} (mapped); target >= 0.95x")
    print(
        f"  decode=True / decode=False = {rates.ratio(['shardstream'], 'shardstream decoded')}; target >= 0.9x"
    )
    decoded = rates.ratio(["shardstream parquet"], "shardstream parquet decoded")
    print(f"  decode=True / decode=False = {decoded} (Parquet); target >= 0.9x")
    if others:
        recorded(
            "local-small",
            {name: rates.rate(name) for name in rates.names},
            {
                "shardstream / best other, copies": paired(rates, others),
                "shardstream / best other, mapped": paired(rates, others, "shardstream mapped"),
                "shardstream Parquet / best other, copies": paired(rates, others, "shardstream parquet"),
            },
        )
    checks = {
        "checked / unchecked, copies": paired(rates, ["shardstream unchecked"]),
        "checked / unchecked, mapped": paired(rates, ["shardstream mapped unchecked"], "shardstream mapped"),
    }
    recorded("checks-cost", {}, checks)
    # decode=True's limit: decode=False plus parsing the same field values alone, with the
    # parsers shardstream uses (str, int, orjson where installed), each value once
    parse = measure({"parse alone": _parse_alone(count)}, repeat).rate("parse alone")
    tar_limit, parquet_limit = (
        1 / (1 + rates.rate(name) / parse) for name in ("shardstream", "shardstream parquet")
    )
    print(
        f"  decode=True's limit, decode=False plus the parse alone ({parse:,.0f} samples/s): "
        f"{tar_limit:.2f}x (tar), {parquet_limit:.2f}x (Parquet)"
    )
    decode = {
        "decode=True / decode=False": paired(rates, ["shardstream"], "shardstream decoded"),
        "decode=True / decode=False, Parquet": paired(
            rates, ["shardstream parquet"], "shardstream parquet decoded"
        ),
        "limit: decode=False plus the parse alone, tar": tar_limit,
        "limit: decode=False plus the parse alone, Parquet": parquet_limit,
    }
    recorded("decode-cost", {}, decode)


def _parse_alone(count: int) -> Callable[[], int]:
    """Parsing the small samples' field values alone, as decode=True does (text, integer,
    JSON; NOTE [ JSON by orjson ] in shardstream/dataset/decode.py), nothing read."""
    try:
        from orjson import loads
    except ImportError:
        from json import loads
    samples = [small_sample(i) for i in range(count)]
    texts, classes, documents = ([s[k] for s in samples] for k in ("txt", "cls", "json"))

    def parse() -> int:  # a column at a time, in chunks of samples let go as they are parsed
        for lo in range(0, count, 64):
            list(map(bytes.decode, texts[lo : lo + 64]))
            list(map(int, classes[lo : lo + 64]))
            list(map(loads, documents[lo : lo + 64]))
        return count

    return parse


def large_sample(i: int) -> dict:
    return {"__key__": f"{i:07d}", "bin": os.urandom(MB - 64), "cls": b"%d" % i}


def bench_large(work: str, count: int, repeat: int) -> str:
    url = os.path.join(work, "large")
    write_tar(url, map(large_sample, range(count)), 64)
    paths = tar_paths(url)

    def raw() -> int:
        for path in paths:
            with open(path, "rb") as f:
                f.read()
        return count

    def ours() -> int:
        total = 0
        for sample in shardstream.StreamingDataset(url, shuffle=False, decode=False):
            total += len(sample["bin"])
        return count

    rates = measure({"shardstream": ours, "raw read": raw}, repeat)
    report(f"large samples: {count:,} x 1 MB, local (page cache warm), no decode", rates)
    print(f"  = {rates.rate('shardstream') * MB / 1e9:.2f} GB/s (target: >= 0.9x of raw read)")
    return url


class MotoProcess:
    """moto's S3 server in its own process (tools/local_s3.py), so it does not share our GIL."""

    def __init__(self, bucket: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tools" / "local_s3.py"), "--bucket", bucket],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.env: dict[str, str] = {}
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("export "):
                name, _, value = line[len("export ") :].strip().partition("=")
                self.env[name] = value
            if line.startswith("#"):
                break

    def options(self) -> dict:
        return {
            "endpoint_url": self.env["AWS_ENDPOINT_URL"],
            "key": self.env["AWS_ACCESS_KEY_ID"],
            "secret": self.env["AWS_SECRET_ACCESS_KEY"],
        }

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def bench_s3(count: int, repeat: int) -> None:
    import boto3

    server = MotoProcess("bench")
    try:
        options, url = server.options(), "s3://bench/large"
        write_tar(url, map(large_sample, range(count)), 64, options)
        manifest = shardstream.StreamingDataset(url, storage_options=options).manifest
        client = boto3.client(
            "s3",
            endpoint_url=options["endpoint_url"],
            aws_access_key_id=options["key"],
            aws_secret_access_key=options["secret"],
            region_name="us-east-1",
        )

        keys = [f"large/{shard.path}" for shard in manifest.shards]

        def get(key: str) -> int:
            return len(client.get_object(Bucket="bench", Key=key)["Body"].read())

        def boto() -> int:
            for key in keys:
                get(key)
            return count

        def boto_threads() -> int:  # what a hand-written parallel reader gets (for reference)
            list(pool.map(get, keys))
            return count

        def first_epoch() -> int:  # a new dataset: its manifest, sidecars and S3 client too
            return count_samples(
                shardstream.StreamingDataset(url, storage_options=options, shuffle=False, decode=False)
            )

        # "shardstream": one more epoch of a dataset already opened, as boto3 gets a client
        # already made; every run reads all the shard bytes again, but the sidecars only in
        # the dataset's first epoch (NOTE [ Sidecars across epochs ] in dataset/reader.py).
        dataset = shardstream.StreamingDataset(url, storage_options=options, shuffle=False, decode=False)
        with concurrent.futures.ThreadPoolExecutor(READ_THREADS) as pool:
            rates = measure(
                {
                    "shardstream": lambda: count_samples(dataset),
                    "shardstream 1st epoch": first_epoch,
                    "boto3": boto,
                    f"boto3 x{READ_THREADS}": boto_threads,
                },
                repeat,
            )
        report(f"S3 (moto, another process, loopback): {count:,} x 1 MB, no decode", rates)
        print(f"  = {rates.rate('shardstream') * MB / 1e6:.0f} MB/s; target: shardstream / boto3 >= 0.9x")
        for workers in (0, 2):
            started = time.perf_counter()
            dataset = shardstream.StreamingDataset(url, storage_options=options, decode=False)
            loader = shardstream.DataLoader(dataset, batch_size=8, num_workers=workers, collate_fn=list)
            iterator = iter(loader)
            next(iterator)
            print(
                f"  time to first batch (8 x 1 MB, shuffled, {workers} workers): {time.perf_counter() - started:.2f} s"
            )
            # Stop the workers now: left to the garbage collector, the iterator may be
            # collected in a process forked later (the loader benchmark's workers).
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del iterator, loader
    finally:
        server.stop()


def proc_status(pid: int | str, field: str) -> int:
    """A ``/proc/PID/status`` memory field (``VmHWM``: peak RSS, ``VmRSS``) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def loader_epoch(url: str, batch_size: int) -> tuple[float, list[int], int, int]:
    """(samples/s, peak RSS of each worker, samples, RSS of the main process when the
    workers were forked) for one epoch with 2 persistent workers."""
    dataset = shardstream.StreamingDataset(url, decode=False)
    loader = shardstream.DataLoader(
        dataset, batch_size=batch_size, num_workers=2, collate_fn=list, persistent_workers=True
    )
    started, count = time.perf_counter(), 0
    forked_from = proc_status("self", "VmRSS")
    iterator = iter(loader)
    for batch in iterator:
        count += len(batch)
    elapsed = time.perf_counter() - started
    peaks = [proc_status(w.pid, "VmHWM") for w in iterator._workers]  # type: ignore[attr-defined]
    iterator._shutdown_workers()  # type: ignore[attr-defined]
    return count / elapsed, peaks, count, forked_from


def bench_loader(small_url: str, large_url: str, large_bytes: int) -> None:
    print("\nDataLoader, 2 workers (fork), shuffled, no decode, whole epoch with worker start-up:")
    for name, url, batch in (("small", small_url, 256), ("large", large_url, 8)):
        rate, peaks, count, base = loader_epoch(url, batch)
        plan = shardstream.StreamingDataset(url).make_plan(consume=False)
        window_mb = plan.shuffle_window * shardstream.StreamingDataset(url).manifest.num_bytes / count / MB
        print(
            f"  {name:<6} {rate:>10,.0f} samples/s ({count:,} samples, batch {batch}); peak RSS per worker "
            f"{', '.join(f'{p / MB:,.0f}' for p in peaks)} MB, forked from {base / MB:,.0f} MB; "
            f"window {plan.shuffle_window:,} samples = {window_mb:,.0f} MB of shards"
        )
    print(
        f"  (the large dataset is {large_bytes / MB:,.0f} MB; a worker holds its window and one prefetched)"
    )


def order_server(kind: str):  # type: ignore[no-untyped-def]
    """The order section's S3 server on 127.0.0.1 (NOTE [ Order bench servers ])."""
    if kind == "moto":
        return MotoProcess("order")
    from shardstream.testing.servers import SeaweedFS

    server = SeaweedFS()
    server.start()
    server.create_bucket("order")
    return server


# NOTE [ Order bench servers ]
# The global order makes several times the local order's ranged GETs on small samples
# (one chunk of each of the default lanes per batch). moto answers a ranged GET by
# copying the whole object in Python, so on moto a small read costs as much as a whole
# shard and the section measures moto more than us; SeaweedFS (a real S3 server in Go)
# serves a range for the cost of the range. ``--s3-server`` picks which one. ``--wan``
# reads through ``shardstream.testing.wanproxy`` in front of it (tools/bench_wan.py's
# network: 30 ms before each request, 40 MB/s per response): there a request costs a
# latency, not only the server's work, as on a remote store.
ORDER_BATCHES = (256, 8)  # the global batches of the small and the large samples


def order_topology(text: str) -> tuple[int, int]:
    """``RxW`` (``--order-topology``): R ranks dividing both global batches, W >= 0 workers."""
    ranks, sep, workers = text.lower().partition("x")
    if not (sep and ranks.isdigit() and workers.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not RxW, e.g. 8x4")
    topology = int(ranks), int(workers)
    if topology[0] < 1 or any(batch % topology[0] for batch in ORDER_BATCHES):
        raise argparse.ArgumentTypeError(
            f"{topology[0]} ranks do not divide the global batches {ORDER_BATCHES}"
        )
    return topology


def bench_order(
    small: int,
    large: int,
    repeat: int,
    server_kind: str = "moto",
    wan: bool = False,
    topology: tuple[int, int] = (1, 2),
    window_shards: int | None = None,
) -> None:
    """Global against local order; ``topology``: rank 0 of ``R`` ranks, ``W`` DataLoader
    workers; ``window_shards``: also the global order with a window of that many shards."""
    ranks, workers = topology
    server, proxy = order_server(server_kind), None
    ratios: dict[str, float] = {}
    try:
        options = server.options() if server_kind == "moto" else server.storage_options()
        where = f"{server_kind} S3"
        read_options = options
        if wan:  # NOTE [ Order bench servers ]: reads through the WAN proxy, writes straight
            from bench_wan import BANDWIDTH, LATENCY, ProxyProcess

            proxy = ProxyProcess(options["endpoint_url"], LATENCY, BANDWIDTH)
            read_options = dict(options, endpoint_url=proxy.endpoint)
            where += f" behind {LATENCY * 1000:.0f} ms, {BANDWIDTH / 1e6:.0f} MB/s per response"
        if ranks > 1:
            where += f", rank 0 of {ranks}"
        small_batch, large_batch = ORDER_BATCHES
        cases = (
            ("small", small_sample, small, 10_000, small_batch),
            ("large", large_sample, large, 16, large_batch),
        )
        for name, make, count, per_shard, batch in cases:
            url = f"s3://order/{name}"
            write_tar(url, map(make, range(count)), per_shard, options)
            orders = {"local order": {}, "shardstream global": dict(order="global", global_batch_size=batch)}
            if window_shards is not None:
                wide = dict(orders["shardstream global"], shuffle_window=window_shards * per_shard)
                orders[f"shardstream global, window of {window_shards} shards"] = wide
            contenders = {
                label: functools.partial(loader_samples, url, read_options, batch, order, ranks, workers)
                for label, order in orders.items()
            }
            rates = measure(contenders, repeat)
            report(
                f"order, {name}: {count:,} samples on {where}, DataLoader {workers} workers, batch {batch}",
                rates,
            )
            print("  target: shardstream global / local order >= 0.9x")
            shape = f"{name}, rank 0 of {ranks} x {workers} workers"
            ratios[shape] = paired(rates, ["local order"], "shardstream global")
            for world in sorted({1, ranks}):
                added = {
                    label: epoch_memory(url, options, rank=0, num_replicas=world, **order)[1]
                    for label, order in orders.items()
                }
                shown = ", ".join(f"{label} +{size / MB:,.0f} MB" for label, size in added.items())
                print(f"  peak RSS an epoch adds, rank 0 of {world} in one process (no workers): {shown}")
                if world == 1 and name == "small":
                    recorded("global-order-memory", {label: size / MB for label, size in added.items()})
        recorded("global-order", {}, ratios)
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()


def bench_mix(work: str, small: int, large: int, repeat: int) -> None:
    """A mixture of three streams against one dataset of the same samples (see the docstring)."""
    ratios: dict[str, float] = {}
    mix_case("small", small_sample, small, small // 10, work, None, repeat, ratios)  # 10 shards
    mix_case("large", large_sample, large, large // 10, work, None, repeat, ratios)
    server = MotoProcess("mix")
    try:
        on_s3 = "large on moto S3"
        mix_case(on_s3, large_sample, large, large // 10, "s3://mix", server.options(), repeat, ratios)
    finally:
        server.stop()
    recorded("mixture-cost", {}, ratios)


def mix_case(
    name: str,
    make: Callable[[int], dict],
    count: int,
    per_shard: int,
    base: str,
    options: dict | None,
    repeat: int,
    ratios: dict[str, float],
) -> None:
    """One dataset of ``count`` samples, and the same samples as three streams under
    ``base``; the mixture's ratios to one dataset go into ``ratios``."""
    slug = name.replace(" ", "-")
    one, parts = f"{base}/mix-{slug}-one", []
    write_tar(one, map(make, range(count)), per_shard, options)
    shards = -(-count // per_shard)  # cut at shard boundaries: the same shards, as streams
    cuts = [0, shards // 2 * per_shard, shards * 8 // 10 * per_shard, count]
    for number, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        parts.append(f"{base}/mix-{slug}-{number}")
        write_tar(parts[-1], map(make, range(lo, hi)), per_shard, options)
    for decode in (False, True) if name == "small" else (False,):
        # opened once: an epoch of an opened dataset (its manifests, clients and sidecars made)
        contenders = {
            "one dataset": functools.partial(count_samples, opened(one, options, decode)),
            "shardstream mixture": functools.partial(count_samples, opened(parts, options, decode)),
        }
        rates = measure(contenders, repeat)
        what = "decoded" if decode else "no decode"
        report(f"mix, {name}: {count:,} samples as 1 dataset or 3 streams, shuffled, {what}", rates)
        print("  target: mixture / one dataset >= 0.9x")
        ratios[f"throughput, {name}, {what}"] = paired(rates, ["one dataset"], "shardstream mixture")
    peaks = {label: epoch_memory(spec, options) for label, spec in (("one dataset", one), ("mixture", parts))}
    whole = peaks["mixture"][0] / peaks["one dataset"][0]
    added = peaks["mixture"][1] / max(1, peaks["one dataset"][1])
    print(
        f"  peak RSS of an epoch, {name}: one dataset {peaks['one dataset'][0] / MB:,.0f} MB "
        f"(+{peaks['one dataset'][1] / MB:,.0f} MB over its start), mixture {peaks['mixture'][0] / MB:,.0f} MB "
        f"(+{peaks['mixture'][1] / MB:,.0f} MB); mixture / one dataset = {whole:.2f}x "
        f"(what the epoch added: {added:.2f}x); target <= 1.1x"
    )
    ratios[f"peak RSS, {name}"] = whole


def opened(source: str | list[str], options: dict | None, decode: bool) -> shardstream.StreamingDataset:
    """A shuffled dataset, or a mixture of a list of URLs, its first epoch taken."""
    streams = source if isinstance(source, str) else [shardstream.Stream(url) for url in source]
    dataset = shardstream.StreamingDataset(streams, storage_options=options, decode=decode)
    count_samples(dataset)
    return dataset


_EPOCH_MEMORY = """
import json, sys
sys.path.insert(0, sys.argv[1])
import shardstream
spec, options, more = json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
source = spec if isinstance(spec, str) else [shardstream.Stream(url) for url in spec]
dataset = shardstream.StreamingDataset(source, storage_options=options, decode=False, **more)
len(dataset)  # manifests read, plan made: what the epoch starts from
def field(name):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(name + ":"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here: what the imports took is not the epoch's
start = field("VmRSS")
count = sum(1 for _ in dataset)
print(json.dumps([field("VmHWM"), field("VmHWM") - start, count]))
"""


def epoch_memory(spec: str | list[str], options: dict | None, **dataset: Any) -> tuple[int, int]:
    """(peak RSS, peak RSS - RSS before the epoch) of one undecoded epoch in a fresh
    process, the peak counted from the epoch's start; ``dataset``: more of
    ``StreamingDataset``'s options (rank, num_replicas, order, ...)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _EPOCH_MEMORY,
            str(ROOT),
            json.dumps(spec),
            json.dumps(options),
            json.dumps(dataset),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    peak, added, _ = json.loads(done.stdout)
    return peak, added


def loader_samples(url: str, options: dict, batch: int, order: dict, ranks: int = 1, workers: int = 2) -> int:
    """One shuffled epoch of rank 0 of ``ranks`` through a DataLoader with ``workers``
    workers, in the given order (global batches of ``batch``)."""
    dataset = shardstream.StreamingDataset(
        url, storage_options=options, decode=False, num_replicas=ranks, rank=0, **order
    )
    loader = shardstream.DataLoader(dataset, batch_size=batch // ranks, num_workers=workers, collate_fn=list)
    return sum(len(b) for b in loader)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, one repeat")
    parser.add_argument(
        "--only",
        default="small,large,s3,loader,order,mix",
        help="sections: small, large, loader, s3, order, mix, wan (wan: only when named)",
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds after the warm-up")
    parser.add_argument(
        "--s3-server",
        choices=("moto", "seaweedfs"),
        default="moto",
        help="the order section's S3 server on 127.0.0.1 (NOTE [ Order bench servers ])",
    )
    parser.add_argument(
        "--order-topology",
        type=order_topology,
        default=(1, 2),
        help="the order section's RxW: rank 0 of R ranks, W DataLoader workers; R divides both of "
        f"its global batches ({ORDER_BATCHES[0]} and {ORDER_BATCHES[1]})",
    )
    parser.add_argument(
        "--order-samples",
        type=int,
        help="the order section's ~300 B samples, 10,000 to a shard (default: the small section's)",
    )
    parser.add_argument(
        "--order-window",
        type=int,
        metavar="SHARDS",
        help="the order section also runs the global order with a window of SHARDS shards "
        "(its default is 16 shards of samples under 64 KiB, else 4: NOTE [ Global window ])",
    )
    parser.add_argument(
        "--wan",
        action="store_true",
        help="the order section reads through a WAN-shaped proxy (NOTE [ Order bench servers ])",
    )
    parser.add_argument(
        "--record", action="store_true", help="append the results to docs/benchmarks.json (tools/results.py)"
    )
    args = parser.parse_args()
    if args.record and args.quick:
        parser.error("--record keeps a run's figures as the current ones: not those of a --quick run")
    if args.record:
        from results import command_line

        global RECORD
        RECORD = command_line()
    if args.order_samples is not None and args.order_samples < 1:
        parser.error("--order-samples must be at least 1")
    if args.order_window is not None and args.order_window < 1:
        parser.error("--order-window must be at least 1 shard")
    only = set(args.only.split(","))
    repeat = 1 if args.quick else args.repeat
    small, large, s3 = (20_000, 128, 128) if args.quick else (100_000, 2_000, 2_000)
    work = tempfile.mkdtemp(prefix="bench-stream-")
    try:
        if "small" in only or "loader" in only:
            bench_small(work, small, repeat) if "small" in only else write_tar(
                os.path.join(work, "small"), map(small_sample, range(small)), 10_000
            )
        if "large" in only or "loader" in only:
            if "large" in only:
                bench_large(work, large, repeat)
            else:
                write_tar(os.path.join(work, "large"), map(large_sample, range(large)), 64)
        if "loader" in only:  # before s3, whose 2 GB would swell the RSS that workers fork from
            bench_loader(os.path.join(work, "small"), os.path.join(work, "large"), large * MB)
        if "s3" in only:
            bench_s3(s3, repeat)
        if "order" in only:
            samples = small if args.order_samples is None else args.order_samples
            bench_order(
                samples, s3 // 8, repeat, args.s3_server, args.wan, args.order_topology, args.order_window
            )
        if "mix" in only:
            bench_mix(work, small, large // 6, repeat)  # 333 large samples: 10 shards of 33
        if "wan" in only:
            import bench_wan

            bench_wan.bench_wan(args.quick, 1 if args.quick else min(args.repeat, 3), record=RECORD)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
