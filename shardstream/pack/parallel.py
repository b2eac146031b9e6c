"""Cut a source into shards in the parent process; size and write them in any process.

# NOTE [ Deterministic parallel pack ]
# The bytes of a dataset must not depend on ``workers``. They depend only on the sample
# order and on where shards are cut, so the parent process cuts every shard: it takes
# the samples in source order with their sizes (``Source.size``: the folder source sizes
# files from their ``stat`` without reading them) and cuts by NOTE [ Shard boundaries ]
# in ``writer``. Each cut becomes a ``ShardJob`` (its number and entries), and the
# process that writes it loads lazy entries itself, so file contents never cross a
# pipe. Results come back in any order and are put back in shard order for the
# manifest. With one worker every step runs in this process, in the same order.

# NOTE [ Every process plans and writes ]
# ``workers=N`` is N processes: N - 1 worker processes and this one. An inline source
# (JSON Lines, CSV, ...) is read and parsed here, which is work enough: its shards all
# go to the N - 1 workers, and a planned shard is handed out before the next one is
# read (the source may be a pipe that waits for its writer). A lazy source (a folder of
# files) lists its samples in chunks without sizing them (``Source.chunks``, names
# only), and sizing a chunk (``Source.expand``: a ``stat`` per file) is most of the
# time a plan takes, so it is a task any process does, like writing a shard. Every
# process, this one included, takes a planned shard to write if there is one and
# otherwise sizes the next chunk; this process puts the sized chunks back in order and
# cuts them (its chunks and shards are its own work, the workers' are handed out
# whenever they are free). So no process waits on a serial planner: while one writes a
# shard, another sizes the next, and at the end the last shards end within about one
# shard's time of each other. A worker sends its sized entries back packed, with their
# sizes; this process cuts from the sizes and forwards the packed bytes to whichever
# worker writes them (``Packed``), so entries are unpacked only where they are written.
# Sized chunks are cut in walk order, and an error found while sizing is raised only
# when the cut reaches it, so the same input fails with the same error however many
# workers there are.

# NOTE [ Garbage collection during a pack ]
# A pack makes millions of small objects (entries: tuples and strings) that live until
# their shard is written. CPython's cyclic collector runs every 700 allocations, and its
# full collections rescan every object still alive: about 5% of the time of a pack of
# small files. None of these objects is part of a cycle, so every process of a pack
# turns automatic collection off while it runs and collects the young generations after
# each shard instead: the rare cycles (an exception's frames, the asyncio objects of an
# S3 upload) are still freed, and the planned entries are not rescanned.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from shardstream.errors import PackError, ShardstreamError
from shardstream.manifest import ShardInfo
from shardstream.pack.durable import ShardSync
from shardstream.pack.lifeline import cap_workers, die_with_parent
from shardstream.pack.options import PackOptions
from shardstream.pack.shard import ShardOutput, ShardResult
from shardstream.pack.sizing import sample_sizer
from shardstream.pack.sources.base import Entry, Source, tar_ready
from shardstream.pack.writer import oversize_error
from shardstream.storage import Storage

__all__ = ["JobContext", "ShardJob", "ShardPlan", "run_jobs"]


@dataclass(frozen=True, slots=True)
class ShardJob:
    """One shard to write: its number and name, its entries, and what it must match.

    The entries come in parts, in order: lists of entries, and entries a worker sized
    that this process never unpacked (``Packed``).
    """

    number: int
    name: str
    parts: tuple[list[Entry] | Packed, ...]
    expected: ShardInfo | None = None

    @property
    def entries(self) -> list[Entry]:
        entries: list[Entry] = []
        for part in self.parts:
            entries += part.unpack() if isinstance(part, Packed) else part
        return entries

    @property
    def samples(self) -> int:
        return sum(map(len, self.parts))

    def __reduce__(self) -> tuple[Any, ...]:
        parts = [part if isinstance(part, Packed) else _pack_entries(part) for part in self.parts]
        return (_rebuild_job, (self.number, self.name, parts, self.expected))


def _rebuild_job(number: int, name: str, parts: list[Any], expected: ShardInfo | None) -> ShardJob:
    entries: list[Entry] = []
    for part in parts:
        entries += part.unpack() if isinstance(part, Packed) else _unpack_entries(part)
    return ShardJob(number, name, (entries,), expected)


class Packed:
    """Entries ``[lo, hi)`` of a chunk that a worker sized, as it packed them.

    This process cuts shards from the sizes alone and forwards the bytes to the worker
    that writes the shard; only a shard it writes itself is unpacked here.
    """

    __slots__ = ("blob", "hi", "lo")

    def __init__(self, blob: bytes, lo: int, hi: int) -> None:
        self.blob, self.lo, self.hi = blob, lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, where: slice) -> Packed:
        start, stop, _ = where.indices(len(self))
        return Packed(self.blob, self.lo + start, self.lo + max(start, stop))

    def unpack(self) -> list[Entry]:
        return _unpack_entries(self.blob)[self.lo : self.hi]

    def __reduce__(self) -> tuple[Any, ...]:
        return (Packed, (self.blob, self.lo, self.hi))


def _pack_entries(entries: list[Entry]) -> Any:
    """``entries`` as columns (keys, samples, ...), not one Entry object each.

    Pickling a shard's entries this way takes ~10x less time (about 0.05 s per 100k).
    Entries that only say where a sample is (lazy sources) are also compressed, ~10x
    (about 1 ms per 15k): the bytes go through a pipe 64 KiB at a time, each write
    done by a thread of the pool that must wait for the GIL.
    """
    columns: Any = tuple(zip(*entries, strict=True))
    if columns and all(sample is None for sample in columns[1]):
        columns = zlib.compress(pickle.dumps(columns, protocol=pickle.HIGHEST_PROTOCOL), 1)
    return columns


def _unpack_entries(columns: Any) -> list[Entry]:
    if isinstance(columns, bytes):
        columns = pickle.loads(zlib.decompress(columns))
    return list(map(Entry._make, zip(*columns, strict=True)))


@dataclass(frozen=True, slots=True)
class JobContext:
    """What every task needs besides its entries or chunk (pickled once per worker)."""

    storage: Storage
    source: Source
    options: PackOptions


class EntrySizer:
    """The bytes each entry adds to a shard (0 if only ``samples_per_shard`` cuts)."""

    def __init__(self, source: Source, options: PackOptions) -> None:
        self.source = source
        self.fmt = options.fmt
        self.sized = options.shard_size is not None
        self.measure = sample_sizer(self.fmt)
        self.adapt = self.fmt.stores_bytes and not source.lazy

    def __call__(self, entry: Entry) -> tuple[Entry, int]:
        """``entry`` (an inline sample made ready for tar) and its size; errors name its file."""
        try:
            if self.adapt and entry.sample is not None:
                entry = entry._replace(sample=tar_ready(entry.sample, entry.url, entry.line))
            if not self.sized:
                return entry, 0
            sample = entry.sample
            return entry, self.measure(sample) if sample is not None else self.source.size(entry, self.fmt)
        except ShardstreamError as error:
            raise _at_entry(error, entry, self.source) from None
        except RecursionError:
            raise _at_entry(PackError(_TOO_DEEP), entry, self.source) from None


class ShardPlan:
    """Where the shards of a pack are cut (NOTE [ Shard boundaries ] in ``writer``).

    Takes the samples ``[start, stop)`` of the source, in order and sized, and gives the
    job of each shard they complete (``make_job(number, parts)`` names it; the parts are
    lists of entries, or ``Packed`` ones as a worker sent them).
    """

    def __init__(
        self,
        source: Source,
        options: PackOptions,
        make_job: Callable[[int, tuple[list[Entry] | Packed, ...]], ShardJob],
        start: int = 0,
        stop: int | None = None,
    ) -> None:
        self.source = source
        self.options = options
        self.make_job = make_job
        self.start = start
        self.stop = stop
        self.budget, self.max_samples = options.limits()
        self.seen = 0  # samples of the source taken so far, in or before the slice
        self.shards = 0
        self.parts: list[list[Entry] | Packed] = []  # of the shard being cut
        self.count = 0  # its samples
        self.nbytes = 0  # and their bytes

    @property
    def full(self) -> bool:
        """Whether every sample of the slice has been taken."""
        return self.stop is not None and self.seen >= self.stop

    def scan(self) -> Iterator[ShardJob]:
        """Every shard's job, the samples read and sized here (an inline source)."""
        size = EntrySizer(self.source, self.options)
        self.seen = self.start
        for entry in self.source.scan(self.start, self.stop):
            entry, nbytes = size(entry)
            yield from self.take([entry], [nbytes])
        yield from self.finish()

    def take(self, entries: list[Entry] | Packed, sizes: list[int | ShardstreamError]) -> list[ShardJob]:
        """The jobs of the shards completed by the next ``entries`` of the source, sized."""
        first = self.seen
        self.seen += len(sizes)
        lo = max(self.start - first, 0)
        hi = len(sizes) if self.stop is None else max(min(self.stop - first, len(sizes)), 0)
        budget, most = self.budget, self.max_samples
        if hi - lo > 1 and self.count + hi - lo <= most:  # the common case: all of them fit
            try:
                total = sum(sizes[lo:hi])  # type: ignore[arg-type]  # TypeError on an error
            except TypeError:
                total = budget + 1
            if self.nbytes + total <= budget:
                self._add(entries[lo:hi])
                self.count += hi - lo
                self.nbytes += total
                return []
        jobs = []
        run = lo  # the first sample not in self.parts yet
        count, nbytes = self.count, self.nbytes
        for i in range(lo, hi):
            size = sizes[i]
            if isinstance(size, ShardstreamError):
                raise size  # found while sizing (it names the sample's file)
            if size > budget:
                entry = entries[i : i + 1]
                one = entry.unpack()[0] if isinstance(entry, Packed) else entry[0]
                raise _at_entry(oversize_error(one.key, size, self.options, budget), one, self.source)
            if count and (count >= most or nbytes + size > budget):
                self._add(entries[run:i])
                jobs.append(self._job())
                run, count, nbytes = i, 0, 0
            count += 1
            nbytes += size
        self._add(entries[run:hi])
        self.count, self.nbytes = count, nbytes
        return jobs

    def finish(self) -> list[ShardJob]:
        """The job of the last shard, once every sample has been taken."""
        return [self._job()] if self.count else []

    def _add(self, part: list[Entry] | Packed) -> None:
        parts = self.parts
        if not len(part):
            return
        if isinstance(part, list) and parts and isinstance(parts[-1], list):
            parts[-1] += part  # one list of the entries sized here
        else:
            parts.append(part)

    def _job(self) -> ShardJob:
        parts, self.parts, self.count, self.nbytes = tuple(self.parts), [], 0, 0
        self.shards += 1
        return self.make_job(self.shards - 1, parts)


