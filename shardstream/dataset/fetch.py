"""The bytes of a window's ranged reads: in parallel from object storage, read from disk.

# NOTE [ Getting the bytes ]
# Object storage: one GET stream is bounded by latency x window, so a worker keeps
# ``read_concurrency`` requests in flight (``READ_THREADS`` by default): a window's reads
# run at once, a long one (a run of large samples, a whole shard) as one GET into one
# buffer, cut into parts where its connection proves slow (NOTE [ Reads in parts ] in
# storage/parts.py), and the next windows are fetched while this one is decoded, as far as
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

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from types import MappingProxyType
from typing import Any

from shardstream.errors import StorageError
from shardstream.manifest import Manifest
from shardstream.storage import Expected, ReadPool, Storage
from shardstream.storage.parts import arrived, split
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
        self.local = storage.local_files
        # Ranges are mapped, not copied, from the cache, and from a local folder where
        # the user says so or its mount is read-only; see the NOTE above.
        folder = storage.local_files and not storage.cached
        self.mapped = storage.cached or (
            folder and (local_reads == "map" or (local_reads == "auto" and storage.read_only_mount))
        )
        if expected is None:  # what ``expectations(manifest)`` gives; a dataset passes its own
            expected = expectations(manifest) if manifest is not None else {}
        self._expected: Mapping[str, Expected] = expected
        # a shard's CRC-32 (its sidecar's, once loaded: ``know_checks``), what its cache
        # fill is checked against where it is known in time (NOTE [ Filling the cache ])
        self._crcs: dict[str, Callable[[], int]] = {}
        # The reads of a window run at once in one pool, long ones too (a cached dataset's
        # fill their entries on first use), and the parts a long read is cut into in
        # another (NOTE [ Reads in parts ], [ Filling the cache ]): a pool's thread never
        # waits for its own pool.
        remote = storage.cached or not storage.local_files
        self._pool = ReadPool(threads) if threads > 1 and remote else None
        self._part_pool = ReadPool(threads) if threads > 1 and remote else None

    def read_all(
        self, items: Sequence[Item], on_error: Callable[[StorageError, Item], Exception]
    ) -> list[bytes | memoryview]:
        """The bytes of every item, in order; a ``StorageError`` is passed through
        ``on_error`` (which names the shard and samples) and raised. The reads run in
        the pool's threads at once; a long one may be cut into parts that do too."""
        return self.start(items, on_error).result()

    def start(self, items: Sequence[Item], on_error: Callable[[StorageError, Item], Exception]) -> Reads:
        """``read_all`` begun: the reads are in the pool's threads (where there is a pool)
        when this returns, and ``result()`` waits for their bytes."""

        def one(item: Item) -> bytes | memoryview:
            try:
                return self.read(*item)
            except StorageError as error:
                raise on_error(error, item) from error

        pool = self._pool
        if pool is None or not items:
            return Reads(lambda: [one(item) for item in items], [])
        futures = [pool.submit(one, item) for item in items]
        return Reads(lambda: [future.result() for future in futures], futures)

    def _is_long(self, path: str, rng: ByteRange | None) -> bool:
        """Whether a read may be cut into parts (NOTE [ Reads in parts ])."""
        if rng is None:
            expect = self._expected.get(path)
            rng = ByteRange(0, expect.size) if expect is not None and expect.size is not None else None
        return rng is not None and not self.storage.cached and len(split(rng)) > 1

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

    def read(self, path: str, rng: ByteRange | None) -> bytes | memoryview:
        expect = self._expected.get(path)
        if self.storage.cached and expect is not None and expect.sha256:
            expect = dataclasses.replace(expect, crc32=functools.partial(self._crc_of, path))
        if rng is None and self.storage.cached and expect is not None and expect.size:
            # a whole object (NOTE [ Whole shards at once ]): its cache entry, filled in
            # parts where the connection is slow (NOTE [ Filling the cache ]), as a range's
            rng = ByteRange(0, expect.size)
        if rng is not None and rng.length and self.storage.cached:
            # the cache entry, checked against expect
            return self.storage.map(path, rng, expect=expect, pool=self._part_pool)
        if rng is not None and rng.length and self.mapped:  # a local folder's, checked against expect
            return self.storage.map(path, rng, expect=expect)
        if self._part_pool is not None and self._is_long(path, rng):
            return self.storage.read_parts(path, rng, expect=expect, pool=self._part_pool)  # tells as it goes
        data = self.storage.read(path, rng, expect=expect)
        arrived(len(data))  # NOTE [ Read budget ]
        return data

    def close(self) -> None:
        for pool in (self._pool, self._part_pool):
            if pool is not None:
                pool.close()
