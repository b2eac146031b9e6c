"""Engine writes against ``shardstream pack --workers`` on the same machine and rows, and the
driver's commit of 100,000 shards' messages.

    python tools/bench_engines.py            # 200,000 rows, 100,000-shard commit
    python tools/bench_engines.py --quick    # a smoke run (20,000 rows, 10,000 shards)

1. Rows/s: the same rows (a key, ~250 B of text and an int) written as tar shards of
   ``--samples-per-shard`` rows to a local folder by ``shardstream.pack`` from a JSON
   Lines file with ``workers=--workers`` (what ``shardstream pack --workers`` runs),
   by Spark (local[W], a Python Data Source: ``df.write.format("shardstream")``) and by
   Ray (local, num_cpus=W, ``write_datasink``), each from W partitions. The engines'
   start (JVM, Ray's processes) is timed apart and left out of rows/s; each engine's
   rows/s over pack's is printed: what the engine itself costs per row.
2. The commit: 100,000 shards' messages (1,000 partitions of 100 shards, each with a
   sidecar) picked, planned and turned into the manifest and the part records
   (``choose_attempts``, ``plan_commit``, the manifest's JSON): the driver's own work,
   no object moved. Target: under 30 s. Then the whole ``commit_job`` of
   ``--full-shards`` shards into a local folder (renames, sidecars and part records
   written durably, the manifest): what the store adds, per shard.

Timings are wall-clock, best of ``--repeat``, on whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

from shardstream.folder import ShardResult, part_prefix, shard_name, sidecar_name
from shardstream.manifest import ShardInfo
from shardstream.pack import pack
from shardstream.pack.attempt import AttemptMessage, WrittenShard
from shardstream.pack.commit import choose_attempts, plan_commit, prepare_job


def make_rows(n: int) -> list[dict]:
    text = "The quick brown fox jumps over the lazy dog; " * 6
    return [{"__key__": f"{i:09d}", "txt": text[: 220 + i % 32], "cls": i % 1000} for i in range(n)]


def best(run: Callable[[str], None], folder: str, repeat: int) -> float:
    times = []
    for i in range(repeat):
        dest = os.path.join(folder, f"run-{i}")
        start = time.perf_counter()
        run(dest)
        times.append(time.perf_counter() - start)
        shutil.rmtree(dest, ignore_errors=True)
    return min(times)


def bench_pack(rows: list[dict], folder: str, workers: int, per_shard: int, repeat: int) -> float:
    source = os.path.join(folder, "rows.jsonl")
    with open(source, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return best(
        lambda dest: pack(source, dest, format="tar", samples_per_shard=per_shard, workers=workers),
        folder,
        repeat,
    )


def bench_spark(
    rows: list[dict], folder: str, workers: int, per_shard: int, repeat: int
) -> tuple[float, float]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import shardstream.spark

    start = time.perf_counter()
    spark = SparkSession.builder.master(f"local[{workers}]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")
    shardstream.spark.register(spark)
    started = time.perf_counter() - start
    tuples = [(r["__key__"], r["txt"], r["cls"]) for r in rows]

    def run(dest: str) -> None:
        rdd = spark.sparkContext.parallelize(tuples, workers)
        frame = spark.createDataFrame(rdd, "__key__ string, txt string, cls long")
        frame.write.format("shardstream").option("format", "tar").option("samples_per_shard", per_shard).mode(
            "overwrite"
        ).save(dest)

    try:
        return best(run, folder, repeat), started
    finally:
        spark.stop()


def bench_ray(
    rows: list[dict], folder: str, workers: int, per_shard: int, repeat: int
) -> tuple[float, float]:
    import pandas as pd
    import ray

    import shardstream.ray

    start = time.perf_counter()
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    started = time.perf_counter() - start
    blocks = [
        pd.DataFrame(rows[p * len(rows) // workers : (p + 1) * len(rows) // workers]) for p in range(workers)
    ]

    def run(dest: str) -> None:
        ds = ray.data.from_pandas(blocks)
        ds.write_datasink(shardstream.ray.Datasink(dest, format="tar", samples_per_shard=per_shard))

    try:
        return best(run, folder, repeat), started
    finally:
        ray.shutdown()


def bench_commit(shards: int, per_partition: int = 100) -> tuple[float, int]:
    """Seconds to pick, plan and serialize the commit of ``shards`` shards' messages."""
    job = prepare_job("memory://bench-commit", format="tar", samples_per_shard=1000)
    sidecar = bytes(1024)
    messages = []
    for p in range(shards // per_partition):
        written = []
        for s in range(per_partition):
            name = shard_name(part_prefix(p), s, ".tar")
            info = ShardInfo(
                name, 1000, 1_000_000 + s, f"{p * per_partition + s:064x}", sidecar_name(name), 1024
            )
            written.append(WrittenShard(ShardResult(info, ("cls", "txt")), f"t/{p}/{name}", sidecar))
        messages.append(AttemptMessage(job.run, p, f"{p:016x}", 1000 * per_partition, tuple(written)))
    start = time.perf_counter()
    chosen = choose_attempts(job.run, messages)
    manifest, records = plan_commit(job, chosen)
    size = len(manifest.to_json()) + sum(len(r.to_json()) for r in records.values())
    return time.perf_counter() - start, size


def bench_full_commit(shards: int, per_partition: int = 100) -> float:
    """Seconds of ``commit_job`` of ``shards`` one-byte shards already in their attempts' folders."""
    from shardstream.pack.commit import begin_job, commit_job

    folder = tempfile.mkdtemp(prefix="bench-engines-")
    try:
        job = prepare_job(os.path.join(folder, "ds"), format="tar", samples_per_shard=1000)
        begin_job(job)
        messages = []
        for p in range(shards // per_partition):
            attempt = os.path.join(folder, "ds", job.folder, f"{p:05d}.a")
            os.makedirs(attempt)
            written = []
            for s in range(per_partition):
                name = shard_name(part_prefix(p), s, ".tar")
                with open(os.path.join(attempt, name), "wb") as f:
                    f.write(b"x")
                info = ShardInfo(name, 1000, 1, "0" * 64, sidecar_name(name), 1024)
                temp = f"{job.folder}/{p:05d}.a/{name}"
                written.append(WrittenShard(ShardResult(info, ("cls", "txt")), temp, bytes(1024)))
            messages.append(AttemptMessage(job.run, p, "a", 1000 * per_partition, tuple(written)))
        start = time.perf_counter()
        commit_job(job, messages)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--rows", type=int, default=None, help="rows to write (default 200,000; quick 20,000)"
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="pack workers, Spark threads, Ray CPUs (default 2)"
    )
    parser.add_argument("--samples-per-shard", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", choices=["rows", "commit"], help="run one of the two parts")
    parser.add_argument("--full-shards", type=int, default=None, help="shards of the whole local commit")
    args = parser.parse_args()
    n = args.rows or (20_000 if args.quick else 200_000)
    per_shard = min(args.samples_per_shard, max(1, n // (4 * args.workers)))
    if args.only != "commit":
        rows = make_rows(n)
        folder = tempfile.mkdtemp(prefix="bench-engines-")
        try:
            pack_s = bench_pack(rows, folder, args.workers, per_shard, args.repeat)
            spark_s, spark_start = bench_spark(rows, folder, args.workers, per_shard, args.repeat)
            ray_s, ray_start = bench_ray(rows, folder, args.workers, per_shard, args.repeat)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"{n:,} rows, tar shards of {per_shard:,} rows, {args.workers} workers, best of {args.repeat}")
        print(f"  pack --workers {args.workers}: {n / pack_s:>10,.0f} rows/s")
        print(
            f"  Spark local[{args.workers}]:    {n / spark_s:>10,.0f} rows/s  {pack_s / spark_s:.2f}x pack "
            f"(session start {spark_start:.1f} s, not counted)"
        )
        print(
            f"  Ray num_cpus={args.workers}:   {n / ray_s:>10,.0f} rows/s  {pack_s / ray_s:.2f}x pack "
            f"(ray.init {ray_start:.1f} s, not counted)"
        )
    if args.only != "rows":
        shards = 10_000 if args.quick else 100_000
        seconds, size = bench_commit(shards)
        verdict = "under" if seconds < 30 else "OVER"
        print(
            f"commit of {shards:,} shards' messages: {seconds:.2f} s ({verdict} 30 s), "
            f"manifest and part records {size / 1e6:.1f} MB"
        )
        full = args.full_shards or (1_000 if args.quick else 10_000)
        seconds = bench_full_commit(full)
        print(
            f"whole commit_job of {full:,} shards into a local folder: {seconds:.2f} s "
            f"({seconds / full * 1e3:.2f} ms a shard)"
        )


if __name__ == "__main__":
    main()
