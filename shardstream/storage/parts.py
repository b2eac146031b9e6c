"""Ranged reads in parts: one long read as several GETs in flight, into one buffer.

# NOTE [ Reads in parts ]
# On object storage one response is bounded by the wire's latency and by what one
# connection carries (tens of MB/s), so a long read (a run of large samples, a whole
# shard) is cut into parts read by several threads at once, each part a ranged read that
# ``Storage`` retries alone (NOTE [ One retry layer ] in retry.py) and reads into its
# slice of one buffer allocated up front (on the botocore path the response body is read
# straight into it; elsewhere one copy): no join of the parts afterwards. A part is at
# least ``PART_MIN`` bytes (through 30 ms of latency and 40 MB/s, 1 MiB spends 30 ms
# waiting and 25 ms arriving: smaller parts pay mostly latency) and at most ``PART_MAX``;
# in between, a read is cut into ``PARTS`` parts, so even a 2 MiB read keeps two GETs in
# flight, and the worker's other requests are the reads of other shards and windows.
# Why not as many parts as threads: some servers copy the whole object for each ranged
# GET (moto: see NOTE [ Whole shards ] in shardstream/dataset/reader.py), and 16 parts
# of a 30 MB shard made loopback reads 0.39x of one plain GET each. The threads are a ``ReadPool``: made on first use by the
# process that uses it, never reused by a fork child (its threads did not fork), so a
# Storage or a dataset made before ``fork`` works after it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from shardstream.errors import UsageError
from shardstream.types import ByteRange

if TYPE_CHECKING:
    from shardstream.storage.core import Storage
    from shardstream.storage.expect import Expected

__all__ = ["PARTS", "PART_MAX", "PART_MIN", "ReadPool", "read_in_parts", "read_parts", "split"]

PART_MIN = 1 * 2**20
PART_MAX = 8 * 2**20
PARTS = 4  # a read is cut into this many parts, within PART_MIN and PART_MAX

T = TypeVar("T")


def split(
    rng: ByteRange, parts: int = PARTS, *, minimum: int = PART_MIN, maximum: int = PART_MAX
) -> list[ByteRange]:
    """``rng`` cut into about ``parts`` consecutive ranges of ``minimum`` to ``maximum``
    bytes (a range shorter than two minimums stays whole)."""
    size = -(-rng.length // max(1, parts))
    size = min(max(size, minimum), maximum)
    if rng.length < 2 * minimum or size >= rng.length:
        return [rng]
    return [ByteRange(start, min(start + size, rng.end)) for start in range(rng.start, rng.end, size)]


class ReadPool:
    """``threads`` threads for reads, made on first use in each process (see NOTE
    [ Reads in parts ]); ``close`` joins them (a pool made by a parent is dropped)."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise UsageError(f"a read pool needs at least 1 thread, not {threads}")
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        return self._executor().submit(fn, *args)

    def _executor(self) -> ThreadPoolExecutor:
        pid = os.getpid()
        pool = self._pool
        if pool is not None and self._pid == pid:
            return pool
        if self._pid != pid:  # a fork child: the parent's lock and threads are not ours
            self._lock = threading.Lock()
            self._pool = None
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="shardstream-read")
                self._pid = pid
            return self._pool

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.shutdown(wait=True, cancel_futures=True)

    def __reduce__(self):  # configuration only, never threads
        return (ReadPool, (self.threads,))


def read_in_parts(
    read_into: Callable[[ByteRange, memoryview], None], rng: ByteRange, pool: ReadPool
) -> memoryview:
    """The bytes of ``rng``, its parts (``split``) read in ``pool``'s threads, each by
    ``read_into(part, its slice of one buffer)`` (which raises unless it fills it)."""
    view = memoryview(bytearray(rng.length))
    parts = split(rng)
    if len(parts) == 1:
        read_into(rng, view)
        return view
    futures = [
        pool.submit(read_into, part, view[part.start - rng.start : part.end - rng.start]) for part in parts
    ]
    wait_all(futures)
    return view


def read_parts(
    storage: Storage, path: str, rng: ByteRange | None, expect: Expected | None, pool: ReadPool
) -> bytes | memoryview:
    """``Storage.read_parts``: ``storage.read`` where the read is short, cached or of
    unknown size, else ``read_in_parts`` with each part one retried read into its slice."""
    size = expect.size if expect is not None else None
    whole = ByteRange(0, size) if rng is None and size is not None else rng
    if storage.cached or whole is None or not whole.length:
        return storage.read(path, rng, expect=expect)
    fspath = storage._fspath(path)

    def into(part: ByteRange, out: memoryview) -> None:  # each part retried alone
        storage._retry(lambda: storage._read_once(path, fspath, part, size, out), "read", path, part)

    return read_in_parts(into, whole, pool)


def wait_all(futures: Sequence[Future[Any]]) -> None:
    """Wait for every future; raise the first error in submission order (after the others
    finished or were cancelled, so no thread still writes a buffer being dropped)."""
    error: BaseException | None = None
    for future in futures:
        if future.cancelled():
            continue
        try:
            future.result()
        except BaseException as failed:  # re-raised below: the first one wins
            if error is None:
                error = failed
                for later in futures:
                    later.cancel()
    if error is not None:
        raise error
