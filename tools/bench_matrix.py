"""The benchmark matrix: shardstream against the wire, cell by cell, on every shape.

    python tools/bench_matrix.py [--quick] [--where local,s3,wan] [--samples 250B,100KB,1MB,16MB]
        [--shards 8MB,32MB,128MB,512MB] [--shuffle no,yes] [--workers 1,2] [--corpus 256MB]
        [--repeat 3] [--latency 0.03] [--bandwidth 40e6] [--server moto] [--read-budget 64MB,128MB]
        [--record]

A cell is a sample size x a shard size x shuffle or not x DataLoader workers (1: the
dataset iterated in the process itself; 2 or more: ``shardstream.DataLoader`` with that
many workers, started within the timed epoch, as a training job's first epoch starts
them), on one storage:

- local: tar shards in a temp folder on local disk;
- s3: the same shards on an S3 server on 127.0.0.1 (loopback, a process of its own):
  moto's, or with ``--server seaweedfs`` SeaweedFS (``weed mini``, one at a time on a
  machine: its admin ports are fixed). moto copies the whole object for every ranged GET,
  which no real store does, so a reader that cuts its reads into parts pays a cost there
  that it does not pay on a store; SeaweedFS serves a range as stores do;
- wan: that server behind ``shardstream.testing.wanproxy`` (``--latency`` seconds before
  each request, each response at most ``--bandwidth`` bytes/s), as tools/bench_wan.py.

Each cell's corpus holds ``--corpus`` bytes of samples (at least two shards); a sample is
one binary field of its size. In each cell shardstream (``decode=False``, default read
options) is measured against its wire references, each reading every byte of the same shard
files: "whole files", each shard in one read (``get_object`` on S3, ``open().read()`` on
disk) in as many threads as shards, up to 16, and "ranged parts", the shards cut into
parts of at most 8 MB read in 16 threads (ranged GETs, ``os.pread``), and against
``litdata.StreamingDataset`` on the same samples in its own format where litdata is
installed. ``--read-budget`` gives shardstream's ``read_budget`` (default: the library's);
more than one adds a contender per further budget (``shardstream budget=128MB``), each
with its own ratio to the best wire reference in the same rounds. Rates are MB/s of sample bytes; each contender runs once untimed, then
``--repeat`` rounds in rotating order, and a ratio is the median of per-round ratios (as
in tools/bench_stream.py). ``--quick`` runs a small subset (250 B and 1 MB samples in 8 MB
shards, each order, 1 and 2 workers, 16 MB a cell, one round) in a few minutes on a 2-core
machine. ``--record`` keeps the cells' ratios in docs/benchmarks.json (claim ``matrix``, or
``matrix-seaweedfs`` for a run on SeaweedFS;
tools/bench_report.py draws them into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_stream import MotoProcess, Rates, measure, write_litdata, write_tar

import shardstream

MB = 1 << 20
BUCKET = "bench"
PART = 8 * MB  # the ranged-parts reference's largest part
THREADS = 16
_UNITS = {"B": 1, "KB": 1000, "MB": MB, "GB": 1 << 30}


def size(text: str) -> int:
    """``"250B"``, ``"100KB"``, ``"16MB"`` -> bytes (KB: 1000 bytes; MB: 2**20)."""
    number = text.rstrip("BKMGbkmg")
    unit = text[len(number) :].upper() or "B"
    if unit not in _UNITS or not number:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (say 250B, 100KB, 1MB)")
    return int(float(number) * _UNITS[unit])


def shown(count: int) -> str:
    for unit in ("GB", "MB", "KB"):
        if count >= _UNITS[unit] and count % _UNITS[unit] == 0:
            return f"{count // _UNITS[unit]}{unit}"
    return f"{count}B"


@dataclass(frozen=True)
class Cell:
    """One shape of the matrix, on one storage."""

    where: str
    sample: int
    shard: int
    shuffle: bool
    workers: int
    server: str = "moto"  # the S3 server of s3 and wan cells

    @property
    def name(self) -> str:
        order = "shuffled" if self.shuffle else "in order"
        where = (
            self.where if self.where == "local" or self.server == "moto" else f"{self.where}-{self.server}"
        )
        return f"{where} {shown(self.sample)}/{shown(self.shard)} {order} w{self.workers}"


@dataclass
class Store:
    """Where a corpus lives: a local folder, or a bucket behind an endpoint."""

    where: str
    root: str
    options: dict | None = None  # what reads go through
    endpoint: str = ""
    env: dict | None = None
    direct: dict | None = None  # what the corpus is written through (not the WAN proxy)

    def client(self):  # type: ignore[no-untyped-def]
        import boto3
        from botocore.config import Config

        assert self.env is not None
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
            config=Config(max_pool_connections=THREADS * 2),
        )


# -- the corpus -------------------------------------------------------------------------------


def samples(count: int, sample: int) -> Iterator[dict]:
    block = os.urandom(min(sample, 4 * MB))
    body = (block * (sample // len(block) + 1))[:sample]
    for i in range(count):
        yield {"__key__": f"{i:09d}", "bin": body}


def corpus(store: Store, cell: Cell, total: int, work: str, written: dict[str, dict]) -> dict:
    """The cell's shards, written once per sample and shard size on each storage (S3 and
    the WAN proxy read the same objects)."""
    per_shard = max(1, cell.shard // cell.sample)
    count = max(2 * per_shard, total // cell.sample)
    name = f"{shown(cell.sample)}-{shown(cell.shard)}"
    url = f"{store.root}/{name}"
    if url in written:
        return written[url]
    write_tar(url, samples(count, cell.sample), per_shard, store.direct or store.options)
    shards = shardstream.StreamingDataset(url, storage_options=store.options).manifest.shards
    spec = {"url": url, "count": count, "paths": [s.path for s in shards], "sizes": [s.bytes for s in shards]}
    litdata = os.path.join(work, f"litdata-{name}")
    if store.where == "local" and write_litdata(litdata, samples(count, cell.sample)):
        spec["litdata"] = litdata
    elif store.where != "local" and litdata_chunks(litdata, samples(count, cell.sample), cell.shard):
        direct = dataclasses.replace(store, endpoint=(store.direct or store.options or {})["endpoint_url"])
        client, prefix = direct.client(), f"corpus/litdata-{name}"
        for file in sorted(os.listdir(litdata)):
            client.upload_file(os.path.join(litdata, file), BUCKET, f"{prefix}/{file}")
        spec["litdata"] = f"s3://{BUCKET}/{prefix}"
        shutil.rmtree(litdata, ignore_errors=True)
    written[url] = spec
    return spec


def litdata_chunks(directory: str, items: Iterator[dict], chunk_bytes: int) -> bool:
    """``items`` as LitData chunks of about ``chunk_bytes`` (the cell's shard size), or
    False where litdata is not installed."""
    try:
        from litdata.streaming.writer import BinaryWriter
    except ImportError:
        return False
    writer = BinaryWriter(directory, chunk_bytes=chunk_bytes)
    for i, item in enumerate(items):
        writer.add_item(i, item)
    writer.done()
    writer.merge(1)  # node_rank None: index.json itself, not a node's part of it
    return True


# -- the contenders ---------------------------------------------------------------------------


# Each epoch of the "shardstream" contender, in order: (seconds to its first sample,
# sample MB/s from it on), by cell name. An epoch's start (the manifest, the first window's
# sidecars and reads) is paid once per epoch and worker whatever the corpus' size, so on
# a corpus of a few windows it weighs far more than on a training corpus: the rate from
# the first sample on tells the two apart.
STARTS: dict[str, list[tuple[float, float]]] = {}


def shardstream_epoch(
    store: Store, cell: Cell, spec: dict, budget: int | None = None, starts: list | None = None
) -> int:
    """The epoch's sample bytes; its (first sample s, MB/s from it on) appended to ``starts``."""
    options = {} if budget is None else {"read_budget": budget}
    started = time.perf_counter()
    dataset = shardstream.StreamingDataset(
        spec["url"], shuffle=cell.shuffle, seed=0, decode=False, storage_options=store.options, **options
    )
    if cell.workers <= 1:
        samples = iter(dataset)
    else:
        loader = shardstream.DataLoader(dataset, batch_size=8, num_workers=cell.workers, collate_fn=list)
        samples = (sample for batch in loader for sample in batch)
    first = len(next(samples)["bin"])
    at = time.perf_counter()
    rest = sum(len(sample["bin"]) for sample in samples)
    if starts is not None:
        starts.append((at - started, rest / MB / (time.perf_counter() - at)))
    return first + rest


def parts(spec: dict, largest: int) -> list[tuple[str, int, int]]:
    return [
        (path, start, min(start + largest, total))
        for path, total in zip(spec["paths"], spec["sizes"], strict=True)
        for start in range(0, total, largest)
    ]


def wire_epoch(store: Store, spec: dict, ranged: bool) -> int:
    """Every byte of the shards: whole files, or ranged parts (see the docstring)."""
    items = (
        parts(spec, PART)
        if ranged
        else [(p, 0, n) for p, n in zip(spec["paths"], spec["sizes"], strict=True)]
    )
    threads = THREADS if ranged else min(THREADS, len(items))
    if store.where == "local":

        def get(item: tuple[str, int, int]) -> int:
            path, start, stop = item
            fd = os.open(os.path.join(spec["url"], path), os.O_RDONLY)
            try:
                return len(os.pread(fd, stop - start, start))
            finally:
                os.close(fd)

    else:
        client, prefix = store.client(), spec["url"].removeprefix(f"s3://{BUCKET}/")

        def get(item: tuple[str, int, int]) -> int:
            path, start, stop = item
            key = f"{prefix}/{path}"
            if not ranged:
                return len(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
            got = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{stop - 1}")
            return len(got["Body"].read())

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(get, items))


_LITDATA_OPTIONS = ("endpoint_url", "aws_access_key_id", "aws_secret_access_key")


def litdata_epoch(store: Store, cell: Cell, spec: dict) -> int:
    """LitData's epoch; on S3 a cold one (a fresh cache dir), as shardstream's is."""
    import litdata

    if store.where == "local":
        dataset = litdata.StreamingDataset(spec["litdata"], shuffle=cell.shuffle, seed=0)
        return _litdata_bytes(litdata, dataset, cell)
    import litdata.streaming.downloader as downloader
    from bench_wan_runs import boto_kwargs

    # its obstore client (its fast path) refuses an http:// endpoint without allow_http
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}
    assert store.env is not None
    options = {k: v for k, v in boto_kwargs(store.endpoint, store.env).items() if k in _LITDATA_OPTIONS}
    cache = tempfile.mkdtemp(prefix="bench-matrix-litdata-")
    try:
        dataset = litdata.StreamingDataset(
            spec["litdata"], shuffle=cell.shuffle, seed=0, cache_dir=cache, storage_options=options
        )
        return _litdata_bytes(litdata, dataset, cell)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _litdata_bytes(litdata, dataset, cell: Cell) -> int:  # type: ignore[no-untyped-def]
    if cell.workers <= 1:
        return sum(len(sample["bin"]) for sample in dataset)
    loader = litdata.StreamingDataLoader(dataset, batch_size=8, num_workers=cell.workers, collate_fn=list)
    return sum(len(sample["bin"]) for batch in loader for sample in batch)


