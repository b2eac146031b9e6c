"""One epoch with shardstream of two revisions, side by side: issue 9's memory and small-sample targets.

    python tools/bench_memory.py [BASE] [--head .] [--rounds 5] [--samples 150] [--shuffle] [--small]

Issue 9 bounds how much more the reader holds than the reader before it ("today's" when
it was filed: BASE, by default 5791d66^). ``tools/bench_wan.py`` prints each run's RSS
growth against ``read_concurrency=1`` on the same tree, which is not that reader, and a
tree's own benchmarks cannot run the other's code (``tools/bench_compare.py`` runs each
revision's own tools). So this runs the same epoch in fresh Python processes, each
importing shardstream from one revision's checkout (``PYTHONPATH``; ``.`` is the working
tree), the two alternating round by round:

- ``--samples`` x 1 MB samples, 30 to a tar shard, on moto's S3 server on loopback
  (``tools/local_s3.py``), written once by BASE's writer (an older reader cannot read a
  newer manifest, so BASE is the older revision); no proxy: the wire outruns the reader's
  checks and a caller that drops each sample, where a reader holds the most.
  ``--small``: 20,000 samples of three fields (~190 B of payload), 5,000 to a shard, for the target that small samples on loopback stream within 5% of the reader
  before issue 9.
- ``StreamingDataset(..., shuffle=False, decode=False)`` (``--shuffle``: shuffled), one
  process, every sample taken and dropped.
- A run's figure is how much its RSS grew in the epoch: the peak (``VmHWM``) reset by
  ``/proc/self/clear_refs`` once the dataset is open (``len()``: its manifest read, its
  storage made), read after the last sample; the rate is the samples over the same span.
  What the process imported and opened before is left out.

It prints each side's median growth, every round's, and head minus base (the target:
at most +64 MB); and each side's rate (samples over the epoch's seconds, a median) and
head / base paired within rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MB = 2**20
PER_SHARD = {"large": 30, "small": 5_000}
TARGET_MB = 64
TARGET_RATE = 0.95  # --small: within 5% of the reader before issue 9


# status() and sample("large") are bench_stream's proc_status and bench_wan_runs' large_sample
# again: a child must not import those tools, which put this checkout's shardstream first
# on sys.path, before the revision it runs.
def status(key: str) -> int:
    """A ``/proc/self/status`` size, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def sample(kind: str, i: int) -> dict:
    """Sample ``i`` of a corpus: 1 MB, or three fields of ~190 B in all."""
    if kind == "large":
        return {"__key__": f"{i:07d}", "bin": random.Random(i).randbytes(MB - 64), "cls": b"%d" % i}
    text = b"sample %d of the small corpus, " % i
    return {"__key__": f"{i:09d}", "txt": text * 5, "cls": b"%d" % (i % 1000), "json": b'{"id": %d}' % i}


def write(url: str, options: dict, samples: int, kind: str) -> None:
    """The corpus, with the shardstream on ``PYTHONPATH`` (BASE's)."""
    from shardstream.pack import ShardWriter

    per_shard = PER_SHARD[kind]
    with ShardWriter(url, format="tar", samples_per_shard=per_shard, storage_options=options) as writer:
        for i in range(samples):
            writer.write(sample(kind, i))


def epoch(url: str, options: dict, shuffle: bool) -> dict:
    """One epoch with the shardstream on ``PYTHONPATH``: its RSS growth and time."""
    import torch  # noqa: F401  (imported before the epoch by either tree: left out of the figure)

    import shardstream

    dataset = shardstream.StreamingDataset(url, storage_options=options, shuffle=shuffle, decode=False)
    len(dataset)  # the dataset opened: its manifest read, its storage and client made (left out)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS now
    start, started, count = status("VmRSS"), time.perf_counter(), 0
    for _ in dataset:
        count += 1
    return {
        "growth": (status("VmHWM") - start) / MB,
        "seconds": time.perf_counter() - started,
        "samples": count,
        "module": shardstream.__file__,
    }


