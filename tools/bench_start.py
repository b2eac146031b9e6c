"""Start at scale: a job of 4,096 ranks x 8 DataLoader workers starting at once against
S3's request rate, scaled to this machine.

    python tools/bench_start.py [--nodes 2] [--ranks-per-node 2] [--workers 8]
                                [--base REV] [--cache-dir] [--record]

What runs: moto's S3 behind a proxy that answers 503 SlowDown above a request rate
(a token bucket holding one second of it), and ``nodes x ranks-per-node`` real rank
processes (a gloo process group, as torchrun gives) with ``--workers`` forked DataLoader
workers each, released at one moment; each rank stops at its workers' first batches.

Scaled, not simulated: every reader makes the requests it would make in the full job
(the dataset has ``--shards-per-rank`` shards per rank, so a worker's first window covers
what it would cover at full scale) and the proxy's rate is the full limit (``--limit``,
S3's 5,500 GET/s per prefix) times ``ranks run / --full-ranks``, so the time to a first
batch is the full job's. Where the library has ``start_rate``, the ranks pass it scaled
the same way.

Two phases: ``counts`` (no limit, not paced: the requests each reader makes) and
``storm`` (the scaled limit, ``start_rate`` where the library has it). Each prints, per
variant (this tree; with ``--base REV`` also that revision, run from a temp git
worktree: the figure before the change), the GETs to the first batches by kind,
GETs per reader, the bound ``nodes x (1 + the node's first-window sidecars) + data GETs``
(and the same per rank: a rank's workers share its sidecars, and a node's ranks share
their first ones through the node's folder; with equal shards cut at rank edges no two
ranks share one), the 503s the proxy sent and those that reached a user (a rank that
failed), and the p50/p99 time from the release to each reader's first batch. The full
job's totals are these times ``--full-ranks / ranks run``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
FULL_RANKS, FULL_WORKERS, S3_LIMIT = 4096, 8, 5500.0
SAMPLES_PER_SHARD, BATCH, SEED = 64, 8, 11
MANIFEST = ".shardstream/manifest.json"


# -- the rank processes -------------------------------------------------------------------


def child(args: argparse.Namespace) -> int:
    """One rank: join the group, wait for the release, stream to the workers' first batches."""
    tree = os.environ["BENCH_TREE"]
    sys.path.insert(0, tree)
    import torch.distributed as dist

    import shardstream

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = pathlib.Path(args.child)
    (out / f"ready-{rank}").touch()
    while not (out / "go").exists():
        time.sleep(0.005)
    start = float((out / "go").read_text())
    record: dict[str, Any] = {"rank": rank, "firsts": [], "error": None, "module": shardstream.__file__}
    try:
        options: dict[str, Any] = {"shuffle": True, "seed": SEED, "decode": False}
        if args.cache_dir:
            options["cache_dir"] = args.cache_dir
        if _has_start_rate(shardstream):  # 0: not paced
            options["start_rate"] = args.start_rate or None
        dataset = shardstream.StreamingDataset(args.url, **options)
        loader = shardstream.DataLoader(dataset, batch_size=BATCH, num_workers=args.workers, collate_fn=len)
        for count, _ in enumerate(loader, 1):
            record["firsts"].append(time.time() - start)
            if count == args.workers:
                break
        del loader
    except Exception as error:  # a 503 that reached the user, or another failure
        record["error"] = f"{type(error).__name__}: {error}"[:500]
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()
    return 0


def _has_start_rate(shardstream: Any) -> bool:
    from shardstream.dataset.options import ReadOptions

    return "start_rate" in getattr(ReadOptions, "__dataclass_fields__", {})


# -- S3 with a request rate ---------------------------------------------------------------