def contenders(
    store: Store, cell: Cell, spec: dict, budgets: list[int] | None = None
) -> dict[str, Callable[[], int]]:
    """Each contender's epoch, giving the sample bytes it read (MB/s: bytes / 2**20 / s);
    shardstream with ``budgets[0]`` (None: the default read budget), and once more with
    each further one."""
    first, *more = budgets or [None]
    out: dict[str, Callable[[], int]] = {
        "shardstream": lambda: (
            shardstream_epoch(store, cell, spec, first, STARTS.setdefault(cell.name, [])) / MB
        ),
        "whole files": lambda: wire_epoch(store, spec, ranged=False) / MB,
        "ranged parts": lambda: wire_epoch(store, spec, ranged=True) / MB,
    }
    for budget in more:
        out[f"shardstream budget={shown(budget)}"] = functools.partial(_budgeted, store, cell, spec, budget)
    if "litdata" in spec:
        out["litdata"] = lambda: _peer("litdata", lambda: litdata_epoch(store, cell, spec) / MB)
    return out


def _budgeted(store: Store, cell: Cell, spec: dict, budget: int) -> float:
    return shardstream_epoch(store, cell, spec, budget) / MB


class PeerFailed(Exception):
    """A peer's epoch failed: its cell is measured again without it."""


