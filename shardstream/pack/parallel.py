"""The pool of a pack: processes that size and write the shard jobs, results in shard order.

# NOTE [ Deterministic parallel pack ]
# The bytes of a dataset must not depend on ``workers``. They depend only on the sample
# order and on where shards are cut, so the parent process cuts every shard: it takes
# the samples in source order with their sizes (``Source.size``: the folder source sizes
# files from their ``stat`` without reading them) and cuts by NOTE [ Shard boundaries ]
# in ``cutter``. Each cut becomes a ``ShardJob`` (its number and entries), and the
# process that writes it loads lazy entries itself, so file contents never cross a
# pipe. Results come back in any order and are put back in shard order for the
# manifest. With one worker every step runs in this process, in the same order.

# NOTE [ Every process sizes and writes ]
# ``workers=N`` is N processes: N - 1 worker processes and this one. An inline source
# (JSON Lines, CSV, ...) is read and parsed here, which is work enough: its shards all
# go to the N - 1 workers, and a cut shard is handed out before the next one is
# read (the source may be a pipe that waits for its writer). A lazy source (a folder of
# files) lists its samples in chunks without sizing them (``Source.chunks``, names
# only), and sizing a chunk (``Source.expand``: a ``stat`` per file) is most of the
# time cutting takes, so it is a task any process does, like writing a shard. Every
# process, this one included, takes a cut shard to write if there is one and
# otherwise sizes the next chunk; this process puts the sized chunks back in order and
# cuts them (its chunks and shards are its own work, the workers' are handed out
# whenever they are free). So no process waits on a serial cutter: while one writes a
# shard, another sizes the next, and at the end the last shards end within about one
# shard's time of each other. A worker sends its sized entries back packed, with their
# sizes; this process cuts from the sizes and forwards the packed bytes to whichever
# worker writes them (``Packed``), so entries are unpacked only where they are written.
# Sized chunks are cut in walk order, and an error found while sizing is raised only
# when the cut reaches it, so the same input fails with the same error however many
# workers there are.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any

from shardstream.errors import PackError, ShardstreamError
from shardstream.pack.durable import ShardSync
from shardstream.pack.jobs import (
    EntrySizer,
    JobContext,
    Packed,
    PackProgress,
    ShardJob,
    ShardJobs,
    Sized,
    pack_entries,
    size_chunk,
    too_deep,
    write_job,
)
from shardstream.pack.jobs import (
    ShardPlan as ShardPlan,
)
from shardstream.pack.lifeline import cap_workers, die_with_parent, usable_cores
from shardstream.pack.shard import ShardResult

_WORKER: dict[str, Any] = {}


def _init_worker(context: JobContext, parent: int, children: int = 1) -> None:
    die_with_parent(parent)  # NOTE [ Workers die with their pack ] in ``lifeline``
    gc.disable()  # NOTE [ Garbage collection during a pack ]
    if context.options.tokenizing is not None:  # NOTE [ Tokenizing in the pack's workers ] in ``tokenize``
        os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, usable_cores() // children)))
    _WORKER["context"] = context
    _WORKER["size"] = EntrySizer(context.source, context.options)


def _work(job: ShardJob) -> ShardResult:
    try:
        return write_job(job, _WORKER["context"], on_stored=_synced_by_parent)
    finally:
        gc.collect(1)


# NOTE [ Garbage collection during a pack ]
# A pack makes millions of small objects (entries: tuples and strings) that live until
# their shard is written. CPython's cyclic collector runs every 700 allocations, and its
# full collections rescan every object still alive: a visible share of the time of a pack
# of small files. None of these objects is part of a cycle, so every process of a pack
# turns automatic collection off while it runs and collects the young generations after
# each shard instead: the rare cycles (an exception's frames, the asyncio objects of an
# S3 upload) are still freed, and the entries of cut shards are not rescanned.
@contextmanager
def _collect_per_shard() -> Iterator[None]:
    """No automatic garbage collection in this process while the block runs (NOTE above)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _work_pickled(job: bytes) -> ShardResult:
    return _work(pickle.loads(job))


