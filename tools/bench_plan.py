"""Benchmark the epoch plan: time and memory to a worker's first samples, full rate,
and time to the first index next to torch's DistributedSampler.

    python tools/bench_plan.py           # N = 10^10 in 10^5 shards, R = 4096, W = 8; N = 10^8 vs DistributedSampler
    python tools/bench_plan.py --quick   # a small smoke run (seconds)

The big case runs for order="local" and order="global" (NOTE [ Global order ]: global
batch of R x 32 samples, the default read lanes and, for samples of 256 B, the default
window at its longest: NOTE [ Global window ]), and prints for each the mean run
length per request (samples per ranked read of the worker's first windows); then for
mixtures of the same shards as three streams weighted 6:3:1 with mix="stratified" and
mix="per_stream" (NOTE [ Composed batches ]), next to that single order="global" dataset.

Each measurement runs in a fresh subprocess, so imports, caches and earlier
allocations do not count: time is wall-clock from building the plan (or sampler) to
the sample (median of --repeat processes), memory is tracemalloc's peak over that span
(Python and numpy buffers, in a separate run: tracemalloc slows allocation) and the
growth of the process's resident set. CPU time is printed too: on a busy machine the
wall time also counts waiting for a core.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SAMPLE_BYTES = 256  # what the plan is told of the samples' size (order="global"'s window)
TARGETS = {"first_ms": 50.0, "peak_mb": 64.0, "ratio": 100.0, "rate": 1e6}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _config(order: str, ranks: int, dataset_bytes: int | None = None):  # type: ignore[no-untyped-def]
    from shardstream.plan import PlanConfig

    if order == "global":
        return PlanConfig(seed=1, order="global", global_batch_size=ranks * 32, dataset_bytes=dataset_bytes)
    return PlanConfig(seed=1)


def run_length(plan, rank: int, worker: int, windows: int = 64) -> float:  # type: ignore[no-untyped-def]
    """Mean samples per run (one ranged read) over a worker's first ``windows`` windows."""
    lengths = [
        len(run)
        for _, window in zip(range(windows), plan.worker_windows(rank, worker), strict=False)
        for run in window.runs
    ]
    return sum(lengths) / max(1, len(lengths))


