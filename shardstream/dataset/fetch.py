"""The bytes of a window's ranged reads: in parallel from object storage, read from disk.

# NOTE [ Getting the bytes ]
# Object storage: one GET stream is bounded by latency x window, so a worker keeps
# ``read_concurrency`` requests in flight (``READ_THREADS`` by default): a window's reads
# run at once, a long one (a run of large samples, a whole shard) as one GET into one
# buffer, cut into parts where its connection proves slow (NOTE [ Reads in parts ] in
# storage/cuts.py), and the next windows are fetched while this one is decoded, as far as
# NOTE [ Read budget ] allows. With ``cache_dir`` a shard's first read fills its cache
# entry the same way (NOTE [ Filling the cache ] in storage/cached.py), later ones map it.
# Local files are read with ``pread`` into one buffer per range, in the prefetch thread
# (the GIL is released while the kernel copies). Cache entries are memory-mapped instead,
# their fields copied once from the page cache, faster for small samples. Local files are
# not mapped by default: a mapping outlives any size check (the next window is mapped
# while this one is decoded), so a shard truncated in place meanwhile (``cp`` over it,
# ``truncate``) kills the process with SIGBUS on first touch, which no Python code can
# catch; a read sees the file's size when it runs, so a truncated shard is a
# ``StorageError`` naming it. A cache entry is never truncated (the cache only renames a
# complete file into place or unlinks one), and neither is a file on a read-only mount.
# The user may choose the mapping (``local_reads="map"``) for a dataset that nothing
# rewrites in place while it is read (a pack renames finished files into place and ``rm``
# unlinks; ``cp`` over a shard, ``rsync --inplace`` or ``truncate`` do not).
# tools/bench_stream.py --only small measures both (docs/benchmarks.md, claim local-small).
# Every read also carries what the manifest says of its object (``Expected``: size and
# sha256 of shards; size and the shard's sha256 for sidecars), so a changed object fails
# clearly and the cache keys entries by content (NOTE [ Reads check the manifest ] in
# storage/expect.py).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from types import MappingProxyType
from typing import Any

from shardstream.errors import StorageError
from shardstream.manifest import Manifest
from shardstream.storage import Expected, ReadPool, Storage
from shardstream.storage.parts import Tell
from shardstream.storage.ranged import RangedReads, SingleReads
from shardstream.types import ByteRange

__all__ = ["READ_THREADS", "ByteFetcher", "Reads", "expectations"]

READ_THREADS = 16  # requests in flight per DataLoader worker, on object storage

Item = tuple[str, "ByteRange | None"]  # (path, byte range or None for the whole file)


def expectations(manifest: Manifest) -> Mapping[str, Expected]:
    """What ``manifest`` says of each object it names: shards, then sidecars (by path), as
    a read-only mapping. O(shards): a dataset makes it once per process and hands it to
    each reader (every iteration makes a new one)."""
    return MappingProxyType(_expectations(manifest))


def _expectations(manifest: Manifest) -> dict[str, Expected]:
    expected: dict[str, Expected] = {}
    for info in manifest.shards:
        expected.setdefault(info.path, Expected(info.bytes, info.sha256))
    for info in manifest.shards:
        if info.index and info.index != info.path:  # a footer index is read as its shard
            size = info.index_bytes or None  # 0: a manifest from before sidecars were sized
            expected.setdefault(info.index, Expected(size, version=f"{info.sha256}|{info.index}"))
    return expected


class Reads:
    """Reads begun by ``ByteFetcher.start``: ``result()`` their bytes in order, or
    ``cancel()`` them (those running are waited for)."""

    def __init__(self, collect: Callable[[], list[bytes | memoryview]], futures: list[Future[Any]]) -> None:
        self._collect, self._futures = collect, futures

    def result(self) -> list[bytes | memoryview]:
        try:
            return self._collect()
        finally:
            for future in self._futures:
                future.cancel()

    def cancel(self) -> None:
        for future in self._futures:
            future.cancel()
        wait(self._futures)


class ByteFetcher:
    """Reads ``(path, range)`` items of one dataset; see NOTE [ Getting the bytes ].

    With ``manifest``, every read of an object it names is checked against it.
    """

    def __init__(
        self,
        storage: Storage,
        manifest: Manifest | None = None,
        *,
        threads: int = READ_THREADS,
        local_reads: str = "auto",
        expected: Mapping[str, Expected] | None = None,
    ) -> None:
        self.storage = storage
        self.threads = threads
        # how bytes are read (mapped, in parts, through the cache or plainly): the storage's choice
        self.reads = RangedReads(storage, threads=threads, local_reads=local_reads)
        if expected is None:  # what ``expectations(manifest)`` gives; a dataset passes its own
            expected = expectations(manifest) if manifest is not None else {}
        self._expected: Mapping[str, Expected] = expected
        # a shard's CRC-32 (its sidecar's, once loaded: ``know_checks``), what its cache
        # fill is checked against where it is known in time (NOTE [ Filling the cache ])
        self._crcs: dict[str, Callable[[], int]] = {}
        self._tell: Tell = None  # whom reads tell of their bytes: ``telling``

    @property
    def local(self) -> bool:
        """Whether reads come from local files (a read costs no request)."""
        return self.reads.local

    @property
    def mapped(self) -> bool:
        """Whether ranges are mapped, not copied (cache entries; local files where chosen)."""
        return self.reads.mapped

    @property
    def ahead(self) -> bool:
        """Whether reads go over a wire in parallel, so windows are fetched ahead (NOTE [ Read budget ])."""
        return self.reads.pool is not None

    @property
    def _pool(self) -> ReadPool | None:  # the name tests look the pool up by
        return self.reads.pool

    def read_all(
        self, items: Sequence[Item], on_error: Callable[[StorageError, Item], Exception], tell: Tell = None
    ) -> list[bytes | memoryview]:
        """The bytes of every item, in order; a ``StorageError`` is passed through
        ``on_error`` (which names the shard and samples) and raised. The reads run in
        the pool's threads at once; a long one may be cut into parts that do too.
        ``tell(bytes)`` as they arrive (NOTE [ Read budget ])."""
        return self.start(items, on_error, tell).result()

    def start(
        self, items: Sequence[Item], on_error: Callable[[StorageError, Item], Exception], tell: Tell = None
    ) -> Reads:
        """``read_all`` begun: the reads are in the pool's threads (where there is a pool)
        when this returns, and ``result()`` waits for their bytes."""

        fetcher = self.telling(tell)

        def one(item: Item) -> bytes | memoryview:
            try:
                return fetcher.read(*item)
            except StorageError as error:
                raise on_error(error, item) from error

        pool = self.reads.pool
        if pool is None or not items:
            return Reads(lambda: [one(item) for item in items], [])
        futures = [pool.submit(one, item) for item in items]
        return Reads(lambda: [future.result() for future in futures], futures)

    def know_checks(self, path: str, whole_crc: Callable[[], int]) -> None:
        """``path``'s CRC-32 (computed when a fill asks), from its sidecar's checks."""
        if path not in self._crcs:
            self._crcs[path] = functools.cache(whole_crc)

    def _crc_of(self, path: str) -> int | None:
        known = self._crcs.get(path)
        return known() if known is not None else None

    def drop_cached(self, path: str) -> str | None:
        """Delete ``path``'s cache entry, whose bytes failed a check; its file, or None."""
        return self.storage.drop_cached(path, self._expected.get(path))

    def telling(self, tell: Tell) -> ByteFetcher:
        """This fetcher for the reads of one window: they tell ``tell(bytes)`` as their
        bytes arrive (NOTE [ Read budget ]); pools, checks and files are this one's."""
        if tell is None:
            return self
        told = copy.copy(self)
        told._tell = tell
        return told

    def read(self, path: str, rng: ByteRange | None) -> bytes | memoryview:
        """The bytes of ``rng`` of ``path`` (None: all of it), checked against the manifest."""
        return self.reads.read(path, rng, self._expect(path), self._tell)

    def _expect(self, path: str) -> Expected | None:
        expect = self._expected.get(path)
        if self.storage.cached and expect is not None and expect.sha256:
            expect = dataclasses.replace(expect, crc32=functools.partial(self._crc_of, path))
        return expect

    def single_reads(self, open_files: int) -> SingleReads:
        """Reads of single samples, from up to ``open_files`` local files kept open where
        local files are read by copy (``RangedReads.single_reads``)."""
        return self.reads.single_reads(self.read, open_files)

    def expected(self, path: str) -> Expected | None:
        """What the manifest says of ``path``."""
        return self._expected.get(path)

    def close(self) -> None:
        self.reads.close()
