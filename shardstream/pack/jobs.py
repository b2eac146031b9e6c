"""Shard jobs: what a pack cuts a source into, and what a process does with one.

The parent process cuts the samples of a source into shards (``ShardJobs``, NOTE
[ Deterministic parallel pack ] in ``parallel``); each shard becomes a ``ShardJob``.
Any process of the pool, this one included, runs the two kinds of task: ``write_job``
writes one shard, ``size_chunk`` sizes one chunk of a lazy source (NOTE [ Every process
sizes and writes ] in ``parallel``). Nothing here starts or talks to a process.
"""

from __future__ import annotations

import dataclasses
import pickle
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from shardstream.errors import PackError, ShardstreamError
from shardstream.manifest import ShardInfo
from shardstream.pack.cutter import SampleTooLarge, ShardCutter
from shardstream.pack.options import PackOptions
from shardstream.pack.shard import ShardOutput, ShardResult
from shardstream.pack.sizing import sample_sizer
from shardstream.pack.sources.base import Entry, Source, tar_ready
from shardstream.pack.tokenize import DocumentWriter
from shardstream.pack.writer import oversize_error
from shardstream.storage import Storage


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
        parts = [part if isinstance(part, Packed) else pack_entries(part) for part in self.parts]
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


def pack_entries(entries: list[Entry]) -> Any:
    """``entries`` as columns (keys, samples, ...), not one Entry object each.

    Pickling a shard's entries this way takes far less time than one object each.
    Entries that only say where a sample is (lazy sources) are also compressed, which
    costs far less than it saves: the bytes go through a pipe 64 KiB at a time, each write
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


class ShardJobs:
    """The shard jobs of a pack: its samples, in order and sized, cut by ``ShardCutter``.

    Takes the samples ``[start, stop)`` of the source, in order and sized, and gives the
    job of each shard they complete (``make_job(number, parts)`` names it; the parts are
    lists of entries, or ``Packed`` ones as a worker sent them). Where a shard ends is
    the cutter's alone (NOTE [ Shard boundaries ] in ``cutter``), as in ``ShardWriter``.
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
        self.cutter = ShardCutter(self.budget, self.max_samples)
        self.seen = 0  # samples of the source taken so far, in or before the slice
        self.shards = 0
        self.parts: list[list[Entry] | Packed] = []  # of the shard being cut

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
        try:
            begins = self.cutter.cut(sizes, lo, hi)  # raises an error found while sizing (it names the file)
        except SampleTooLarge as error:
            i = lo if error.position is None else error.position
            entry = entries[i : i + 1]
            one = entry.unpack()[0] if isinstance(entry, Packed) else entry[0]
            oversize = oversize_error(one.key, error.size, self.options, error.budget)
            raise _at_entry(oversize, one, self.source) from None
        jobs = []
        run = lo  # the first sample not in self.parts yet
        for i in begins:
            self._add(entries[run:i])
            if self.parts:  # the first sample of all begins a shard, but ends none
                jobs.append(self._job())
            run = i
        self._add(entries[run:hi])
        return jobs

    def finish(self) -> list[ShardJob]:
        """The job of the last shard, once every sample has been taken."""
        return [self._job()] if self.parts else []

    def _add(self, part: list[Entry] | Packed) -> None:
        parts = self.parts
        if not len(part):
            return
        if isinstance(part, list) and parts and isinstance(parts[-1], list):
            parts[-1] += part  # one list of the entries sized here
        else:
            parts.append(part)

    def _job(self) -> ShardJob:
        parts, self.parts = tuple(self.parts), []
        self.shards += 1
        return self.make_job(self.shards - 1, parts)


ShardPlan = ShardJobs  # its earlier name (a plan is the epoch's); kept importable


class Sized(NamedTuple):
    """Entries of a lazy source, and their sizes (or the errors sizing them gave)."""

    entries: Any  # list[Entry]; from a worker, the bytes of ``pack_entries`` (then ``Packed``)
    sizes: list[int | ShardstreamError]


def size_chunk(chunk: tuple[Any, ...], size: EntrySizer) -> list[Sized | tuple[Any, ...]]:
    """A lazy source's chunk expanded: its entries sized (an error in place of a size, raised
    if the sample is packed: ``ShardCutter.cut``), and the chunks found in it. Any process."""
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


def too_deep(job: ShardJob, source: Source) -> PackError:
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
    """``error`` as a PackError naming the entry's file (the file of the field it names, or
    the sample's first file) and line."""
    message = error.message if entry.key in error.message else f"sample {entry.key!r}: {error.message}"
    return PackError(
        message,
        url=error.url or source.entry_url(entry, getattr(error, "field", None)),
        shard=error.shard,
        offset=error.offset,
        line=entry.line,
    )


class PackProgress(Protocol):
    """What a pack reports progress to (``shardstream.progress.ProgressBar`` is one): the
    samples to pack when known, then samples and bytes as each shard is written. An
    object that also has ``reused(shards, of)`` is told, before the manifest is written,
    how many of the pack's shards a rerun kept from the run before."""

    def set_total(self, samples: int | None) -> None: ...

    def update(self, samples: int, nbytes: int) -> None: ...


Progress = PackProgress  # its earlier name here; kept importable


_TICK = 1024  # samples between progress updates while a shard is written in this process
_FEED = 64  # samples between looks for a free worker while this process writes a shard


def write_job(
    job: ShardJob,
    context: JobContext,
    progress: PackProgress | None = None,
    on_stored: Callable[[str], None] | None = None,
    feed: Callable[[], None] | None = None,
) -> ShardResult:
    """Write one shard, loading its entries (in a worker, or in the parent).

    ``on_stored`` is as in ``ShardOutput``; ``feed`` is called every few dozen samples
    (NOTE [ Every process sizes and writes ] in ``parallel``).
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
    documents = None
    if options.tokenizing is not None:  # NOTE [ Tokenizing in the pack's workers ] in ``tokenize``
        documents = DocumentWriter(output.write, options.tokenizing, options.fmt)
    write = output.write if documents is None else documents.add
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
        if documents is not None:
            documents.flush()
    except BaseException:
        output.abort()
        raise
    try:
        result = output.finish()  # which may encode the samples (Parquet)
    except RecursionError:
        raise too_deep(job, source) from None
    if documents is not None and result.info.tokens is None:  # a format that does not count them
        result = dataclasses.replace(result, info=dataclasses.replace(result.info, tokens=documents.tokens))
    if progress is not None:
        progress.update(result.info.samples - reported[0], result.info.bytes - reported[1])
    return result