def _peer(name: str, epoch: Callable[[], float]) -> float:
    try:
        return epoch()
    except Exception as error:  # a peer's own bug (LitData's obstore panics on some servers)
        raise PeerFailed(f"{name}: {type(error).__name__}: {str(error)[:200]}") from error


# -- the matrix -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    cell: Cell
    rates: Rates
    starts: list[tuple[float, float]]  # the timed rounds' (first sample s, MB/s from it on)

    def ratio(self, others: list[str], ours: str = "shardstream") -> float:
        present = [o for o in others if o in self.rates.names]
        return statistics.median(self.rates.ratios(present, ours)) if present else float("nan")

    @property
    def first_ms(self) -> float:
        return 1000 * statistics.median(first for first, _ in self.starts)

    def after_first(self) -> float:
        """shardstream's rate from its first sample on over the best wire's whole epoch in
        the same round, the median over rounds."""
        wire = [max(r["whole files"], r["ranged parts"]) for r in self.rates.rounds]
        return statistics.median(after / best for (_, after), best in zip(self.starts, wire, strict=True))

    def line(self) -> str:
        wire = self.ratio(["whole files", "ranged parts"])
        text = (
            f"  {self.cell.name:<44} {self.rates.rate('shardstream'):>9,.0f} MB/s   / best wire {wire:.2f}x"
            f"   (first sample {self.first_ms:.0f} ms, from it on {self.after_first():.2f}x)"
        )
        if "litdata" in self.rates.names:
            text += f"   / litdata {self.ratio(['litdata']):.2f}x"
        wires = ", ".join(f"{name} {self.rates.rate(name):,.0f}" for name in ("whole files", "ranged parts"))
        lines = [f"{text}   ({wires} MB/s)"]
        for name in self.rates.names:
            if name.startswith("shardstream "):  # another read budget (--read-budget)
                ratio = self.ratio(["whole files", "ranged parts"], name)
                lines.append(f"    {name:<42} {self.rates.rate(name):>9,.0f} MB/s   / best wire {ratio:.2f}x")
        return "\n".join(lines)


