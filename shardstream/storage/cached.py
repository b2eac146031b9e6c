"""A Storage's reads through its shard cache (NOTE [ Shard cache ] in cache.py).

# NOTE [ Filling the cache ]
# An entry is filled the first time any byte of its shard is read: the whole object is
# fetched as a long read (NOTE [ Reads in parts ] in cuts.py: one GET, cut into parts in
# flight where the connection is slow) and written to the entry's temp file as its bytes
# arrive, each piece (``CHUNK`` bytes, parts too) at its offset with ``pwrite``; the same
# bytes are summed in order on their way (a piece that arrives before those ahead of it
# waits in memory for them), so the file is never read back to check it. A piece's
# buffer takes the next piece once it is written and summed: a part read into new memory
# of its own length costs a page fault per 4 KiB, CPU a cold cached epoch cannot spare.
# Then the entry is checked and renamed into place. The check: where the reader gives the
# shard's CRC-32 (its sidecar's block CRCs joined, ``Expected.crc32``: NOTE [ One CRC per
# read ]; the sidecar itself was checked against the manifest's size and sha256), a
# running CRC-32 of the bytes, several times cheaper than the manifest's sha256, which is
# the check otherwise. A sidecar still on its way when the last byte is in (it is read
# beside the shard, NOTE [ Whole shards at once ]) leaves the sha256, of the file read
# back. Nothing is held in memory but parts in flight or waiting, so a cold epoch with
# ``cache_dir`` moves the bytes at the speed of a streamed one and the warm epoch maps the
# local files. Without a pool (``Storage.open``, a plain ``Storage.read``) the GET is never
# cut. tools/bench_wan.py measures cached against uncached epochs (docs/benchmarks.md,
# claim wan-targets).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from shardstream.crc import crc32
from shardstream.errors import StorageError
from shardstream.storage import local
from shardstream.storage.cache import ShardCache
from shardstream.storage.cuts import CHUNK
from shardstream.storage.expect import Expected, changed_error
from shardstream.storage.parts import Tell, read_long
from shardstream.storage.read_pool import ReadPool
from shardstream.storage.retried import RetriedIO
from shardstream.storage.sinks import Sink
from shardstream.types import ByteRange

__all__ = ["Located", "cache_key", "cached_path", "read_cached", "with_entry"]

T = TypeVar("T")


# NOTE [ Entries that vanish ]
# Processes that share a cache directory evict each other's entries (LRU, under one
# ``cache_limit``), so an entry may be gone between ``fetch`` returning its path and the
# reader opening it: with a limit smaller than one shard, the entry a process has just
# filled is the oldest for every other process. So every use of an entry (a read, a
# mapping, an open stream) goes through ``with_entry``: an entry that vanished is fetched
# again, a few times, and then the bytes are read from storage directly, uncached. Once
# open (or mapped), an entry stays readable whatever happens to its name: eviction only
# unlinks. Nothing else in the cache is needed to read: a lock file evicted with its
# entry only lets two processes fill the same entry at once, and the second rename wins.
_ENTRY_TRIES = 3


def with_entry(
    io: RetriedIO,
    cache: ShardCache,
    path: str,
    expect: Expected | None,
    pool: ReadPool | None,
    use: Callable[[str], T],
    uncached: Callable[[], T],
    tell: Tell = None,
) -> T:
    """``use(entry)`` of ``path``'s cache entry (filled first if need be, telling ``tell``
    of the bytes as they arrive), or ``uncached()`` where the entry keeps vanishing (NOTE
    [ Entries that vanish ])."""
    for _ in range(_ENTRY_TRIES):
        entry = cached_path(io, cache, path, expect, pool, tell)
        try:
            return use(entry)
        except FileNotFoundError:
            continue
    return uncached()


def read_cached(
    io: RetriedIO, cache: ShardCache, path: str, rng: ByteRange | None, expect: Expected | None
) -> bytes:
    """``Storage.read`` through the cache."""
    data = with_entry(
        io,
        cache,
        path,
        expect,
        None,
        lambda entry: local.read(entry, rng),
        lambda: io.read(path, rng, expect),
    )
    if rng is not None and len(data) != rng.length:
        io.short_read(path, rng, len(data))
    return data


class Located(Protocol):
    """What names an object for the cache: a ``Storage`` or its ``RetriedIO``."""

    @property
    def endpoint_url(self) -> str: ...

    def full_url(self, path: str) -> str: ...


def cache_key(where: Located, path: str) -> str:
    """The object's name in the cache; its entries are also keyed by content where the
    manifest names it (NOTE [ Reads check the manifest ] in expect.py)."""
    return f"{where.endpoint_url}|{where.full_url(path)}"


def cached_path(
    io: RetriedIO,
    cache: ShardCache,
    path: str,
    expect: Expected | None = None,
    pool: ReadPool | None = None,
    tell: Tell = None,
) -> str:
    """The local path of a complete cache entry of ``path``, filled first if need be."""
    known = expect.size if expect is not None else None
    return cache.fetch(
        cache_key(io, path),
        (lambda: known) if known is not None else (lambda: io.size(path)),
        lambda tmp, n: _fill(io, cache, path, tmp, n, expect, pool, tell),
        url=io.full_url(path),
        content=expect.content_key if expect is not None else "",
    )


def _fill(
    io: RetriedIO,
    cache: ShardCache,
    path: str,
    tmp: str,
    size: int,
    expect: Expected | None,
    pool: ReadPool | None,
    tell: Tell,
) -> None:
    """Write the object's ``size`` bytes to ``tmp`` as they arrive, summed on the way
    (NOTE [ Filling the cache ]), and check the sum against the sidecar's or the manifest's."""
    url = io.full_url(path)
    try:  # reads raise ShardstreamErrors only: an OSError is the cache's disk
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as error:
        raise cache.disk_error(error, url) from error
    crc_of = expect.crc32 if expect is not None else None
    sha256 = expect.sha256.lower() if expect is not None else ""
    summing = _Crc32() if crc_of is not None else hashlib.sha256() if sha256 else None
    sink = _FileSink(fd, summing=summing, disk_error=cache.disk_error, url=url)
    try:
        read_long(io, path, ByteRange(0, size), size, pool, sink, whole_object=True, tell=tell)
    finally:
        os.close(fd)
    if summing is None:
        return
    if isinstance(summing, _Crc32):
        want = crc_of() if crc_of is not None else None
        if want is not None:
            if summing.value != want:
                what = f"its CRC-32 is {summing.value:08x}, its sample index says {want:08x}"
                raise changed_error(url, path, what)
            return
        if not sha256:
            return
        got = _file_sha256(tmp, cache, url)  # the sidecar had not come when the bytes had: read back
    else:
        got = summing.hexdigest()
    if got != sha256:
        raise changed_error(url, path, f"its sha256 is {got}, the manifest says {sha256}")


def _file_sha256(path: str, cache: ShardCache, url: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as error:
        raise cache.disk_error(error, url) from error


class _Crc32:
    """A running CRC-32, fed like a hash."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: memoryview) -> None:
        self.value = crc32(data, self.value)