def rate_limited_proxy(upstream: str, rate: float) -> Any:
    """A proxy in front of ``upstream`` answering 503 SlowDown above ``rate`` requests/s."""
    sys.path.insert(0, str(ROOT))
    from shardstream.testing.wanproxy import ForwardingProxy

    class RateLimited(ForwardingProxy):
        def __init__(self) -> None:
            super().__init__(upstream)
            self.gets: Counter[str] = Counter()
            self.slowdowns = 0
            self._tokens, self._at = max(1.0, rate), time.monotonic()
            self._bucket = threading.Lock()

        def reset(self) -> None:
            with self._bucket:
                self.gets, self.slowdowns = Counter(), 0
                self._tokens, self._at = max(1.0, rate), time.monotonic()

        def _admit(self) -> bool:
            if rate <= 0:  # no limit: the requests as they come
                return True
            with self._bucket:
                now = time.monotonic()
                self._tokens = min(max(1.0, rate), self._tokens + (now - self._at) * rate)
                self._at = now
                if self._tokens < 1:
                    self.slowdowns += 1
                    return False
                self._tokens -= 1
                return True

        def respond(self, handler: Any, body: bytes) -> int:
            if not self._admit():
                payload = (
                    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                )
                handler.send_whole(503, [("Content-Type", "application/xml")], payload)
                return len(payload)
            if handler.command == "GET":
                with self._bucket:
                    self.gets[urllib.parse.urlsplit(handler.path).path] += 1
            return super().respond(handler, body)

    return RateLimited()


def write_dataset(url: str, shards: int, options: dict[str, Any]) -> list[int]:
    """A tar dataset of ``shards`` shards of SAMPLES_PER_SHARD small samples."""
    from shardstream.formats import get_format
    from shardstream.manifest import Manifest, ShardInfo
    from shardstream.storage import Storage

    fmt, storage = get_format("tar"), Storage(url, options)
    infos = []
    for shard in range(shards):
        path, buffer = f"shard-{shard:06d}.tar", io.BytesIO()
        encoder = fmt.encoder(buffer, name=path)
        for i in range(SAMPLES_PER_SHARD):
            encoder.write({"__key__": f"s{shard:05d}-{i:03d}", "txt": b"x" * 1000})
        sidecar, data = encoder.close().to_bytes(), buffer.getvalue()
        storage.write(path, data)
        storage.write(path + ".idx", sidecar)
        digest = hashlib.sha256(data).hexdigest()
        infos.append(ShardInfo(path, SAMPLES_PER_SHARD, len(data), digest, path + ".idx", len(sidecar)))
    storage.write_manifest(Manifest(format="tar", shards=tuple(infos), fields=("txt",)))
    storage.close()
    return [SAMPLES_PER_SHARD] * shards


def first_window_sidecars(url: str, options: dict[str, Any], ranks: int, workers: int) -> list[set[int]]:
    """Per rank: the shards of its workers' first windows (the plan alone)."""
    import shardstream
    from shardstream.dataset.startup import first_window_shards

    dataset = shardstream.StreamingDataset(
        url, num_replicas=ranks, rank=0, batch_size=BATCH, shuffle=True, seed=SEED, decode=False,
        storage_options=options, share_manifest=False,
    )  # fmt: skip
    plan = dataset.make_plan(num_workers=workers, consume=False)
    return [{s for w in range(workers) for s in first_window_shards(plan, r, w)} for r in range(ranks)]