class Sized(NamedTuple):
    """Entries of a lazy source, and their sizes (or the errors sizing them gave)."""

    entries: Any  # list[Entry]; from a worker, the bytes of ``_pack_entries`` (then ``Packed``)
    sizes: list[int | ShardstreamError]


def size_chunk(chunk: tuple[Any, ...], size: EntrySizer) -> list[Sized | tuple[Any, ...]]:
    """A lazy source's chunk expanded: its entries sized (an error in place of a size, raised
    if the sample is packed: ``ShardPlan.take``), and the chunks found in it. Any process."""
    parts: list[Sized | tuple[Any, ...]] = []
    for part in size.source.expand(chunk):
        if not isinstance(part, list):
            parts.append(part)
            continue
        sizes: list[int | ShardstreamError] = []
        for entry in part:
            try:
                sizes.append(size(entry)[1])
            except ShardstreamError as error:
                sizes.append(error)
        parts.append(Sized(part, sizes))
    return parts


# JSON Lines and Parquet values nest lists and objects; encoding, sizing and pickling
# them recurse once per level, so a few hundred levels end in a RecursionError.
_TOO_DEEP = "a value is nested too deeply to pack (lists or objects hundreds of levels deep)"


def _too_deep(job: ShardJob, source: Source) -> PackError:
    """The error for a shard that recursed too deeply as a whole, naming its deepest sample."""
    entries = [entry for entry in job.entries if entry.sample is not None]
    if not entries:
        return PackError(_TOO_DEEP, shard=job.name)
    deepest = max(entries, key=lambda entry: _depth(entry.sample))
    return _at_entry(PackError(_TOO_DEEP, shard=job.name), deepest, source)


