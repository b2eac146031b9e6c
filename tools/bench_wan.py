"""Streaming from object storage over a (simulated) network: shardstream against the peers.

    python tools/bench_wan.py [--quick] [--repeat 1] [--latency 0.03] [--bandwidth 40e6]
                              [--only large,small,first,loopback] [--tools "shardstream tar,litdata"]
                              [--per-shard 32]
    python tools/bench_stream.py --only wan [--quick]          # the same, as a section

moto's S3 server runs in one process and ``shardstream.testing.wanproxy`` in another, in
front of it: ``latency`` seconds before each request is forwarded, each response body
streamed at no more than ``bandwidth`` bytes/s (issue 9's shape: 30 ms, 40 MB/s). The same
corpus is written once (not timed) in each tool's own format to one bucket:

- large: 150 x 1 MB samples in 5 tar shards (and Parquet, LitData chunks, Mosaic MDS).
- small: 20k x ~250 B samples (3 fields) in 4 shards.

Contenders, each at its fastest documented path, one process, no shuffle, no decode:
shardstream tar and Parquet (``StreamingDataset``, and tar with ``cache_dir``); plain
boto3 ``get_object`` of the tar shards, sequential and in 16 threads of ranged GETs (the
wire's limit); ``litdata.StreamingDataset`` on its chunks (obstore client, which needs
``allow_http`` for a plain-HTTP endpoint); ``webdataset.WebDataset`` over the tar shards
through s3fs; ``streaming.StreamingDataset`` (MosaicML) on MDS with ``S3_ENDPOINT_URL``.
"shardstream tar one read" is shardstream with ``read_concurrency=1``, read as before
issue 9 (one read at a time, one window ahead): the baseline of the memory target here
(tools/bench_memory.py measures against the tree before issue 9 itself).
A contender with a cache runs a cold epoch (fresh cache dir) and then a warm one (same
process, same cache); "local disk" is shardstream on a local copy of the tar shards.

Every run is a fresh process forked from a forkserver that imported everything first
(so a run starts in milliseconds, not the 5-10 s of importing torch): the times are of
the epochs alone, the cold one including opening the dataset. Peak RSS is that process's
(``VmHWM``, reset between its cold and warm epochs), and how much it grew in the epoch:
the fork child maps what the forkserver preloaded (~330 MB, the same for every contender),
so the growth is what a contender itself holds. GETs and the peak number of requests
in flight at once are the proxy's counts for that run; so is the CPU time each process
spent in it (the run's, the S3 server's, the proxy's): on a machine of few cores a
contender that makes the server or the proxy work harder takes CPU from itself, and a
run whose three figures add up to its cores (times its seconds) was bound by CPU, not by
the network. For 1 MB samples the run's own CPU is also shown per GB of samples (median
over rounds), and the loopback section sets it against sequential boto3's. Rates are medians over ``--repeat`` rounds (rotating order) and ratios are
paired within rounds, as in bench_stream.py.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_stream import MB, MotoProcess, Rates, small_sample
from bench_wan_runs import (
    BUCKET,
    ONE_READ,
    first_sample,
    large_sample,
    run_one,
    storage_options,
    write_corpus,
)

from shardstream.pack import ShardWriter

# -- the orchestration ------------------------------------------------------------------------

PEERS = ("litdata", "webdataset", "mosaic")


# Everything any contender imports, so that no run times an import (pyarrow alone is ~0.5 s
# here; Mosaic's imports more than 2 s); bench_wan_runs first: it stubs a broken torchvision.
PRELOAD = [
    "bench_wan_runs",
    "torch",
    "boto3",
    "s3fs",
    "boto3.s3.transfer",
    "pyarrow.parquet",
    "pyarrow.pandas_compat",
    "pandas",
    "shardstream.formats.parquet.index",
    "shardstream.formats.parquet.typed",
    "litdata",
    "litdata.streaming.downloader",
    "obstore",
    "webdataset",
    "streaming",
]


def runner():  # type: ignore[no-untyped-def]
    """Runs each call in a new process forked from a server that imported everything."""
    context = multiprocessing.get_context("forkserver")
    # The forkserver does not take our sys.path, and ignores a preload it cannot import:
    # without this, bench_wan_runs (and its torchvision stub) was never preloaded.
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([HERE, ROOT, *filter(None, path)]))
    context.set_forkserver_preload(PRELOAD)
    return concurrent.futures.ProcessPoolExecutor(1, mp_context=context, max_tasks_per_child=1)


def measure_runs(pool, specs: dict[str, dict], repeat: int, scale: float) -> tuple[Rates, dict]:  # type: ignore[no-untyped-def]
    """Rounds of every run (rotating order): rates (items/s x scale) by name, and the last
    round's epoch details (RSS, GETs, peak in flight; every round's RSS growth) by name."""
    names, rounds, details = list(specs), [], {}
    for number in range(max(1, repeat)):
        rates: dict[str, float] = {}
        for name in names[number % len(names) :] + names[: number % len(names)]:
            result = pool.submit(run_one, specs[name]).result()
            for epoch in result["epochs"]:
                label = f"{name} warm" if epoch["name"] == "warm" else name
                rates[label] = epoch["items"] * scale / epoch["seconds"]
                epoch["rss_growths"] = [*details.get(label, {}).get("rss_growths", []), epoch["rss_growth"]]
                # the client's CPU seconds per GB of samples, where items are MB (scale != 1)
                gigabytes = epoch["items"] * MB / 1e9 if scale != 1.0 else 0.0
                per_gb = epoch["cpu"]["run"] / gigabytes if gigabytes else None
                epoch["cpu_per_gb"] = [*details.get(label, {}).get("cpu_per_gb", []), per_gb]
                details[label] = epoch
        rounds.append(rates)
    order = [n for name in names for n in (name, f"{name} warm") if n in rounds[0]]
    rounds = [{n: r[n] for n in order} for r in rounds]
    return Rates(rounds, [dict.fromkeys(order, 0.0) for _ in rounds]), details


def show(title: str, rates: Rates, details: dict, unit: str) -> None:
    print(f"\n{title}; median of {len(rates.rounds)} rounds")
    width = max(map(len, rates.names))
    for name in rates.names:
        d = details[name]
        extra = "" if d["gets"] is None else f", {d['gets']} GETs, peak {d['peak_in_flight']} in flight"
        cpu = d["cpu"]
        spent = f"CPU s: run {cpu['run']:.2f}, server {cpu['server']:.2f}"
        spent += "" if cpu["proxy"] is None else f", proxy {cpu['proxy']:.2f}"
        # The line as before (bench_compare.py pairs lines by their words), then the details.
        print(
            f"  {name:<{width}} {rates.rate(name):>10,.1f} {unit}   (peak RSS {d['rss'] / MB:,.0f} MB{extra})"
        )
        print(
            f"      {name}: {d['seconds']:.2f} s, RSS +{d['rss_growth'] / MB:,.0f} MB in the epoch; {spent}"
        )
        if cpu_per_gb(d) is not None:
            print(f"      {name}: client CPU {cpu_per_gb(d):.2f} s per GB (median of rounds)")


def cpu_per_gb(detail: dict) -> float | None:
    """The median over rounds of a run's own CPU seconds per GB of samples (None: not MB items)."""
    rounds = [x for x in detail.get("cpu_per_gb", []) if x is not None]
    return statistics.median(rounds) if rounds else None