def s3_server(kind: str, stack: list) -> tuple[dict, dict]:
    """An S3 server of ``kind`` (moto, seaweedfs) with the bucket: its storage options and
    environment."""
    if kind == "moto":
        server = MotoProcess(BUCKET)
        stack.append(server)
        return server.options(), server.env
    from shardstream.testing import SeaweedFS

    seaweed = SeaweedFS()
    stack.append(seaweed)
    seaweed.start()
    seaweed.create_bucket(BUCKET)
    return seaweed.storage_options(), seaweed.env()


def stores(
    where: list[str], work: str, latency: float, bandwidth: float, stack: list, server: str = "moto"
) -> dict[str, Store]:
    out = {}
    if "local" in where:
        out["local"] = Store("local", os.path.join(work, "local"))
    if "s3" in where or "wan" in where:
        direct, env = s3_server(server, stack)
        endpoint = direct["endpoint_url"]
        if "s3" in where:
            out["s3"] = Store("s3", f"s3://{BUCKET}/corpus", direct, endpoint, env)
        if "wan" in where:
            from bench_wan import ProxyProcess

            proxy = ProxyProcess(endpoint, latency, bandwidth)
            stack.append(proxy)
            options = dict(direct, endpoint_url=proxy.endpoint)
            out["wan"] = Store("wan", f"s3://{BUCKET}/corpus", options, proxy.endpoint, env, direct)
    return out


