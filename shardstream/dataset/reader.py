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
from collections.abc import Iterator
from typing import Any

from shardstream.errors import FormatError, StorageError
from shardstream.formats import get_format
from shardstream.formats.base import Sample, SampleIndex
from shardstream.manifest import Manifest
from shardstream.storage import Prefetcher, Storage
from shardstream.types import ByteRange

__all__ = ["INDEX_CACHE_SIZE", "WindowReader", "coalesce", "report_skip"]

_log = logging.getLogger("shardstream.dataset")
INDEX_CACHE_SIZE = 16  # sidecars kept per worker; a worker reads a few shards at a time


def coalesce(runs: Any) -> list[tuple[int, int, int]]:
    """``(shard, start, stop)`` reads for ``runs``: consecutive runs of one shard that
    touch (``a.stop == b.start``) become one read; the order of samples is kept."""
    reads: list[tuple[int, int, int]] = []
    for run in runs:
        shard, start, stop = int(run.shard), int(run.start), int(run.stop)
        if stop <= start:
            continue
        if reads and reads[-1][0] == shard and reads[-1][2] == start:
            reads[-1] = (shard, reads[-1][1], stop)
        else:
            reads.append((shard, start, stop))
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
        samples: list[Sample | None] = []
        for shard, start, stop in coalesce(window.runs):
            samples.extend(self._read_run(shard, start, stop))
        return samples

    def _read_run(self, shard: int, start: int, stop: int) -> list[Sample | None]:
        info = self.manifest.shards[shard]
        index = self.index(shard)
        rng = index.byte_range(start, stop)
        try:
            data = self.storage.read(info.path, rng)
        except StorageError as error:
            raise type(error)(
                f"{error.message} (samples [{start}, {stop}), bytes [{rng.start}, {rng.end}))",
                url=error.url or self.storage.full_url(info.path),
                shard=info.path,
                offset=rng.start,
            ) from error
        try:
            samples: list[Sample | None] = list(
                self.format.decode(data, rng, index, start, stop, name=info.path)
            )
        except FormatError as error:
            if self.on_error != "skip":
                raise self._named(error, info.path, rng) from error
            return self._read_one_by_one(data, rng, index, start, stop, info.path)
        if len(samples) != stop - start:
            wrong = FormatError(f"decoded {len(samples)} samples, expected {stop - start}", offset=rng.start)
            raise self._named(wrong, info.path, rng)
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
        for shard, start, stop in coalesce(window.runs):
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


_SKIPPED: collections.Counter[str] = collections.Counter()  # per shard, in this process


def report_skip(error: FormatError) -> None:
    """Count a sample skipped with ``on_error="skip"``; log the first of each shard."""
    shard = error.shard or ""
    _SKIPPED[shard] += 1
    if _SKIPPED[shard] == 1:
        _log.warning("skipping corrupt samples (on_error='skip'); the first in this shard: %s", error)