def _size(chunk: tuple[Any, ...]) -> list[Sized | tuple[Any, ...]]:
    parts = size_chunk(chunk, _WORKER["size"])
    return [Sized(pack_entries(p.entries), p.sizes) if isinstance(p, Sized) else p for p in parts]


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
    jobs: ShardJobs,
    context: JobContext,
    workers: int,
    sync: ShardSync,
    progress: PackProgress | None = None,
) -> list[ShardResult]:
    """Write every shard of ``jobs``; results in shard order. One worker: all in this process.

    Local shards are fsynced by ``sync`` as they are done (NOTE [ Durable before the manifest ]).
    ``workers`` is capped at what can be used (``lifeline.cap_workers``), with a logged note.
    """
    workers = cap_workers(workers, None if jobs.stop is None else jobs.stop - jobs.start)
    with _collect_per_shard():
        return _run_jobs(jobs, context, workers, sync, progress)


def _run_jobs(
    jobs: ShardJobs, context: JobContext, workers: int, sync: ShardSync, progress: PackProgress | None
) -> list[ShardResult]:
    lazy = context.source.lazy
    if workers <= 1 and not lazy:
        results = []
        for job in jobs.scan():
            results.append(write_job(job, context, progress, on_stored=sync.add))
            gc.collect(1)
        return results
    # The workers start (fork) while the first shard is cut, not after it: a
    # cut shard waiting for a worker is a core idle.
    pool = _Pool(context, workers - 1 if lazy else workers, sync, progress)
    try:
        if lazy:
            pool.share(jobs)
        else:
            pool.hand_out(jobs.scan())
    except BrokenProcessPool:
        raise PackError("a pack worker process died (out of memory, or killed)") from None
    finally:
        pool.close()
    return [pool.done[number] for number in sorted(pool.done)]


class _Chunk:
    """A chunk of a lazy source, in walk order: being sized by a worker (``future``), or
    sized and waiting for the cut (``sized``: its entries, or the error sizing gave)."""

    __slots__ = ("chunk", "future", "sized")

    def __init__(self, chunk: tuple[Any, ...], sized: Sized | BaseException | None = None) -> None:
        self.chunk = chunk
        self.future: Future[list[Sized | tuple[Any, ...]]] | None = None
        self.sized = sized


_AHEAD = 2  # chunks waiting in a worker's queue, so it never waits for this process to look


