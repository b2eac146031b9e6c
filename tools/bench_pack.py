"""Pack throughput, side by side with the alternatives on the same samples, in one run.

    python tools/bench_pack.py            # full sizes (~5 minutes, ~5 GB of temp files)
    python tools/bench_pack.py --quick    # small sizes: a smoke run

1. From memory, one process: N samples of 3 small fields (~300 B) through
   ``shardstream.ShardWriter``, ``webdataset.ShardWriter`` and ``litdata.optimize``
   (if installed); samples/s, ratios, and the bytes each adds per sample beyond the
   payload. Targets: >= 150k samples/s, and 1.5x the fastest alternative.
2. From a folder of files (the CLI path, ``python -m shardstream pack``): small samples
   (a .txt and a .cls file each) and 1 MB samples (one .bin file each), against
   ``tar -cf`` of the same files. Targets: 1 MB samples within 1.25x of tar's time;
   ``--workers 2`` >= 1.6x one worker on small samples.

What each side does (printed with the results): shardstream writes tar shards, their
sha256, a sample-index sidecar per shard and the manifest, and makes every shard and
sidecar durable (fsync, in the background while the next shard is written) before the
manifest is written; webdataset.ShardWriter, litdata.optimize and ``tar -cf`` write
their files and never fsync (their bytes may still be only in the page cache when they
return). ``tar -cf, then sync`` adds a machine-wide ``sync`` to tar, the closest to what
shardstream guarantees.

Generated data lives in a temp dir that is removed at the end. Timings are wall-clock,
best of ``--repeat`` runs (folder commands: interleaved, each after a ``sync``), on
whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial

import webdataset as wds

from shardstream.pack import ShardWriter

SAMPLES: list[dict] = []  # module-level so litdata's forked worker sees them


def make_samples(n: int) -> list[dict]:
    text = b"The quick brown fox jumps over the lazy dog; " * 6
    return [
        {
            "__key__": f"{i:09d}",
            "txt": text[: 200 + i % 32],
            "cls": b"%d" % (i % 1000),
            "json": b'{"id": %d, "source": "bench", "lang": "en", "score": 0.%04d}' % (i, i % 9999),
        }
        for i in range(n)
    ]


def payload_bytes(samples: list[dict]) -> int:
    return sum(len(v) for s in samples for k, v in s.items() if k != "__key__")


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def best_of(repeat: int, run: Callable[[str], None], workdir: str) -> float:
    best = float("inf")
    for attempt in range(repeat):
        out = os.path.join(workdir, f"run{attempt}")
        start = time.perf_counter()
        run(out)
        best = min(best, time.perf_counter() - start)
        if attempt < repeat - 1:
            shutil.rmtree(out, ignore_errors=True)
    return best


def run_shardstream(out: str) -> None:
    with ShardWriter(out, shard_size="64MB") as writer:
        for sample in SAMPLES:
            writer.write(sample)


def run_webdataset(out: str) -> None:
    os.makedirs(out)
    with wds.ShardWriter(
        os.path.join(out, "shard-%06d.tar"), maxcount=10**9, maxsize=64e6, verbose=0
    ) as sink:
        for sample in SAMPLES:
            sink.write(sample)


def _litdata_item(i: int) -> dict:
    return SAMPLES[i]


def run_litdata(out: str) -> None:
    import litdata

    litdata.optimize(
        _litdata_item,
        inputs=list(range(len(SAMPLES))),
        output_dir=out,
        chunk_bytes="64MB",
        num_workers=1,
        verbose=False,
        mode="overwrite",
        start_method="fork",
    )


def litdata_installed() -> bool:
    try:
        import litdata  # noqa: F401
    except ImportError:
        return False
    return True


def bench_memory(n: int, repeat: int, workdir: str, with_litdata: bool) -> None:
    SAMPLES[:] = make_samples(n)
    payload = payload_bytes(SAMPLES)
    print(f"\n== from memory: {n:,} samples of 3 fields, {payload / n:.0f} B of payload each, one process")
    runs = {"shardstream.ShardWriter": run_shardstream, "webdataset.ShardWriter": run_webdataset}
    if with_litdata and litdata_installed():
        runs["litdata.optimize"] = run_litdata
    rates, overhead = {}, {}
    for name, run in runs.items():
        seconds = best_of(repeat, run, os.path.join(workdir, name))
        out = os.path.join(workdir, name, f"run{repeat - 1}")
        rates[name] = n / seconds
        overhead[name] = (folder_bytes(out) - payload) / n
        print(
            f"{name:<24} {rates[name]:>10,.0f} samples/s  {overhead[name]:>7.0f} B/sample beyond the payload"
        )
        if name == "shardstream.ShardWriter":
            shards = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".tar"))
            print(
                f"{'':<24} {'':>10}             {(shards - payload) / n:>7.0f} B/sample in the tar shards alone"
            )
        shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
    if not with_litdata:
        print(f"{'litdata.optimize':<24} skipped (--no-litdata)")
    elif "litdata.optimize" not in runs:
        print(f"{'litdata.optimize':<24} not installed")
    print(MEMORY_LEGEND)
    ours = rates.pop("shardstream.ShardWriter")
    for name, rate in rates.items():
        print(f"ratio shardstream / {name}: {ours / rate:.2f}x")
        ratio = overhead["shardstream.ShardWriter"] / overhead[name] if overhead[name] else float("nan")
        print(
            f"overhead per sample, shardstream / {name}: {ratio:.2f}x "
            f"({overhead['shardstream.ShardWriter']:.0f} vs {overhead[name]:.0f} B/sample beyond the payload)"
        )
    fastest = max(rates.values()) if rates else 0.0
    check("memory >= 150k samples/s", ours >= 150_000, f"{ours:,.0f}/s")
    if fastest:
        check("memory >= 1.5x the fastest alternative", ours >= 1.5 * fastest, f"{ours / fastest:.2f}x")


MEMORY_LEGEND = """\
  shardstream.ShardWriter: tar shards (512 B header + data padded to 512 B per field), sha256,
    a sample-index sidecar per shard, manifest; shards fsynced before the manifest
  webdataset.ShardWriter: tar shards through Python's tarfile (PAX headers); no index, no fsync
  litdata.optimize: its own chunk format (no per-field padding) and index.json; no fsync"""

FOLDER_LEGEND = """\
  tar -cf: one tar of the folder; no fsync (its bytes may be in the page cache only at exit)
  tar -cf, then sync: the same, then a machine-wide sync (everything on disk)
  shardstream pack: tar shards, sha256, sample-index sidecars, manifest; every shard and
    sidecar fsynced (in the background, as each shard is done) before the manifest is written;
    --workers N: N processes, this one included, list and size the folder in chunks and
    write shards; this one also puts the chunks in order and cuts the shards"""


def check(what: str, ok: bool, measured: str) -> None:
    print(f"target {what}: {'met' if ok else 'MISSED'} ({measured})")


def make_folder(root: str, n: int, size: int, fields: tuple[str, ...]) -> int:
    block = os.urandom(max(size, 1))
    total = 0
    for i in range(n):
        sub = os.path.join(root, f"{i // 1000:04d}")
        if i % 1000 == 0:
            os.makedirs(sub)
        for field in fields:
            data = (b"%09d " % i + block)[:size] if field != "cls" else b"%d" % (i % 10)
            with open(os.path.join(sub, f"{i:09d}.{field}"), "wb") as f:
                f.write(data)
            total += len(data)
    return total


def timed(command: list[str], *, then_sync: bool = False) -> float:
    """Seconds ``command`` takes (and a ``sync`` after it), starting with no dirty page."""
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    if then_sync:
        subprocess.run(["sync"], check=True)
    return time.perf_counter() - start


def warm(root: str) -> None:
    """Read every file once, so every tool reads from the page cache."""
    for directory, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                f.read()


def pack_command(src: str, dest: str, workers: int) -> list[str]:
    cli = [sys.executable, "-m", "shardstream", "pack", src, dest, "--shard-size", "32MB"]
    return [*cli, "--workers", str(workers), "--quiet"]


def bench_folder(
    label: str, n: int, size: int, fields: tuple[str, ...], workdir: str, *, workers: bool, repeat: int
) -> None:
    """``workers``: check the --workers 2 speedup; else check pack at its default worker
    count (the core count) against tar's time."""
    src = os.path.join(workdir, f"src-{label}")
    total = make_folder(src, n, size, fields)
    files = n * len(fields)
    print(f"\n== from a folder: {label}: {n:,} samples, {files:,} files, {total / 1e6:,.1f} MB")
    warm(src)
    tar_out = os.path.join(workdir, "out.tar")
    tar = ["tar", "-cf", tar_out, "-C", src, "."]
    runs: dict[str, Callable[[], float]] = {
        "tar -cf": lambda: timed(tar),
        "tar -cf, then sync": lambda: timed(tar, then_sync=True),
    }
    default = os.cpu_count() or 1
    for count in sorted({1, 2, default}):
        dest = os.path.join(workdir, f"ds-{label}-{count}")
        runs[f"shardstream pack --workers {count}"] = partial(timed, pack_command(src, dest, count))
    results = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):  # interleaved, so every tool meets the same moments of machine load
        for name, run in runs.items():
            results[name] = min(results[name], run())
            for path in (tar_out, *(os.path.join(workdir, f"ds-{label}-{c}") for c in {1, 2, default})):
                if os.path.isdir(path):
                    shutil.rmtree(path)
                elif os.path.exists(path):
                    os.remove(path)
    print(f"best of {repeat} interleaved runs each")
    for name, seconds in results.items():
        print(
            f"{name:<30} {seconds:>7.2f} s  {total / seconds / 1e6:>8.1f} MB/s  {n / seconds:>10,.0f} samples/s"
        )
    print(FOLDER_LEGEND)
    one = results["shardstream pack --workers 1"]
    print(f"ratio shardstream pack (1 worker) time / tar time: {one / results['tar -cf']:.2f}x")
    print(
        f"ratio shardstream pack (1 worker) time / tar + sync time: {one / results['tar -cf, then sync']:.2f}x"
    )
    if workers:
        speedup = one / results["shardstream pack --workers 2"]
        print(f"speedup --workers 2 over --workers 1: {speedup:.2f}x")
        check("small samples: --workers 2 >= 1.6x one worker", speedup >= 1.6, f"{speedup:.2f}x")
    else:
        # `shardstream pack` with no --workers uses every core, as a user runs it
        best = results[f"shardstream pack --workers {default}"]
        print(
            f"ratio shardstream pack (default, {default} workers) time / tar time: {best / results['tar -cf']:.2f}x"
        )
        check(
            "1 MB samples within 1.25x of tar",
            best <= 1.25 * results["tar -cf"],
            f"{best / results['tar -cf']:.2f}x, pack at its default --workers {default}",
        )
    shutil.rmtree(src)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each writer and command; the best counts"
    )
    parser.add_argument("--no-litdata", action="store_true", help="skip litdata.optimize (it starts torch)")
    parser.add_argument("--only", choices=["memory", "folder"], help="run one of the two parts")
    args = parser.parse_args()
    memory_n, small_n, large_n = (3_000, 1_000, 20) if args.quick else (100_000, 100_000, 2_000)
    print(
        f"bench_pack: {os.cpu_count()} cores, Python {sys.version.split()[0]}, load {os.getloadavg()[0]:.1f}"
    )
    workdir = tempfile.mkdtemp(prefix="bench-pack-")
    try:
        if args.only in (None, "memory"):
            bench_memory(memory_n, 1 if args.quick else args.repeat, workdir, not args.no_litdata)
        if args.only in (None, "folder"):
            repeat = 1 if args.quick else args.repeat
            bench_folder("small", small_n, 250, ("txt", "cls"), workdir, workers=True, repeat=repeat)
            bench_folder("1 MB", large_n, 2**20, ("bin",), workdir, workers=False, repeat=repeat)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
