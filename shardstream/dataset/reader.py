"""Reading the windows of an epoch plan: ranged reads, coalesced, prefetched.

A window is a few runs of consecutive samples (``Run(shard, start, stop)``). For each run
the reader asks the shard's sample index for the byte range of exactly those samples and
reads it with one ranged read; neighbouring runs of one shard become one read. The sample
indexes (sidecars) are loaded when first needed and kept in a small LRU. While the
dataset yields one window, the next one is fetched in a background thread, so a worker
holds at most its current window and what it prefetches, whatever the dataset's size.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardstream.errors import FormatError, StorageError
from shardstream.formats import get_format
from shardstream.formats.base import Sample, SampleIndex
from shardstream.manifest import Manifest
from shardstream.storage import Prefetcher, Storage
from shardstream.types import ByteRange

__all__ = ["COALESCE_GAP", "INDEX_CACHE_SIZE", "Read", "WindowReader", "plan_reads", "report_skip"]

_log = logging.getLogger("shardstream.dataset")
INDEX_CACHE_SIZE = 16  # sidecars kept per worker; a worker reads a few shards at a time
# Runs of one shard closer than this share a read: a request costs more than this many
# bytes on object storage (latency x bandwidth), and the read stays within the window.
COALESCE_GAP = 256 * 1024


@dataclass(frozen=True, slots=True)
class Read:
    """One ranged read of a shard, serving the runs numbered ``runs`` of a window."""

    shard: int
    rng: ByteRange
    runs: tuple[int, ...]


def plan_reads(
    runs: Sequence[Any], byte_range: Callable[[int, int, int], ByteRange], *, gap: int
) -> list[Read]:
    """The ranged reads for a window's runs: runs of one shard whose bytes overlap, touch
    or lie at most ``gap`` bytes apart share one read (Parquet runs in one row group
    overlap; the rest of a resumed window has holes). Reads come in window order."""
    by_shard: dict[int, list[tuple[ByteRange, int]]] = {}
    for number, run in enumerate(runs):
        if run.stop > run.start:
            by_shard.setdefault(run.shard, []).append((byte_range(run.shard, run.start, run.stop), number))
    reads: list[Read] = []
    for shard, spans in by_shard.items():
        spans.sort(key=lambda span: span[0].start)
        lo, hi, members = spans[0][0].start, spans[0][0].end, [spans[0][1]]
        for rng, number in spans[1:]:
            if rng.start - hi <= gap:
                hi = max(hi, rng.end)
                members.append(number)
                continue
            reads.append(Read(shard, ByteRange(lo, hi), tuple(members)))
            lo, hi, members = rng.start, rng.end, [number]
        reads.append(Read(shard, ByteRange(lo, hi), tuple(members)))
    reads.sort(key=lambda read: min(read.runs))
    return reads


class WindowReader:
    """Fetches the samples of plan windows from one dataset, for one worker.

    With ``on_error="skip"``, samples a shard format cannot decode come back as ``None``
    (the caller counts and skips them); with ``"raise"`` the ``FormatError`` propagates.
    """

    def __init__(
        self, storage: Storage, manifest: Manifest, *, on_error: str = "raise", prefetch: int = 1
    ) -> None:
        self.storage = storage
        self.manifest = manifest
        self.format = get_format(manifest.format)
        self.on_error = on_error
        self.prefetch = prefetch
        self._indexes: collections.OrderedDict[int, SampleIndex] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._prefetcher: Prefetcher[Any, list[Sample | None]] | None = None

    # -- indexes -------------------------------------------------------------------------

    def index(self, shard: int) -> SampleIndex:
        """The sample index of ``shard`` (by position in the manifest), from the LRU."""
        with self._lock:
            found = self._indexes.get(shard)
            if found is not None:
                self._indexes.move_to_end(shard)
                return found
        info = self.manifest.shards[shard]
        index = self.format.load_index(self.storage.read(info.index), name=info.path)
        if index.num_samples != info.samples:
            raise FormatError(
                f"sample index has {index.num_samples} samples, the manifest says {info.samples}",
                url=self.storage.full_url(info.index),
                shard=info.path,
            )
        with self._lock:
            self._indexes[shard] = index
            while len(self._indexes) > INDEX_CACHE_SIZE:
                self._indexes.popitem(last=False)
        return index

    # -- one window ----------------------------------------------------------------------

    def fetch(self, window: Any) -> list[Sample | None]:
        """The samples of ``window``'s runs, concatenated in run order (not yet shuffled)."""
        runs = window.runs
        reads = plan_reads(runs, self._byte_range, gap=COALESCE_GAP)
        if len(reads) == 1 and len(reads[0].runs) == 1:  # the usual unshuffled case
            return self._read(reads[0], runs)[0]
        parts: dict[int, list[Sample | None]] = {}
        for read in reads:
            parts.update(zip(read.runs, self._read(read, runs), strict=True))
        return [sample for number in sorted(parts) for sample in parts[number]]

    def _byte_range(self, shard: int, start: int, stop: int) -> ByteRange:
        return self.index(shard).byte_range(start, stop)

    def _read(self, read: Read, runs: Sequence[Any]) -> list[list[Sample | None]]:
        """One ranged read, decoded into the samples of each run it serves."""
        info = self.manifest.shards[read.shard]
        index, rng = self.index(read.shard), read.rng
        try:
            data = self.storage.read(info.path, rng)
        except StorageError as error:
            first, last = runs[read.runs[0]], runs[read.runs[-1]]
            raise type(error)(
                f"{error.message} (samples [{first.start}, {last.stop}), bytes [{rng.start}, {rng.end}))",
                url=error.url or self.storage.full_url(info.path),
                shard=info.path,
                offset=rng.start,
            ) from error
        return [self._decode(data, rng, index, runs[n].start, runs[n].stop, info.path) for n in read.runs]

    def _decode(
        self, data: bytes, rng: ByteRange, index: SampleIndex, start: int, stop: int, name: str
    ) -> list[Sample | None]:
        try:
            samples: list[Sample | None] = list(self.format.decode(data, rng, index, start, stop, name=name))
        except FormatError as error:
            if self.on_error != "skip":
                raise self._named(error, name, rng) from error
            return self._read_one_by_one(data, rng, index, start, stop, name)
        if len(samples) != stop - start:
            wrong = FormatError(f"decoded {len(samples)} samples, expected {stop - start}", offset=rng.start)
            raise self._named(wrong, name, rng)
        return samples

    def _read_one_by_one(
        self, data: bytes, rng: ByteRange, index: SampleIndex, start: int, stop: int, name: str
    ) -> list[Sample | None]:
        """``on_error="skip"``: decode sample by sample, ``None`` for each that fails."""
        view = memoryview(data)
        out: list[Sample | None] = []
        for i in range(start, stop):
            one = index.byte_range(i, i + 1)
            try:
                part = view[one.start - rng.start : one.end - rng.start]
                out.extend(self.format.decode(part, one, index, i, i + 1, name=name))
            except FormatError as error:
                out.append(None)
                report_skip(self._named(error, name, one))
        return out

    def _named(self, error: FormatError, shard: str, rng: ByteRange) -> FormatError:
        return FormatError(
            error.message,
            url=error.url or self.storage.full_url(shard),
            shard=error.shard or shard,
            offset=error.offset if error.offset is not None else rng.start,
        )

    def locate(self, error: FormatError, window: Any, position: int) -> FormatError:
        """``error`` about the sample at ``position`` of ``window``'s concatenated runs,
        naming its URL, shard, byte offset and key."""
        for run in window.runs:
            shard, start, stop = run.shard, run.start, run.stop
            if position < stop - start:
                info = self.manifest.shards[shard]
                index = self.index(shard)
                i = start + position
                key = index.keys[i]
                message = error.message if key in error.message else f"{error.message} [sample {key!r}]"
                return type(error)(
                    message,
                    url=self.storage.full_url(info.path),
                    shard=info.path,
                    offset=index.byte_range(i, i + 1).start,
                )
            position -= stop - start
        return error

    # -- the stream of windows -----------------------------------------------------------

    def stream(self, windows: Iterator[Any]) -> Iterator[tuple[Any, list[Sample | None]]]:
        """``(window, samples)`` for each window, the next ones fetched in the background."""
        if self.prefetch < 1:
            for window in windows:
                yield window, self.fetch(window)
            return
        prefetcher: Prefetcher[Any, list[Sample | None]] = Prefetcher(
            self.fetch, threads=1, max_pending=self.prefetch
        )
        self._prefetcher = prefetcher
        pending: collections.deque[Any] = collections.deque()
        try:
            for window in windows:
                pending.append(window)
                prefetcher.submit(window)
                if len(pending) > self.prefetch:
                    yield pending.popleft(), prefetcher.next()
            while pending:
                yield pending.popleft(), prefetcher.next()
        finally:
            self.close()

    def close(self) -> None:
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            prefetcher.close()


_SKIPPED: collections.Counter[str] = collections.Counter()  # per shard URL, in this process


def report_skip(error: FormatError) -> None:
    """Count a sample skipped with ``on_error="skip"``; log the first of each shard."""
    shard = error.url or error.shard or ""
    _SKIPPED[shard] += 1
    if _SKIPPED[shard] == 1:
        _log.warning("skipping corrupt samples (on_error='skip'); the first in this shard: %s", error)
