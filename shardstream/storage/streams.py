"""File-like helpers for remote objects: a GET's body, a ranged sequential reader and a spooled writer."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Protocol

__all__ = ["Body", "RangeReader", "spooled_writer"]


class Body(Protocol):
    """A GET's body, read in order (NOTE [ Reads in parts ] in cuts.py)."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...

    def close(self) -> None: ...


class RangeReader(io.RawIOBase):
    """A seekable raw stream over an object of known size, read by byte ranges.

    ``read_range(start, end)`` must return exactly ``end - start`` bytes (the storage
    layer retries until it does). Wrap it in ``io.BufferedReader`` for small reads; a
    large ``read(n)`` then becomes one ranged request.
    """

    def __init__(self, read_range: Callable[[int, int], bytes], size: int, name: str) -> None:
        super().__init__()
        self._read_range = read_range
        self._size = size
        self._pos = 0
        self.name = name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        view = memoryview(buffer).cast("B")
        n = min(len(view), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._read_range(self._pos, self._pos + n)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        if self._pos >= self._size:
            return b""
        data = self._read_range(self._pos, self._size)
        self._pos += len(data)
        return data


# NOTE [ A spool with no name ]
# A shard bound for an object store is spooled to a local file and uploaded once whole.
# A pack killed mid-shard (SIGKILL, an OOM kill, a preempted node) runs no cleanup, and
# a named spool would stay in the temp dir for good, one shard's size per worker per
# kill. Where the system has /proc/self/fd (Linux), the spool is an unnamed file
# (``tempfile.TemporaryFile``: O_TMPFILE, or unlinked as soon as made) that the kernel
# frees with the process, and the upload reads it back through /proc/self/fd/N, a path
# every ``put_file`` opens. Elsewhere it is named ``shardstream-*`` and removed in every
# case but a kill.
_PROC_FD = "/proc/self/fd"


@contextlib.contextmanager
def spooled_writer(upload: Callable[[str], None]) -> Iterator[IO[bytes]]:
    """Collect the bytes in a local temp file, then ``upload(path)`` once.

    Nothing reaches the remote side unless the ``with`` body completes (NOTE [ A spool
    with no name ]).
    """
    if os.path.isdir(_PROC_FD):
        with tempfile.TemporaryFile(prefix="shardstream-") as spool:
            with os.fdopen(os.dup(spool.fileno()), "wb") as f:
                yield f
            upload(f"{_PROC_FD}/{spool.fileno()}")
        return
    fd, tmp = tempfile.mkstemp(prefix="shardstream-")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        upload(tmp)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