def _depth(value: Any) -> int:
    """How deeply lists, tuples and dicts nest in ``value`` (iterative: it must not recurse)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        items = (
            value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        )
        if items:
            deepest = max(deepest, depth)
            stack += [(item, depth + 1) for item in items]
    return deepest


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
    (NOTE [ Every process plans and writes ]).
    """
    options = context.options
    source = context.source
    load = source.load if source.lazy else None
    output = ShardOutput(
        context.storage,
        options.fmt,
        job.name,
        compression=options.compression,
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
            except RecursionError:
                raise _at_entry(PackError(_TOO_DEEP), entry, source) from None
            if done % _FEED == 0:
                if feed is not None:
                    feed()
                if progress is not None and done % _TICK == 0:
                    progress.update(done - reported[0], output.num_bytes - reported[1])
                    reported = (done, output.num_bytes)
    except BaseException:
        output.abort()
        raise
    try:
        result = output.finish()  # which may encode the samples (Parquet)
    except RecursionError:
        raise _too_deep(job, source) from None
    if progress is not None:
        progress.update(result.info.samples - reported[0], result.info.bytes - reported[1])
    return result


_WORKER: dict[str, Any] = {}


def _init_worker(context: JobContext, parent: int) -> None:
    die_with_parent(parent)  # NOTE [ Workers die with their pack ] in ``lifeline``
    gc.disable()  # NOTE [ Garbage collection during a pack ]
    _WORKER["context"] = context
    _WORKER["size"] = EntrySizer(context.source, context.options)


def _work(job: ShardJob) -> ShardResult:
    try:
        return write_job(job, _WORKER["context"], on_stored=_synced_by_parent)
    finally:
        gc.collect(1)


@contextmanager
def _collect_per_shard() -> Iterator[None]:
    """No automatic garbage collection in this process while the block runs (see the NOTE)."""
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
    return [Sized(_pack_entries(p.entries), p.sizes) if isinstance(p, Sized) else p for p in parts]


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
    plan: ShardPlan,
    context: JobContext,
    workers: int,
    sync: ShardSync,
    progress: Progress | None = None,
) -> list[ShardResult]:
    """Write every shard of ``plan``; results in shard order. One worker: all in this process.

    Local shards are fsynced by ``sync`` as they are done (NOTE [ Durable before the manifest ]).
    ``workers`` is capped at what can be used (``lifeline.cap_workers``), with a logged note.
    """
    workers = cap_workers(workers, None if plan.stop is None else plan.stop - plan.start)
    with _collect_per_shard():
        return _run_jobs(plan, context, workers, sync, progress)