def cpu_target(details: dict, ours: str, other: str, goal: float, label: str) -> None:
    """Our client's CPU per GB against ``other``'s (medians over rounds), at most ``goal`` times."""
    mine, theirs = cpu_per_gb(details.get(ours, {})), cpu_per_gb(details.get(other, {}))
    if mine is None or not theirs:
        return
    ratio = RATIOS[label] = mine / theirs
    verdict = "met" if ratio <= goal else "MISSED"
    print(f"  client CPU per GB: {ours} / {other} = {ratio:.2f}x; target <= {goal}x: {verdict}")


# Each section's ratios by label, for --record's "wan-targets" row (tools/results.py).
RATIOS: dict[str, float] = {}


def target(rates: Rates, ours: str, others: list[str], goal: float, what: str, label: str = "") -> None:
    others = [o for o in others if o in rates.names]
    if ours not in rates.names or not others:
        return
    ratio = statistics.median(rates.ratios(others, ours))
    state = f"; target >= {goal}x: " + ("met" if ratio >= goal else "MISSED") if goal else ""
    print(f"  {what}: {ours} / {' | '.join(others)} = {ratio:.2f}x{state}")
    if label:
        RATIOS[label] = ratio


def record_rates(claim: str, rates: Rates, details: dict, record: str) -> None:
    """With --record: the cold rates (``claim``) and, for 1 MB, the peak RSS ("wan-memory")."""
    if not record:
        return
    from results import record as append

    cold = [name for name in rates.names if not name.endswith("warm")]
    append(claim, record, {name: rates.rate(name) for name in cold})
    if claim == "wan-large":
        append("wan-memory", record, {name: details[name]["rss"] / MB for name in cold})