def _mixture_plan(sizes: list[int], config, mix: str, **topology):  # type: ignore[no-untyped-def]
    """The shards as three streams weighted 6:3:1 (60%, 30% and 10% of them), mixed."""
    from shardstream.plan.kinds import MixturePlan
    from shardstream.plan.mixture import Mixture, StreamSpec

    cuts = [0, len(sizes) * 6 // 10, len(sizes) * 9 // 10, len(sizes)]
    specs = [
        StreamSpec(f"stream{i}", sizes[cuts[i] : cuts[i + 1]], weight=w) for i, w in enumerate((6, 3, 1))
    ]
    return MixturePlan(Mixture(specs, mix=mix), config, epoch=3, **topology)


def measure_plan(
    num_samples: int,
    num_shards: int,
    ranks: int,
    workers: int,
    first: int,
    trace: bool,
    order: str = "local",
    mix: str | None = None,
) -> dict:
    """One worker of an EpochPlan (or of a mixture of the same shards, with ``mix``): its
    first `first` samples, then the rest of its slice.

    With `trace`, tracemalloc follows the first part (it slows allocation, so timings
    come from runs without it)."""
    from shardstream.plan import EpochPlan

    sizes = [num_samples // num_shards] * num_shards
    rank, worker = ranks // 3, workers // 2
    rss = _rss_mb()
    if trace:
        tracemalloc.start()
    start, cpu = time.perf_counter(), time.process_time()
    # samples of 256 B: order="global"'s default window is its longest (NOTE [ Global window ])
    config = _config(order, ranks, None if mix is not None else num_samples * SAMPLE_BYTES)
    topology = dict(world_size=ranks, num_workers=workers, batch_size=32)
    if mix is None:
        plan = EpochPlan(sizes, config, epoch=3, **topology)
    else:
        plan = _mixture_plan(sizes, config, mix, **topology)
    stream = plan.worker_samples(rank, worker)
    head = [next(stream) for _ in range(first)]
    first_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    tracemalloc.stop()
    rss_growth = _rss_mb() - rss
    start = time.perf_counter()
    rest = sum(1 for _ in stream)
    rest_s = time.perf_counter() - start
    return {
        "what": f"{'EpochPlan' if mix is None else f'mix={mix}'} worker, order={order}, "
        f"N={num_samples:.0e}, {num_shards} shards, R={ranks}, W={workers}",
        "run_length": run_length(plan, rank, worker),
        "first_ms": first_s * 1000,
        "cpu_ms": cpu_s * 1000,
        "peak_mb": peak / 2**20,
        "rss_growth_mb": rss_growth,
        "worker_samples": len(head) + rest,
        "rate": rest / rest_s if rest else float("nan"),
    }


def measure_shard_sampler(num_samples: int, num_shards: int, ranks: int) -> dict:
    from shardstream.sampler import ShardSampler

    sizes = [num_samples // num_shards] * num_shards
    rss = _rss_mb()
    start = time.perf_counter()
    iterator = iter(ShardSampler(sizes, num_replicas=ranks, rank=ranks // 3, seed=1))
    next(iterator)
    first_s = time.perf_counter() - start
    rss_growth = _rss_mb() - rss
    start = time.perf_counter()
    count = sum(1 for _ in iterator)
    return {
        "what": f"ShardSampler, N={num_samples:.0e}, R={ranks}",
        "first_ms": first_s * 1000,
        "rss_growth_mb": rss_growth,
        "rate": count / (time.perf_counter() - start),
    }


def measure_distributed_sampler(num_samples: int, ranks: int) -> dict:
    from torch.utils.data import DistributedSampler

    rss = _rss_mb()
    start = time.perf_counter()
    iterator = iter(DistributedSampler(range(num_samples), num_replicas=ranks, rank=ranks // 3, seed=1))
    next(iterator)
    first_s = time.perf_counter() - start
    return {
        "what": f"torch DistributedSampler, N={num_samples:.0e}, R={ranks}",
        "first_ms": first_s * 1000,
        "rss_growth_mb": _rss_mb() - rss,
    }


def _child(name: str, args: list) -> dict:
    """Run one measurement in a fresh interpreter and return its result."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from tools import bench_plan as b; "
        f"print(json.dumps(b.{name}(*{args!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(name: str, args: list, repeat: int) -> dict:
    """The run with the median time to the first sample, of `repeat` fresh processes."""
    runs = sorted((_child(name, args) for _ in range(repeat)), key=lambda r: r["first_ms"])
    result = runs[len(runs) // 2]
    result["first_ms_min"] = runs[0]["first_ms"]
    return result


def _row(result: dict) -> str:
    cells = [f"{result['first_ms']:10.1f}"]
    cells.append(f"{result['peak_mb']:9.1f}" if "peak_mb" in result else f"{'-':>9}")
    cells.append(f"{result['rss_growth_mb']:9.1f}")
    cells.append(f"{result['rate'] / 1e6:9.2f}" if "rate" in result else f"{'-':>9}")
    return " ".join(cells) + "  " + result["what"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few seconds")
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per timing (median reported)")
    args = parser.parse_args(argv)
    repeat = 1 if args.quick else args.repeat
    if args.quick:
        big, ranks, workers, small, shards_small = (10**7, 1000), 64, 4, 10**6, 100
    else:
        big, ranks, workers, small, shards_small = (10**10, 10**5), 4096, 8, 10**8, 1000
    head = _median("measure_plan", [big[0], big[1], ranks, workers, 1000, False], repeat)
    head["peak_mb"] = _child("measure_plan", [big[0], big[1], ranks, workers, 1000, True])["peak_mb"]
    plan_small = _median("measure_plan", [small, shards_small, ranks, workers, 1, False], repeat)
    plan_small["peak_mb"] = _child("measure_plan", [small, shards_small, ranks, workers, 1, True])["peak_mb"]
    sampler = _median("measure_shard_sampler", [small, shards_small, ranks], repeat)
    torch_ds = _child("measure_distributed_sampler", [small, ranks])  # seconds and GBs: once is enough
    glob = _median("measure_plan", [big[0], big[1], ranks, workers, 1000, False, "global"], repeat)
    glob["peak_mb"] = _child("measure_plan", [big[0], big[1], ranks, workers, 1000, True, "global"])[
        "peak_mb"
    ]
    mixed = {}
    for mix in ("stratified", "per_stream"):
        args = [big[0], big[1], ranks, workers, 1000, False, "global", mix]
        mixed[mix] = _median("measure_plan", args, repeat)
        mixed[mix]["peak_mb"] = _child("measure_plan", [*args[:5], True, *args[6:]])["peak_mb"]
    results = [head, glob, *mixed.values(), plan_small, sampler, torch_ds]
    print(f"{'first ms':>10} {'peak MB':>9} {'RSS+ MB':>9} {'M samp/s':>9}  what")
    for result in results:
        print(_row(result))
    ratio_plan = torch_ds["first_ms"] / plan_small["first_ms"]
    ratio_sampler = torch_ds["first_ms"] / sampler["first_ms"]
    print()
    print(
        f"first 1000 samples at N={big[0]:.0e}: {head['first_ms']:.1f} ms wall (median of {repeat} processes; "
        f"best {head['first_ms_min']:.1f} ms), {head['cpu_ms']:.1f} ms CPU (target < {TARGETS['first_ms']:.0f} ms)"
    )
    print(
        f"order=global (global batch {ranks * 32}, default lanes): {glob['first_ms']:.1f} ms wall "
        f"(best {glob['first_ms_min']:.1f} ms), {glob['cpu_ms']:.1f} ms CPU (target < {TARGETS['first_ms']:.0f} ms), "
        f"peak {glob['peak_mb']:.1f} MB, {glob['rate'] / 1e6:.2f} M samples/s"
    )
    print(
        f"run length per request: order=local {head['run_length']:.0f} samples, "
        f"order=global {glob['run_length']:.0f} samples (min(G / lanes, G / R))"
    )
    for mix, result in mixed.items():
        print(
            f"mix={mix} (3 streams 6:3:1, same shards): {result['first_ms']:.1f} ms wall "
            f"(best {result['first_ms_min']:.1f} ms), {result['cpu_ms']:.1f} ms CPU, "
            f"x{result['first_ms'] / glob['first_ms']:.2f} of order=global's; peak {result['peak_mb']:.1f} MB "
            f"(x{result['peak_mb'] / glob['peak_mb']:.2f}), {result['rate'] / 1e6:.2f} M samples/s "
            f"(x{result['rate'] / glob['rate']:.2f}), run length {result['run_length']:.0f}"
        )
    print(f"peak traced memory then: {head['peak_mb']:.1f} MB (target < {TARGETS['peak_mb']:.0f} MB)")
    print(f"full rate of that worker: {head['rate'] / 1e6:.2f} M samples/s (target >= 1 M/s)")
    print(
        f"time to first index at N={small:.0e}: DistributedSampler / EpochPlan worker = {ratio_plan:.0f}x, "
        f"DistributedSampler / ShardSampler = {ratio_sampler:.0f}x (target >= {TARGETS['ratio']:.0f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