def run(args: argparse.Namespace) -> list[Result]:
    work = tempfile.mkdtemp(prefix="bench-matrix-")
    stack: list = []
    results = []
    try:
        where = stores(args.where, work, args.latency, args.bandwidth, stack, args.server)
        written: dict[str, dict] = {}
        for place, sample, shard in itertools.product(args.where, args.samples, args.shards):
            for shuffle, workers in itertools.product(args.shuffle, args.workers):
                cell = Cell(place, sample, shard, shuffle, workers, args.server)
                spec = corpus(where[place], cell, args.corpus, work, written)
                runs = contenders(where[place], cell, spec, args.read_budget)
                try:
                    rates = measure(runs, args.repeat)
                except PeerFailed as failed:
                    print(f"  {cell.name}: {failed}; measured without it", flush=True)
                    runs.pop("litdata")
                    STARTS.pop(cell.name, None)
                    rates = measure(runs, args.repeat)
                result = Result(cell, rates, STARTS.pop(cell.name)[1:])  # not the untimed run's
                print(result.line(), flush=True)
                results.append(result)
    finally:
        for process in reversed(stack):
            process.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


def recorded(results: list[Result], command: str) -> None:
    from results import record

    ratios = {r.cell.name: r.ratio(["whole files", "ranged parts"]) for r in results}
    litdata = {
        f"{r.cell.name} / litdata": r.ratio(["litdata"]) for r in results if "litdata" in r.rates.names
    }
    after = {f"{r.cell.name}, from its first sample on": r.after_first() for r in results}
    rates = "; ".join(
        f"{r.cell.name} {r.rates.rate('shardstream'):,.0f} (first sample {r.first_ms:,.0f} ms)"
        for r in results
    )
    seaweed = any(r.cell.server == "seaweedfs" and r.cell.where != "local" for r in results)
    claim = "matrix-seaweedfs" if seaweed else "matrix"
    note = f"shardstream MB/s by cell, and the median time to its first sample: {rates}."
    record(claim, command, {}, ratios={**ratios, **after, **litdata}, note=note)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    listed = lambda kind: lambda text: [kind(part) for part in text.split(",")]  # noqa: E731
    yes = lambda text: text in ("yes", "true", "1", "shuffled")  # noqa: E731
    parser.add_argument("--quick", action="store_true", help="a subset: a few minutes on 2 cores")
    parser.add_argument("--where", type=listed(str), default=["local", "s3", "wan"])
    parser.add_argument("--samples", type=listed(size), default=[250, 100_000, MB, 16 * MB])
    parser.add_argument("--shards", type=listed(size), default=[8 * MB, 32 * MB, 128 * MB, 512 * MB])
    parser.add_argument("--shuffle", type=listed(yes), default=[False, True])
    parser.add_argument("--workers", type=listed(int), default=[1, 2])
    parser.add_argument(
        "--corpus", type=size, default=256 * MB, help="sample bytes per cell (2 shards at least)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.03)
    parser.add_argument("--bandwidth", type=float, default=40e6)
    parser.add_argument(
        "--server", choices=["moto", "seaweedfs"], default="moto", help="the S3 server of s3 and wan"
    )
    parser.add_argument(
        "--read-budget",
        type=listed(size),
        help="shardstream's read_budget (default: the library's); more than one: a contender each",
    )
    parser.add_argument("--record", action="store_true", help="keep the ratios in docs/benchmarks.json")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.shards, args.shuffle, args.workers = [250, MB], [8 * MB], [False, True], [1, 2]
        args.corpus, args.repeat = 16 * MB, 1
    unknown = set(args.where) - {"local", "s3", "wan"}
    if unknown:
        parser.error(f"--where: unknown storage {sorted(unknown)} (local, s3, wan)")
    if args.record and args.read_budget:
        parser.error("--record keeps the default read options' figures: not with --read-budget")
    if args.record and args.quick:
        parser.error("--record keeps a run's figures as the current ones: not those of a --quick run")
    print(
        f"cells: shardstream MB/s, and its paired ratio to the best wire reference (median of {args.repeat})"
    )
    results = run(args)
    if args.record:
        from results import command_line

        recorded(results, command_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