class _Pool:
    """Worker processes writing shards and sizing chunks, and the shards written, by number.

    With no worker process (``children=0``) every task runs here, in order.
    """

    def __init__(
        self, context: JobContext, children: int, sync: ShardSync, progress: PackProgress | None
    ) -> None:
        self.context = context
        self.children = children
        self.sync = sync
        self.progress = progress
        self.done: dict[int, ShardResult] = {}
        self.writing: dict[Future[ShardResult], int] = {}  # shard number, by future
        self.sizing: dict[Future[Any], _Chunk] = {}
        self.ready: deque[ShardJob] = deque()  # cut shards no process has taken yet
        self.chunks: list[_Chunk] = []  # the walk from the next sample to cut on, in order
        self.walk: Iterator[Any] = iter(())
        self.walked = False  # every chunk taken from the source (or the slice is full)
        self.cut_all = False  # and every shard cut
        self.jobs: ShardJobs | None = None
        self.size = EntrySizer(context.source, context.options)
        self.pool: ProcessPoolExecutor | None = None
        if children:
            self.pool = ProcessPoolExecutor(
                children,
                mp_context=_mp_context(),
                initializer=_init_worker,
                initargs=(context, os.getpid(), children),
            )
            self.pool.submit(os.getpid)  # with fork, every worker starts at the first submit

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def collect(self, block: bool = False) -> None:
        """Take the results of finished tasks (waiting for one if ``block``)."""
        busy = [*self.writing, *self.sizing]
        finished = wait(busy, return_when=FIRST_COMPLETED)[0] if block else [f for f in busy if f.done()]
        for future in sorted(finished, key=lambda f: self.writing.get(f, -1)):
            if future in self.sizing:
                chunk = self.sizing.pop(future)
                error = future.exception()
                if error is None:
                    self.expanded(chunk, future.result(), packed=True)
                else:
                    chunk.sized = error  # raised when the cut reaches it, as in one process
                continue
            result = self.done[self.writing.pop(future)] = future.result()
            gc.collect(1)
            self.sync.add(result.info.path)
            self.sync.add(result.info.index)
            if self.progress is not None:
                self.progress.update(result.info.samples, result.info.bytes)

    def submit(self, job: ShardJob) -> Future[ShardResult]:
        """Give ``job`` to a worker, pickled here: the pool's own threads would pickle it
        only when this busy thread lets them have the GIL (a worker would wait for it)."""
        if self.pool is None:
            raise PackError(f"shard job {job.name} was handed to a pack pool that has no worker process")
        try:
            blob = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        except RecursionError:
            raise too_deep(job, self.context.source) from None
        return self.pool.submit(_work_pickled, blob)

    def hand_out(self, jobs: Iterator[ShardJob]) -> None:
        """Worker processes write every shard; this one only cuts (an inline source reads here)."""
        if self.pool is None:
            raise PackError("a pack pool with no worker process was asked to hand out every shard")
        for job in jobs:
            # Bounded: at most two shards per worker cut ahead of the writers.
            while len(self.writing) >= 2 * self.children:
                self.collect(block=True)
            self.writing[self.submit(job)] = job.number
            self.collect()
        while self.writing:
            self.collect(block=True)

    def share(self, jobs: ShardJobs) -> None:
        """Every process sizes chunks and writes shards (NOTE [ Every process sizes and writes ])."""
        self.jobs = jobs
        self.walk = jobs.source.chunks()
        while True:
            self.feed()
            if self.ready:  # the largest cut shard (the last one is often a small one)
                job = max(reversed(self.ready), key=lambda job: job.samples)
                self.ready.remove(job)
                self.done[job.number] = write_job(
                    job, self.context, self.progress, on_stored=self.sync.add, feed=self.feed
                )
                gc.collect(1)
            elif (chunk := self.unsized()) is not None:
                try:
                    parts = size_chunk(chunk.chunk, self.size)
                except ShardstreamError as error:
                    chunk.sized = error  # raised when the cut reaches it, as from a worker
                else:
                    self.expanded(chunk, parts)
            elif self.writing or self.sizing:
                self.collect(block=True)
            elif self.cut_all:
                break

    def feed(self) -> None:
        """Collect results, cut what is sized in order, and give free workers a task."""
        self.collect()
        self.cut()
        if self.pool is None:
            return
        while self.ready and len(self.writing) < self.children:
            job = self.ready.popleft()
            self.writing[self.submit(job)] = job.number
        free = self.children - len(self.writing)
        while len(self.sizing) < _AHEAD * free and (chunk := self.unsized()) is not None:
            chunk.future = self.pool.submit(_size, chunk.chunk)
            self.sizing[chunk.future] = chunk

    def expanded(self, chunk: _Chunk, parts: list[Sized | tuple[Any, ...]], packed: bool = False) -> None:
        """Put what ``chunk`` held in its place in the walk: sized entries, and chunks found in it."""
        found = []
        for part in parts:
            if not isinstance(part, Sized):
                found.append(_Chunk(part))
            else:
                entries = Packed(part.entries, 0, len(part.sizes)) if packed else part.entries
                found.append(_Chunk((), Sized(entries, part.sizes)))
        for i, other in enumerate(self.chunks):
            if other is chunk:
                self.chunks[i : i + 1] = found
                return

    def cut(self) -> None:
        """Cut the entries sized so far, in walk order, into shard jobs."""
        jobs = self.jobs
        if jobs is None:
            raise PackError(
                "a pack pool was asked to cut sized chunks before it was given the shard jobs (share)"
            )
        chunks = self.chunks
        taken = 0
        while taken < len(chunks) and (sized := chunks[taken].sized) is not None:
            taken += 1
            if isinstance(sized, BaseException):
                raise sized
            self.ready += jobs.take(sized.entries, sized.sizes)
            if jobs.full:
                self.walked = True
                taken = len(chunks)
        del chunks[:taken]
        if not chunks and self.walked and not self.cut_all:
            self.ready += jobs.finish()
            self.cut_all = True

    def unsized(self) -> _Chunk | None:
        """The first chunk no process is sizing, near the cut, taken from the source if need be."""
        near = _AHEAD * (self.children + 1) + 2
        for chunk in self.chunks[:near]:
            if chunk.future is None and chunk.sized is None:
                return chunk
        if self.walked or len(self.chunks) >= near:
            return None
        data = next(self.walk, None)
        if data is None:
            self.walked = True  # the next cut() gives the last shard
            return None
        chunk = _Chunk(data)
        self.chunks.append(chunk)
        return chunk