# -- one run ------------------------------------------------------------------------------


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[str]:
    where = tempfile.mkdtemp(prefix="bench-start-")
    subprocess.run(["git", "worktree", "add", "--detach", "-q", where, revision], cwd=ROOT, check=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", where], cwd=ROOT, check=False)
        shutil.rmtree(where, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(tree: str, url: str, proxy: Any, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """The ranks of one variant, released at once; what they and the proxy saw."""
    ranks = args.nodes * args.ranks_per_node
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-start-run-"))
    port, procs = free_port(), []
    try:
        for rank in range(ranks):
            node = rank // args.ranks_per_node
            command = [
                sys.executable,
                __file__,
                "--child",
                str(work),
                "--url",
                url,
                "--workers",
                str(args.workers),
            ]
            command += ["--start-rate", str(args.start_rate_scaled)]
            if args.cache_dir:
                command += ["--cache-dir", str(work / f"cache-{node}")]
            rank_env = dict(
                env, BENCH_TREE=tree, RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank % args.ranks_per_node),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TMPDIR=str(work / f"tmp-{node}"),
            )  # fmt: skip
            (work / f"tmp-{node}").mkdir(exist_ok=True)
            with open(work / f"err-{rank}", "wb") as err:
                procs.append(subprocess.Popen(command, env=rank_env, stdout=subprocess.DEVNULL, stderr=err))
        deadline = time.time() + 300
        while len(list(work.glob("ready-*"))) < ranks:
            if time.time() > deadline or any(p.poll() not in (None, 0) for p in procs):
                errors = "".join(path.read_text() for path in sorted(work.glob("err-*")))
                raise SystemExit(f"the ranks did not start:\n{errors[-3000:]}")
            time.sleep(0.05)
        proxy.reset()
        (work / "go.tmp").write_text(repr(time.time()))
        (work / "go.tmp").replace(work / "go")
        for p in procs:
            p.wait(timeout=600)
        records = [json.loads((work / f"rank-{rank}.json").read_text()) for rank in range(ranks)]
        strays = [r["module"] for r in records if not r["module"].startswith(tree)]
        if strays:
            raise SystemExit(f"the ranks imported shardstream from {strays[0]}, not from {tree}")
        return {"records": records, "gets": Counter(proxy.gets), "slowdowns": proxy.slowdowns}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


def summary(
    name: str, result: dict[str, Any], firsts: list[set[int]], args: argparse.Namespace
) -> dict[str, float]:
    ranks = args.nodes * args.ranks_per_node
    readers = ranks * args.workers
    gets: Counter[str] = result["gets"]
    manifest = sum(n for p, n in gets.items() if p.endswith(MANIFEST))
    sidecars = sum(n for p, n in gets.items() if p.endswith(".idx"))
    data = sum(n for p, n in gets.items() if p.endswith(".tar"))
    other = sum(gets.values()) - manifest - sidecars - data
    total = sum(gets.values())
    nodes = [
        set().union(*firsts[n * args.ranks_per_node : (n + 1) * args.ranks_per_node])
        for n in range(args.nodes)
    ]
    bound_node = args.nodes * 1 + sum(len(s) for s in nodes) + data
    bound_rank = args.nodes * 1 + sum(len(s) for s in firsts) + data
    failed = [r for r in result["records"] if r["error"]]
    times = sorted(t for r in result["records"] for t in r["firsts"])
    missing = readers - len(times)
    times += [float("inf")] * missing  # a reader that never got a batch is the slowest
    p50 = times[len(times) // 2]
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"{name}")
    print(
        f"  GETs to first batches     {total:8d}  manifest {manifest}, sidecars {sidecars}, data {data}, other {other}"
    )
    print(f"  GETs per reader           {total / readers:8.2f}  ({readers} readers)")
    print(f"  bound per node            {bound_node:8d}  nodes x (1 + node's first-window sidecars) + data GETs: "
          f"{'within' if total <= bound_node else 'above'} ({total / bound_node:.2f}x)")  # fmt: skip
    print(f"  bound per rank            {bound_rank:8d}  nodes + each rank's first-window sidecars + data GETs: "
          f"{'within' if total <= bound_rank else 'above'} ({total / bound_rank:.2f}x)")  # fmt: skip
    print(f"  503s sent by the proxy    {result['slowdowns']:8d}")
    print(
        f"  503s reaching a user      {len(failed):8d}  ranks failed; readers without a first batch: {missing}"
    )
    for r in failed[:2]:
        print(f"    rank {r['rank']}: {r['error'][:200]}")
    print(
        f"  time to first batch (s)   p50 {p50:.2f}  p99 {p99:.2f}  (scaled run: the full job's rate per reader)"
    )
    full = total * args.full_ranks / ranks
    print(
        f"  full job ({args.full_ranks} x {args.workers})  {full:8.0f} GETs: {full / args.limit:.1f} s at {args.limit:.0f} GET/s at best"
    )
    return {
        "gets_per_reader": total / readers,
        "p99_s": p99,
        "user_503s": float(len(failed)),
        "total_gets": total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--workers", type=int, default=FULL_WORKERS)
    parser.add_argument("--shards-per-rank", type=int, default=1)
    parser.add_argument("--full-ranks", type=int, default=FULL_RANKS)
    parser.add_argument(
        "--limit", type=float, default=S3_LIMIT, help="the store's GET/s at full scale (0: none)"
    )
    parser.add_argument(
        "--start-rate",
        type=float,
        default=5000.0,
        help="start_rate at full scale, where the library has it (0: None)",
    )
    parser.add_argument(
        "--phases",
        default="counts,storm",
        help="counts (no limit, not paced) and/or storm (the scaled limit)",
    )
    parser.add_argument("--base", default=None, help="also run this git revision (today's figure)")
    parser.add_argument("--cache-dir", action="store_true", help="a cache_dir per node")
    parser.add_argument("--record", action="store_true", help="append the figures to docs/benchmarks.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    return bench(args)


def bench(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from shardstream.testing import MotoServer

    ranks = args.nodes * args.ranks_per_node
    scale = ranks / args.full_ranks
    server = MotoServer()
    server.start()
    try:
        bucket = "start-" + uuid.uuid4().hex[:8]
        server.create_bucket(bucket)
        url = f"s3://{bucket}/ds"
        options = server.storage_options()
        write_dataset(url, ranks * args.shards_per_rank, options)
        firsts = first_window_sidecars(url, options, ranks, args.workers)
        print(
            f"{ranks} ranks ({args.nodes} nodes) x {args.workers} workers, {ranks * args.shards_per_rank} shards"
        )
        figures: dict[str, dict[str, float]] = {}
        for phase in args.phases.split(","):
            storm = phase == "storm"
            rate = args.limit * scale if storm else 0.0
            args.start_rate_scaled = args.start_rate * scale if storm else 0.0
            print(
                f"{phase}: "
                + (
                    f"{rate:.2f} GET/s = {args.limit:.0f} x {ranks}/{args.full_ranks}, start_rate "
                    f"{args.start_rate_scaled:.2f} (scaled run)"
                    if storm
                    else "no rate limit, not paced: the requests each reader makes"
                )
            )
            with rate_limited_proxy(server.endpoint, rate) as proxy:
                env = {**os.environ, **server.env(), "AWS_ENDPOINT_URL": proxy.endpoint}
                if args.base:
                    with worktree(args.base) as tree:
                        result = run(tree, url, proxy, env, args)
                    figures[f"{phase} before"] = summary(f"  before ({args.base})", result, firsts, args)
                result = run(str(ROOT), url, proxy, env, args)
                figures[phase] = summary("  this tree", result, firsts, args)
            if args.base:
                ratio = figures[f"{phase} before"]["gets_per_reader"] / figures[phase]["gets_per_reader"]
                print(f"  GETs per reader, before / this tree: {ratio:.2f}x")
        if args.record and args.base and {"counts", "storm"} <= {p.split()[0] for p in figures}:
            record(args, figures)
    finally:
        server.stop()
    return 0


def record(args: argparse.Namespace, figures: dict[str, dict[str, float]]) -> None:
    """With ``--record``: this run in docs/benchmarks.json (tools/results.py), claim start-storm:
    GETs per reader from the counts phase, 503s and times from the storm phase."""
    sys.path.insert(0, str(ROOT / "tools"))
    from results import command_line
    from results import record as append

    counts, before = figures["counts"], figures["counts before"]
    storm, storm_before = figures["storm"], figures["storm before"]
    row = {
        "GETs per reader": counts["gets_per_reader"],
        "storm: p99 s to first batch": storm["p99_s"],
        "storm: ranks failed by 503s": storm["user_503s"],
        f"before ({args.base}): GETs per reader": before["gets_per_reader"],
        f"before ({args.base}) storm: ranks failed by 503s": storm_before["user_503s"],
    }
    if math.isfinite(storm_before["p99_s"]):
        row[f"before ({args.base}) storm: p99 s to first batch"] = storm_before["p99_s"]
    ratios = {"GETs per reader, before / this tree": before["gets_per_reader"] / counts["gets_per_reader"]}
    append("start-storm", command_line(), row, ratios=ratios)


if __name__ == "__main__":
    raise SystemExit(main())
