"""``OpenFiles``: local files kept open between single reads, at most ``limit`` of them.

A single sample's read of a local file is then one ``pread``, where opening the file,
checking its size against the manifest and closing it again cost more than the read. A
file evicted from the LRU is closed by its last reader, never under a read. A file
truncated while open gives a short read (its caller names it); one rewritten in place
fails its checksum.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from typing import IO

from shardstream.errors import StorageError
from shardstream.storage.core import Storage
from shardstream.storage.expect import Expected
from shardstream.types import ByteRange

__all__ = ["Named", "OpenFiles"]

# What names a read's error for its caller: the error and ``(path, range or None)``.
Named = Callable[[StorageError, tuple[str, "ByteRange | None"]], Exception]


class _Entry:
    __slots__ = ("file", "retired", "users")

    def __init__(self, file: IO[bytes]) -> None:
        self.file, self.users, self.retired = file, 0, False


class OpenFiles:
    """Files of ``storage`` kept open for ``pread``, the ``limit`` used last."""

    def __init__(self, storage: Storage, limit: int) -> None:
        self.storage, self.limit = storage, limit
        self._files: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._lock = threading.Lock()

    def read_span(self, path: str, expect: Expected | None, named: Named, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (fewer where the file ends first); the file is
        opened (its size checked against ``expect``) on first use, its error passed through
        ``named``. The arguments come in the order a reader of one file binds first
        (``functools.partial(files.read_span, path, expect, named)``): a single sample's
        read is then one call, with no range made for it."""
        entry = self._acquire(path, expect, named)
        try:
            return os.pread(entry.file.fileno(), end - start, start)
        except OSError as error:
            raise StorageError(
                f"cannot read bytes [{start}, {end}): {error}",
                url=self.storage.full_url(path),
                shard=path,
                offset=start,
            ) from error
        finally:
            self._release(entry)

    def _acquire(self, path: str, expect: Expected | None, named: Named) -> _Entry:
        """``path``'s entry, open, with this read counted as a user."""
        with self._lock:
            entry = self._files.get(path)
            if entry is not None:
                self._files.move_to_end(path)
                entry.users += 1
                return entry
        try:  # checks the file's size against the manifest
            opened = self.storage.open(path, expect=expect)
        except StorageError as error:
            raise named(error, (path, None)) from error
        with self._lock:
            entry = self._files.get(path)
            if entry is None:
                entry = self._files[path] = _Entry(opened)
            else:  # another thread opened it meanwhile
                opened.close()
            entry.users += 1
            while len(self._files) > self.limit:
                self._retire(self._files.popitem(last=False)[1])
            return entry

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.users -= 1
            if entry.retired and not entry.users:
                entry.file.close()

    @staticmethod
    def _retire(entry: _Entry) -> None:
        entry.retired = True
        if not entry.users:
            entry.file.close()

    def close(self) -> None:
        """Close every file (at once, or when the read using it ends)."""
        with self._lock:
            for entry in self._files.values():
                self._retire(entry)
            self._files.clear()