class _FileSink(Sink):
    """Into the entry's temp file, each piece ``pwrite`` at its offset as it arrives, and
    into ``summing`` (a hash or a running CRC-32, or nothing) in order: a piece that
    arrives before those ahead of it waits (in memory) for them, so the file is never
    read back to sum it. Pieces of ``CHUNK`` bytes (all of them, where the backend
    streams) go into buffers used again once summed: new memory costs a page fault per
    4 KiB on first touch, more than the copy."""

    def __init__(
        self,
        fd: int,
        *,
        summing: _Crc32 | hashlib._Hash | None,
        disk_error: Callable[[OSError, str], StorageError],
        url: str,
    ) -> None:
        self.fd = fd
        self._summing = summing
        self._disk_error, self._url = disk_error, url
        self._next = 0  # bytes summed so far
        self._waiting: dict[int, memoryview] = {}  # pieces written but not yet summed, by offset
        self._free: list[bytearray] = []  # buffers of CHUNK bytes, written and summed
        self._lock = threading.Lock()

    def view(self, rng: ByteRange) -> memoryview:
        if rng.length <= CHUNK:
            try:
                buffer = self._free.pop()  # atomic: no lock, so no wait for a hash in progress
            except IndexError:
                buffer = bytearray(CHUNK)
            return memoryview(buffer)[: rng.length]
        return memoryview(bytearray(rng.length))

    def done(self, rng: ByteRange, view: memoryview) -> None:
        data, offset = view, rng.start
        try:
            while data:  # pwrite may write less than asked
                written = os.pwrite(self.fd, data, offset)
                data, offset = data[written:], offset + written
        except OSError as error:  # a full disk: not the store's fault, never retried
            raise self._disk_error(error, self._url) from error
        with self._lock:
            if self._summing is None:
                self._release(view)
                return
            self._waiting[rng.start] = view
            while (ready := self._waiting.pop(self._next, None)) is not None:
                self._summing.update(ready)
                self._next += len(ready)
                self._release(ready)

    def _release(self, view: memoryview) -> None:
        """``view``'s buffer back for the next piece (once nothing reads it again)."""
        buffer = view.obj
        if isinstance(buffer, bytearray) and len(buffer) == CHUNK:
            self._free.append(buffer)