def child(tree: str, *args: str) -> str:
    """This script run again with ``tree``'s shardstream; its last line of output."""
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *args], env=env, capture_output=True, text=True, cwd=tree
    )
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"bench_memory: {args[0]} with {tree} failed (exit {done.returncode})")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def compare(base: str, head: str, rounds: int, samples: int, shuffle: bool, kind: str) -> None:
    sys.path.insert(0, HERE)
    from bench_compare import checkout
    from bench_stream import MotoProcess

    server = MotoProcess("memory")
    try:
        options, url = json.dumps(server.options()), f"s3://memory/{kind}"
        with (
            tempfile.TemporaryDirectory(prefix="bench-memory-") as where,
            checkout(base, where) as base_tree,
            checkout(head, where) as head_tree,
        ):
            child(base_tree, "--write", url, options, str(samples), kind)
            seen: dict[str, list[dict]] = {"base": [], "head": []}
            for number in range(rounds):
                order = [("base", base_tree), ("head", head_tree)]
                for side, tree in order if number % 2 == 0 else order[::-1]:
                    run = json.loads(child(tree, "--epoch", url, options, str(int(shuffle))))
                    if not run["module"].startswith(os.path.join(tree, "")) or run["samples"] != samples:
                        raise SystemExit(f"bench_memory: the {side} run read {run}, not {tree}'s epoch")
                    seen[side].append(run)
                print(f"round {number + 1} of {rounds} done", file=sys.stderr)
    finally:
        server.stop()
    size = "1 MB" if kind == "large" else "~190 B"
    print(
        f"RSS growth in one epoch of {samples:,} x {size} on loopback moto "
        f"(shuffle={shuffle}, decode=False); median of {rounds} rounds, alternating"
    )
    medians = {}
    for side, name in (("base", base), ("head", head)):
        growths = [run["growth"] for run in seen[side]]
        medians[side] = statistics.median(growths)
        each = ", ".join(f"{g:.0f}" for g in growths)
        rate = samples / statistics.median(run["seconds"] for run in seen[side])
        print(f"  {side} {name}: +{medians[side]:,.0f} MB (rounds: {each}), {rate:,.0f} samples/s")
    extra = medians["head"] - medians["base"]
    state = "met" if extra <= TARGET_MB else "MISSED"
    print(
        f"  memory: head grows {extra:+,.0f} MB more than base in an epoch; target <= +{TARGET_MB} MB: {state}"
    )
    ratios = [b["seconds"] / h["seconds"] for b, h in zip(seen["base"], seen["head"], strict=True)]
    line = (
        f"  rate: head / base = {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )
    if kind == "small":
        state = "met" if statistics.median(ratios) >= TARGET_RATE else "MISSED"
        line += f"; target >= {TARGET_RATE}x: {state}"
    print(line)


def main() -> int:
    if sys.argv[1:2] == ["--write"]:
        write(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return 0
    if sys.argv[1:2] == ["--epoch"]:
        print(json.dumps(epoch(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "1")))
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("base", nargs="?", default="5791d66^", help="a git revision, or . (the working tree)")
    parser.add_argument("--head", default=".", help="a git revision, or . (the working tree)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, help="samples (default 150 x 1 MB, or 20,000 with --small)")
    parser.add_argument("--shuffle", action="store_true", help="a shuffled epoch (default: shuffle=False)")
    parser.add_argument(
        "--small", action="store_true", help="samples of ~190 B (three fields), 5,000 to a shard"
    )
    args = parser.parse_args()
    if args.base == args.head != ".":
        parser.error("BASE and --head are the same revision: give two (or . for both)")
    kind = "small" if args.small else "large"
    samples = args.samples if args.samples is not None else {"large": 150, "small": 20_000}[kind]
    if args.rounds < 1 or samples < 1:
        parser.error("--rounds and --samples must be at least 1")
    compare(args.base, args.head, args.rounds, samples, args.shuffle, kind)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
