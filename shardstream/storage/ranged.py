"""``RangedReads``: how one reader gets byte ranges of a Storage, chosen once.

The choice (NOTE [ Getting the bytes ] in dataset/fetch.py says why each):
- a cached Storage maps its cache entries (a shard's first read fills its entry, in
  parts where the connection is slow: NOTE [ Filling the cache ] in cached.py);
- a local folder is read by copy, or mapped where the reader asks for it
  (``local_reads="map"``) or its mount is read-only (``"auto"``);
- on object storage a long read is one GET cut into parts where it proves slow (NOTE
  [ Reads in parts ] in cuts.py), a short one a plain read;
- single samples of a local folder read by copy come from files kept open (``pread``).
Every read says whom to ``tell`` of its bytes as they arrive (NOTE [ Read budget ]).
"""

from __future__ import annotations

from collections.abc import Callable

from shardstream.errors import StorageError
from shardstream.storage.core import Storage
from shardstream.storage.cuts import split
from shardstream.storage.expect import Expected
from shardstream.storage.open_files import Named, OpenFiles
from shardstream.storage.parts import Tell
from shardstream.storage.read_pool import ReadPool
from shardstream.types import ByteRange

__all__ = ["RangedReads", "SingleReads"]

Read = Callable[[str, "ByteRange | None"], "bytes | memoryview"]


# NOTE [ Local reads into buffers ]
# A local folder read by copy (the default: a shard truncated in place cannot crash a
# copy) copies a read of ``LOCAL_BUFFERED`` or more into a read buffer taken again
# (NOTE [ Reusing read buffers ] in sinks.py), as object storage's long reads are, not
# into a new ``bytes``. A new block of MiBs is new memory: glibc's malloc serves one
# over its mmap threshold from a fresh mapping, and one below it, freed by another
# thread (the reads run in the fetch thread, the bytes are let go in the caller's), often
# from an arena that gave its pages back. Either way every 4 KiB page costs a fault as
# the copy first touches it, several times the copy itself; a buffer taken again faults
# no more. Shorter reads (single samples, small runs) stay plain ``pread``s into
# ``bytes``: malloc keeps blocks that small, and a buffer's thread hop would cost more
# than it saves. The buffer is copied into with ``preadv`` (the copy path still: a short
# file is a short read, retried and reported, never a SIGBUS), in parts, through
# ``Storage.read_parts``.
LOCAL_BUFFERED = 2**20


def _length(rng: ByteRange | None, expect: Expected | None) -> int:
    """The bytes a read of ``rng`` (None: all of an object ``expect`` sizes) asks for; 0 unknown."""
    if rng is not None:
        return rng.length
    return expect.size if expect is not None and expect.size is not None else 0


class RangedReads:
    """Reads of byte ranges of ``storage`` for one reader, with ``threads`` requests in
    flight on object storage (and cached datasets, whose entries fill so)."""

    def __init__(self, storage: Storage, *, threads: int, local_reads: str = "auto") -> None:
        self.storage = storage
        self.threads = threads
        # Whether reads come from local files: a read costs no request (no whole-object
        # GETs, a short coalescing gap).
        self.local = storage.local_files
        folder = storage.local_files and not storage.cached
        self.mapped = storage.cached or (
            folder and (local_reads == "map" or (local_reads == "auto" and storage.read_only_mount))
        )
        # Whether reads go over a wire (object storage, a cache's fills): then a reader's
        # reads run at once in one pool, the parts of long ones in another (a pool's
        # thread never waits for its own pool), and it fetches windows ahead.
        self.remote = storage.cached or not storage.local_files
        self.pool = ReadPool(threads) if threads > 1 and self.remote else None
        self._part_pool = ReadPool(threads) if threads > 1 and self.remote else None
        # a local folder's long copies go into read buffers (NOTE [ Local reads into buffers ])
        self._copy_pool = ReadPool(1) if folder and not self.mapped else None

    def read(
        self, path: str, rng: ByteRange | None, expect: Expected | None, tell: Tell = None
    ) -> bytes | memoryview:
        """The bytes of ``rng`` (None: the whole object) of ``path``, checked against
        ``expect``; ``tell(bytes)`` as they arrive (a cache entry's: as it fills)."""
        storage = self.storage
        if rng is None and storage.cached and expect is not None and expect.size:
            # a whole object (NOTE [ Whole shards at once ]): its cache entry, filled in
            # parts where the connection is slow (NOTE [ Filling the cache ]), as a range's
            rng = ByteRange(0, expect.size)
        if rng is not None and rng.length and storage.cached:  # the cache entry, checked against expect
            return storage.map(path, rng, expect=expect, pool=self._part_pool, tell=tell)
        if rng is not None and rng.length and self.mapped:  # a local folder's, checked against expect
            return storage.map(path, rng, expect=expect)
        if self._part_pool is not None and self._is_long(rng, expect):
            return storage.read_parts(path, rng, expect=expect, pool=self._part_pool, tell=tell)
        if self._copy_pool is not None and _length(rng, expect) >= LOCAL_BUFFERED:
            return storage.read_parts(path, rng, expect=expect, pool=self._copy_pool, tell=tell)
        data = storage.read(path, rng, expect=expect)
        if tell is not None:
            tell(len(data))
        return data

    def single_reads(self, read: Read, open_files: int) -> SingleReads:
        """Reads of single samples by ``read`` (this object's ``read``, with what the
        caller expects of each object), from up to ``open_files`` files kept open where
        local files are read by copy."""
        files = OpenFiles(self.storage, open_files) if self.local and not self.mapped else None
        return SingleReads(read, files)

    def _is_long(self, rng: ByteRange | None, expect: Expected | None) -> bool:
        """Whether a read may be cut into parts (NOTE [ Reads in parts ])."""
        if rng is None:
            rng = ByteRange(0, expect.size) if expect is not None and expect.size is not None else None
        return rng is not None and not self.storage.cached and len(split(rng)) > 1

    def close(self) -> None:
        """Join the pools' threads."""
        for pool in (self.pool, self._part_pool, self._copy_pool):
            if pool is not None:
                pool.close()


class SingleReads:
    """The bytes of single samples: one ``pread`` of a file kept open (``files``), else
    ``read`` (see ``RangedReads.single_reads``)."""

    def __init__(self, read: Read, files: OpenFiles | None) -> None:
        self._read, self._files = read, files

    @property
    def files(self) -> OpenFiles | None:
        """The files kept open, where local files are read by copy: a reader of one
        sample at a time may bind its file's ``read_span`` once (else None: ``read``)."""
        return self._files

    def read(
        self, path: str, rng: ByteRange, expect: Expected | None, named: Named, *, whole_object: bool = False
    ) -> bytes | memoryview:
        """Bytes ``rng`` of ``path`` (fewer where the object ends first); with
        ``whole_object`` read as all of the object, then cut. Errors of a read are passed
        through ``named`` with what was read."""
        if self._files is not None:
            return self._files.read_span(path, expect, named, rng.start, rng.end)
        item = (path, None if whole_object else rng)
        try:
            data = self._read(*item)
        except StorageError as error:
            raise named(error, item) from error
        return memoryview(data)[rng.start : rng.end] if whole_object else data

    def close(self) -> None:
        """Close the files kept open (each at once, or when the read using it ends)."""
        if self._files is not None:
            self._files.close()
