"""Cut a source into shards in the parent process; write the shards there and in worker processes.

# NOTE [ Deterministic parallel pack ]
# The bytes of a dataset must not depend on ``workers``. They depend only on the sample
# order and on where shards are cut, so the parent process does both: it scans the
# source in order, sizes every sample (``Source.size``: the folder source sizes files
# from the listing without reading them) and cuts shards by NOTE [ Shard boundaries ]
# in ``writer``. Each cut becomes a ``ShardJob`` (its number and entries), and a worker
# writes the whole shard, loading lazy entries itself, so file contents never cross a
# pipe. Results come back in any order and are put back in shard order for the
# manifest. With one worker the same jobs run in this process.

# NOTE [ This process writes shards too ]
# ``workers=N`` is N processes writing shards: N - 1 worker processes and this one,
# which also plans them. A worker gets one shard at a time. This process keeps one shard
# planned ahead for each worker and hands it over as soon as the worker is free (it
# looks every few dozen samples, while it plans and while it writes); with one more
# planned than that, it writes the largest planned shard itself. So the planner never
# competes with N busy workers for N cores, a worker rarely waits for a plan, and at
# the end no process waits on a queue of shards another one could have taken: the last
# shards end within about one shard's time of each other. An inline source (JSON
# Lines, CSV, ...) is read and parsed here, which is work enough: its shards all go to
# N worker processes, and a planned shard is handed out before the next one is read
# (the source may be a pipe that waits for its writer).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol

from shardstream.errors import PackError, ShardstreamError
from shardstream.formats import get_format
from shardstream.manifest import ShardInfo
from shardstream.pack.durable import ShardSync
from shardstream.pack.options import PackOptions
from shardstream.pack.shard import ShardOutput, ShardResult
from shardstream.pack.sizing import sample_sizer
from shardstream.pack.sources.base import Entry, Source, tar_ready
from shardstream.pack.writer import oversize_error
from shardstream.storage import Storage

__all__ = ["JobContext", "ShardJob", "Ticker", "cut_shards", "default_workers", "run_jobs"]


@dataclass(frozen=True, slots=True)
class ShardJob:
    """One shard to write: its number and name, its entries, and what it must match."""

    number: int
    name: str
    entries: list[Entry]
    expected: ShardInfo | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to a worker as columns (keys, samples, ...), not one Entry object each:
        # pickling a shard's entries takes ~10x less time (about 0.05 s per 100k). Entries
        # that only say where a sample is (lazy sources) are also compressed, ~10x (about
        # 1 ms per 15k): the bytes go through a pipe 64 KiB at a time, each write waiting
        # for this process's busy thread to let the pool's feeder thread run.
        columns: Any = tuple(zip(*self.entries, strict=True))
        if columns and all(sample is None for sample in columns[1]):
            columns = zlib.compress(pickle.dumps(columns, protocol=pickle.HIGHEST_PROTOCOL), 1)
        return (_rebuild_job, (self.number, self.name, columns, self.expected))


def _rebuild_job(number: int, name: str, columns: Any, expected: ShardInfo | None) -> ShardJob:
    if isinstance(columns, bytes):
        columns = pickle.loads(zlib.decompress(columns))
    return ShardJob(number, name, list(map(Entry._make, zip(*columns, strict=True))), expected)


@dataclass(frozen=True, slots=True)
class JobContext:
    """What every shard job needs besides its entries (pickled once per worker)."""

    storage: Storage
    source: Source
    format: str
    compression: str | None


def default_workers() -> int:
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Ticker:
    """A hook that planning calls every few hundred samples (``hook`` is set by the writers)."""

    __slots__ = ("hook",)

    def __init__(self) -> None:
        self.hook: Callable[[], None] | None = None

    def __call__(self) -> None:
        if self.hook is not None:
            self.hook()


_PLAN_TICK = 256  # samples planned between ticks


def cut_shards(
    source: Source,
    options: PackOptions,
    start: int = 0,
    stop: int | None = None,
    tick: Callable[[], None] | None = None,
) -> Iterator[list[Entry]]:
    """The entries of each shard, in order (NOTE [ Shard boundaries ] in ``writer``)."""
    fmt = options.fmt
    budget, max_samples = options.limits()
    sized = options.shard_size is not None
    adapt = fmt.name == "tar" and not source.lazy
    measure = sample_sizer(fmt)
    entries: list[Entry] = []
    nbytes = 0
    for entry in source.scan(start, stop):
        if adapt and entry.sample is not None:
            entry = entry._replace(sample=tar_ready(entry.sample, entry.url, entry.line))
        size = 0
        if sized:
            try:
                size = measure(entry.sample) if entry.sample is not None else source.size(entry, fmt)
            except ShardstreamError as error:
                raise _at_entry(error, entry, source) from None
            if size > budget:
                raise _at_entry(oversize_error(entry.key, size, options, budget), entry, source)
        if entries and (len(entries) >= max_samples or nbytes + size > budget):
            yield entries
            entries, nbytes = [], 0
        entries.append(entry)
        nbytes += size
        if tick is not None and len(entries) % _PLAN_TICK == 0:
            tick()
    if entries:
        yield entries


def _at_entry(error: ShardstreamError, entry: Entry, source: Source) -> PackError:
    """``error`` as a PackError naming the entry's file (or the sample's first file) and line."""
    message = error.message if entry.key in error.message else f"sample {entry.key!r}: {error.message}"
    return PackError(
        message,
        url=error.url or source.entry_url(entry),
        shard=error.shard,
        offset=error.offset,
        line=entry.line,
    )


class Progress(Protocol):
    def update(self, samples: int, nbytes: int) -> None: ...


_TICK = 1024  # samples between progress updates while a shard is written in this process
_FEED = 64  # samples between looks for a free worker while this process writes a shard


def write_job(
    job: ShardJob,
    context: JobContext,
    progress: Progress | None = None,
    on_stored: Callable[[str], None] | None = None,
    feed: Callable[[], None] | None = None,
) -> ShardResult:
    """Write one shard, loading its entries (in a worker, or in the parent).

    ``on_stored`` is as in ``ShardOutput``; ``feed`` is called every few dozen samples
    (NOTE [ This process writes shards too ]).
    """
    fmt = get_format(context.format)
    source = context.source
    load = source.load if source.lazy else None
    output = ShardOutput(
        context.storage,
        fmt,
        job.name,
        compression=context.compression,
        expected=job.expected,
        on_stored=on_stored,
    )
    write = output.write
    reported = (0, 0)
    try:
        for done, entry in enumerate(job.entries, 1):
            try:
                write(load(entry) if load is not None else entry.sample)  # type: ignore[arg-type]
            except ShardstreamError as error:
                raise _at_entry(error, entry, source) from None
            if done % _FEED == 0:
                if feed is not None:
                    feed()
                if progress is not None and done % _TICK == 0:
                    progress.update(done - reported[0], output.num_bytes - reported[1])
                    reported = (done, output.num_bytes)
    except BaseException:
        output.abort()
        raise
    result = output.finish()
    if progress is not None:
        progress.update(result.info.samples - reported[0], result.info.bytes - reported[1])
    return result


_WORKER: dict[str, JobContext] = {}


def _init_worker(context: JobContext) -> None:
    _WORKER["context"] = context


def _work(job: ShardJob) -> ShardResult:
    return write_job(job, _WORKER["context"], on_stored=_synced_by_parent)


def _synced_by_parent(path: str) -> None:
    """A worker leaves fsync to the parent, which syncs each shard as its result arrives."""


def _mp_context() -> Any:
    """fork when no thread but fsspec's could hold a lock across it (fast); spawn otherwise.

    fsspec's event-loop thread ("fsspecIO", made by the first S3 call) is safe: fsspec
    resets its loop in a forked child, and ``Storage`` makes a fresh file system there.
    """
    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    if "fork" in multiprocessing.get_all_start_methods() and all(t.name == "fsspecIO" for t in others):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def run_jobs(
    jobs: Iterator[ShardJob],
    context: JobContext,
    workers: int,
    sync: ShardSync,
    progress: Progress | None = None,
    ticker: Ticker | None = None,
) -> list[ShardResult]:
    """Write every job's shard; results in shard order. One worker: all in this process.

    Local shards are fsynced by ``sync`` as they are done (NOTE [ Durable before the manifest ]).
    ``ticker`` is the one planning calls (``cut_shards(tick=...)``): free workers get the
    shards already planned while the next one is.
    """
    if workers <= 1:
        return [write_job(job, context, progress, on_stored=sync.add) for job in jobs]
    # The workers start (fork) while the first shard is planned, not after it: a
    # planned shard waiting for a worker is a core idle.
    pool = _Pool(context, workers if not context.source.lazy else workers - 1, sync, progress)
    try:
        if context.source.lazy:
            if ticker is not None:
                ticker.hook = pool.hand_ready
            pool.share(jobs)
        else:
            pool.hand_out(jobs)
    except BrokenProcessPool:
        raise PackError("a pack worker process died (out of memory, or killed)") from None
    finally:
        if ticker is not None:
            ticker.hook = None
        pool.close()
    return [pool.done[number] for number in sorted(pool.done)]


class _Pool:
    """Worker processes writing shards, and the results they gave, by shard number."""

    def __init__(
        self, context: JobContext, children: int, sync: ShardSync, progress: Progress | None
    ) -> None:
        self.context = context
        self.children = children
        self.sync = sync
        self.progress = progress
        self.done: dict[int, ShardResult] = {}
        self.busy: dict[Future[ShardResult], int] = {}
        self.ready: deque[ShardJob] = deque()  # planned shards no process has taken yet
        self.jobs: Iterator[ShardJob] = iter(())
        self.exhausted = False
        self.pool = ProcessPoolExecutor(
            children, mp_context=_mp_context(), initializer=_init_worker, initargs=(context,)
        )
        self.pool.submit(os.getpid)  # with fork, every worker starts at the first submit

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def collect(self, block: bool = False) -> None:
        busy = self.busy
        finished = wait(busy, return_when=FIRST_COMPLETED)[0] if block else [f for f in busy if f.done()]
        for future in sorted(finished, key=busy.__getitem__):
            result = self.done[busy.pop(future)] = future.result()
            self.sync.add(result.info.path)
            self.sync.add(result.info.index)
            if self.progress is not None:
                self.progress.update(result.info.samples, result.info.bytes)

    def hand_out(self, jobs: Iterator[ShardJob]) -> None:
        """Worker processes write every shard; this one only plans (an inline source reads here)."""
        for job in jobs:
            # Bounded: at most two shards per worker planned ahead of the writers.
            while len(self.busy) >= 2 * self.children:
                self.collect(block=True)
            self.busy[self.pool.submit(_work, job)] = job.number
            self.collect()
        while self.busy:
            self.collect(block=True)

    def share(self, jobs: Iterator[ShardJob]) -> None:
        """Worker processes and this one write the shards (NOTE [ This process writes shards too ])."""
        self.jobs = jobs
        ready = self.ready
        while True:
            self.feed()
            if len(ready) <= self.children and not self.exhausted:
                self.plan()
                continue
            if not ready:
                break
            # Every worker busy and a shard planned for each, or nothing left to plan: this
            # process writes the largest planned shard (the last one is often a small one).
            job = max(reversed(ready), key=lambda job: len(job.entries))
            ready.remove(job)
            self.done[job.number] = write_job(
                job, self.context, self.progress, on_stored=self.sync.add, feed=self.feed
            )
        while self.busy:
            self.collect(block=True)

    def plan(self) -> None:
        job = next(self.jobs, None)
        if job is None:
            self.exhausted = True
        else:
            self.ready.append(job)

    def feed(self) -> None:
        """Give each free worker a planned shard; keep one planned ahead for each worker."""
        self.hand_ready()
        while len(self.ready) < self.children and not self.exhausted:
            self.plan()
            self.hand_ready()

    def hand_ready(self) -> None:
        """Give each free worker a shard already planned (called while the next one is planned too)."""
        self.collect()
        while self.ready and len(self.busy) < self.children:
            job = self.ready.popleft()
            self.busy[self.pool.submit(_work, job)] = job.number