def memory_target(details: dict, ours: str) -> None:
    """Issue 9's memory target: ``ours`` grows at most 64 MB more in an epoch than the
    reader before issue 9 (``ONE_READ``), medians over the rounds."""
    if ours not in details or ONE_READ not in details:
        return
    extra = (
        statistics.median(details[ours]["rss_growths"]) - statistics.median(details[ONE_READ]["rss_growths"])
    ) / MB
    state = "met" if extra <= 64 else "MISSED"
    print(
        f"  memory: {ours} grows {extra:+,.0f} MB more than {ONE_READ} in an epoch; target <= +64 MB: {state}"
    )


def bench_corpus(pool, name: str, where: dict, base: dict, repeat: int, large: bool) -> None:  # type: ignore[no-untyped-def]
    tools = ["shardstream tar", "shardstream parquet", "shardstream tar cache", "local disk"]
    tools += ["boto3 x16", "boto3", ONE_READ] if large else [ONE_READ]
    tools += [peer for peer in PEERS if peer in where or peer == "webdataset"]
    tools = [tool for tool in tools if not base["tools"] or tool in base["tools"]]
    specs = {tool: dict(base, tool=tool, where=where) for tool in tools}
    scale, unit = (MB / 1e6, "MB/s") if large else (1.0, "samples/s")
    rates, details = measure_runs(pool, specs, repeat, scale)
    size = "1 MB" if large else "~250 B"
    show(f"{name}: {where['count']:,} x {size} through the proxy, cold and warm epochs", rates, details, unit)
    cold_peers = [p for p in PEERS if p in rates.names]
    if large:
        target(rates, "shardstream tar", ["boto3 x16"], 0.9, "1 MB cold vs the wire", "1 MB cold / boto3 x16")
        target(
            rates, "shardstream tar", cold_peers, 2.0, "1 MB cold vs the best peer", "1 MB cold / best peer"
        )
    else:
        tar, parquet = "~250 B cold, tar / best peer", "~250 B cold, Parquet / best peer"
        target(rates, "shardstream tar", cold_peers, 1.5, "~250 B cold, tar, vs the best peer", tar)
        target(
            rates, "shardstream parquet", cold_peers, 2.5, "~250 B cold, Parquet, vs the best peer", parquet
        )
    memory_target(details, "shardstream tar")
    target(
        rates,
        "shardstream tar cache",
        ["shardstream tar"],
        0.95,
        "cache, cold vs uncached cold",
        f"cache cold / uncached, {size}",
    )
    target(
        rates,
        "shardstream tar cache warm",
        ["local disk warm"],
        0.9,
        "cache, warm vs local disk",
        f"cache warm / local disk, {size}",
    )
    target(rates, "shardstream tar cache warm", ["litdata warm", "mosaic warm"], 0, "warm vs the best peer")
    record_rates("wan-large" if large else "wan-small", rates, details, base.get("record", ""))


def bench_loopback(pool, where: dict, base: dict, repeat: int) -> None:  # type: ignore[no-untyped-def]
    loop = dict(base, endpoint=base["env"]["AWS_ENDPOINT_URL"], proxy="")
    tools = ("shardstream tar", "boto3", ONE_READ)
    specs = {f"{t} (loopback)": dict(loop, tool=t, where=where) for t in tools}
    rates, details = measure_runs(pool, specs, repeat, MB / 1e6)
    show("large, loopback (no proxy), cold epoch", rates, details, "MB/s")
    memory_target({name.removesuffix(" (loopback)"): d for name, d in details.items()}, "shardstream tar")
    target(
        rates,
        "shardstream tar (loopback)",
        ["boto3 (loopback)"],
        1.0,
        "loopback 1 MB vs sequential boto3",
        "loopback 1 MB / boto3 sequential",
    )
    cpu_target(
        details,
        "shardstream tar (loopback)",
        "boto3 (loopback)",
        1.1,
        "loopback client CPU per GB / boto3 sequential",
    )