def _run_jobs(
    plan: ShardPlan, context: JobContext, workers: int, sync: ShardSync, progress: Progress | None
) -> list[ShardResult]:
    lazy = context.source.lazy
    if workers <= 1 and not lazy:
        results = []
        for job in plan.scan():
            results.append(write_job(job, context, progress, on_stored=sync.add))
            gc.collect(1)
        return results
    # The workers start (fork) while the first shard is planned, not after it: a
    # planned shard waiting for a worker is a core idle.
    pool = _Pool(context, workers - 1 if lazy else workers, sync, progress)
    try:
        if lazy:
            pool.share(plan)
        else:
            pool.hand_out(plan.scan())
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
        self, context: JobContext, children: int, sync: ShardSync, progress: Progress | None
    ) -> None:
        self.context = context
        self.children = children
        self.sync = sync
        self.progress = progress
        self.done: dict[int, ShardResult] = {}
        self.writing: dict[Future[ShardResult], int] = {}  # shard number, by future
        self.sizing: dict[Future[Any], _Chunk] = {}
        self.ready: deque[ShardJob] = deque()  # planned shards no process has taken yet
        self.chunks: list[_Chunk] = []  # the walk from the next sample to cut on, in order
        self.walk: Iterator[Any] = iter(())
        self.walked = False  # every chunk taken from the source (or the slice is full)
        self.cut_all = False  # and every shard planned
        self.plan: ShardPlan | None = None
        self.size = EntrySizer(context.source, context.options)
        self.pool: ProcessPoolExecutor | None = None
        if children:
            self.pool = ProcessPoolExecutor(
                children, mp_context=_mp_context(), initializer=_init_worker, initargs=(context, os.getpid())
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
        only when this busy thread lets them have the GIL (a worker got it ~20 ms later)."""
        assert self.pool is not None
        try:
            blob = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        except RecursionError:
            raise _too_deep(job, self.context.source) from None
        return self.pool.submit(_work_pickled, blob)

    def hand_out(self, jobs: Iterator[ShardJob]) -> None:
        """Worker processes write every shard; this one only plans (an inline source reads here)."""
        assert self.pool is not None
        for job in jobs:
            # Bounded: at most two shards per worker planned ahead of the writers.
            while len(self.writing) >= 2 * self.children:
                self.collect(block=True)
            self.writing[self.submit(job)] = job.number
            self.collect()
        while self.writing:
            self.collect(block=True)

    def share(self, plan: ShardPlan) -> None:
        """Every process sizes chunks and writes shards (NOTE [ Every process plans and writes ])."""
        self.plan = plan
        self.walk = plan.source.chunks()
        while True:
            self.feed()
            if self.ready:  # the largest planned shard (the last one is often a small one)
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
        """Cut the entries sized so far, in walk order, into planned shards."""
        plan = self.plan
        assert plan is not None
        chunks = self.chunks
        taken = 0
        while taken < len(chunks) and (sized := chunks[taken].sized) is not None:
            taken += 1
            if isinstance(sized, BaseException):
                raise sized
            self.ready += plan.take(sized.entries, sized.sizes)
            if plan.full:
                self.walked = True
                taken = len(chunks)
        del chunks[:taken]
        if not chunks and self.walked and not self.cut_all:
            self.ready += plan.finish()
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