def bench_first_sample(pool, base: dict, shards: int) -> None:  # type: ignore[no-untyped-def]
    url = f"s3://{BUCKET}/first-sample"
    options = storage_options(base["env"]["AWS_ENDPOINT_URL"], base["env"])
    with ShardWriter(url, format="tar", samples_per_shard=20, storage_options=options) as writer:
        for i in range(shards * 20):
            writer.write(small_sample(i))
    result = pool.submit(first_sample, dict(base, url=url)).result()
    state = "met" if result["seconds"] <= 0.3 else "MISSED"
    print(
        f"\ntime to first sample, rank 5 of 64, {shards} shards, new dataset after imports: "
        f"{result['seconds'] * 1000:,.0f} ms, {result['gets']} GETs (peak RSS {result['rss'] / MB:,.0f} MB); "
        f"target <= 300 ms: {state}"
    )
    if base.get("record"):
        from results import record

        figures = {"shardstream, rank 5 of 64": result["seconds"] * 1000}
        record("first-sample", base["record"], figures, note=f"{result['gets']} GETs.")


class ProxyProcess:
    """shardstream.testing.wanproxy in its own process: it does not share our GIL."""

    def __init__(self, upstream: str, latency: float, bandwidth: float) -> None:
        launch = "import sys; from shardstream.testing.wanproxy import main; sys.exit(main())"
        command = [sys.executable, "-c", launch, upstream]
        command += ["--latency", str(latency), "--bandwidth", str(bandwidth)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert self.proc.stdout is not None
        self.endpoint = self.proc.stdout.readline().strip().removeprefix("endpoint=")

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


SECTIONS = ("large", "small", "first", "loopback")
LATENCY = 0.03  # seconds before each request: issue 9's network
BANDWIDTH = 40e6  # bytes/s per response


def bench_wan(
    quick: bool,
    repeat: int,
    latency: float = LATENCY,
    bandwidth: float = BANDWIDTH,
    only: tuple[str, ...] = SECTIONS,
    tools: tuple[str, ...] = (),
    record: str = "",
    per_shard: int = 0,
) -> None:
    """Run the sections in ``only``; with ``record`` (the command line to store), append
    each section's results to the results file (tools/results.py). ``per_shard``: 1 MB
    samples per shard of the large corpus (0: a fifth of them, five shards)."""
    large, small, shards = (10, 2_000, 40) if quick else (150, 20_000, 200)
    per_shard = per_shard or max(1, large // 5)
    work = tempfile.mkdtemp(prefix="bench-wan-")
    server = MotoProcess(BUCKET)
    proxy = ProxyProcess(server.env["AWS_ENDPOINT_URL"], latency, bandwidth)
    try:
        print(
            f"\nover a network: moto behind a proxy, {latency * 1000:.0f} ms, {bandwidth / 1e6:.0f} MB/s per response"
        )
        base = {
            "env": server.env,
            "endpoint": proxy.endpoint,
            "proxy": proxy.endpoint,
            "server_pid": server.proc.pid,
        }
        base["tools"] = tools
        base["record"] = record
        wanted = {"large", "loopback"} & set(only)
        big = write_corpus("large", large_sample, large, per_shard, work, server.env) if wanted else {}
        tiny = (
            write_corpus("small", small_sample, small, small // 4, work, server.env)
            if "small" in only
            else {}
        )
        with runner() as pool:
            if "large" in only:
                bench_corpus(pool, "large", big, base, repeat, large=True)
            if "small" in only:
                bench_corpus(pool, "small", tiny, base, repeat, large=False)
            if "first" in only:
                bench_first_sample(pool, base, shards)
            if "loopback" in only:
                bench_loopback(pool, big, base, repeat)
        if record and RATIOS:
            from results import record as append

            append("wan-targets", record, {}, ratios=RATIOS)
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes")
    parser.add_argument("--repeat", type=int, default=1, help="timed rounds (each run is a cold start)")
    parser.add_argument("--latency", type=float, default=LATENCY, help="seconds before each request")
    parser.add_argument("--bandwidth", type=float, default=BANDWIDTH, help="bytes/s per response")
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections: " + ", ".join(SECTIONS))
    parser.add_argument("--tools", default="", help="contenders to run, by name (all if empty)")
    parser.add_argument(
        "--record", action="store_true", help="append the results to docs/benchmarks.json (tools/results.py)"
    )
    parser.add_argument(
        "--per-shard",
        type=int,
        default=0,
        help="1 MB samples per shard of the large corpus (default: five shards); e.g. 32 for 32 MB shards",
    )
    args = parser.parse_args()
    only = tuple(args.only.split(","))
    tools = tuple(filter(None, args.tools.split(",")))
    record = ""
    if args.record and args.quick:
        parser.error("--record keeps a run's figures as the current ones: not those of a --quick run")
    if args.record:
        from results import command_line

        record = command_line()
    bench_wan(args.quick, args.repeat, args.latency, args.bandwidth, only, tools, record, args.per_shard)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
