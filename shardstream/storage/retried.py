"""``RetriedIO``: the few operations that long reads and the shard cache need of a Storage.

Each operation is tried by the Storage's backend and retried per its ``RetryPolicy``;
errors name the object's URL and byte range. ``Storage`` makes one and hands it to
``parts.read_long`` and to the cache's reads (``cached.py``), which so see no more of the
Storage than this: no private member of it, and no import of ``core`` (which imports them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from shardstream.errors import StorageError, UsageError
from shardstream.storage.backend import Backend
from shardstream.storage.expect import (
    Expected,
    SizeChanged,
    short_read,
    short_whole_read,
    size_changed_error,
)
from shardstream.storage.pacing import StartPacing, gate
from shardstream.storage.retry import RetryPolicy, call_with_retry
from shardstream.storage.streams import Body
from shardstream.types import ByteRange

__all__ = ["RetriedIO"]

R = TypeVar("R")


class RetriedIO:
    """Reads of one dataset folder (``root`` on ``backend``, shown as ``url``), each retried
    per ``retry`` (``NOTE [ One retry layer ]`` in retry.py); the process's first GETs
    (reads, streams, sizes) paced per ``pacing`` where the folder is not local (NOTE
    [ Paced start ] in pacing.py)."""

    def __init__(
        self, backend: Backend, root: str, url: str, retry: RetryPolicy, pacing: StartPacing | None = None
    ) -> None:
        self.backend, self.root, self.url, self.policy = backend, root, url, retry
        self.pacing = None if backend.is_local else pacing

    @property
    def streams(self) -> bool:
        """Whether ``stream`` gives a GET's body to read as it arrives (NOTE [ Reads in parts ])."""
        return self.backend.streams

    def latency(self) -> float | None:
        """The backend's time to answer a GET (NOTE [ A link's latency before its reads ] in cuts.py)."""
        return self.backend.latency()

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint the folder is read through ("" for the default one or no S3)."""
        return str(self.backend.fs_options().get("endpoint_url") or "")

    # -- paths ---------------------------------------------------------------------

    def full_url(self, path: str) -> str:
        """The URL of ``path`` (relative to the dataset folder)."""
        self.check_path(path)
        return f"{self.url}/{path}" if path else self.url

    def fspath(self, path: str) -> str:
        """The backend's name of ``path``."""
        self.check_path(path)
        return f"{self.root}/{path}" if path else self.root

    def check_path(self, path: str) -> None:
        if not isinstance(path, str) or path.startswith("/") or "://" in path or ".." in path.split("/"):
            raise UsageError(
                f"path must be relative and inside the dataset folder, not {path!r}", url=self.url
            )

    # -- operations ----------------------------------------------------------------

    def retry(
        self,
        operation: Callable[[], R],
        what: str,
        path: str,
        rng: ByteRange | None = None,
        *,
        paced: bool = False,
    ) -> R:
        """``operation()``, retried per the policy; errors name ``path``'s URL and ``rng``.
        ``paced``: each try is one request, one of the process's first ones paced (NOTE
        [ Paced start ] in pacing.py)."""
        return call_with_retry(
            operation,
            self.policy,
            what=what,
            url=self.full_url(path),
            rng=rng,
            timeouts=self.backend.timeouts,  # made only for an error that timed out
            bounded=what != "write",  # uploads keep their attempts: NOTE [ Bounded waits ]
            pace=self.pace if paced and self.pacing is not None else None,
        )

    def pace(self) -> None:
        """Wait for a request's turn where this process is starting (NOTE [ Paced start ])."""
        if self.pacing is not None:
            gate(self.pacing).admit()

    def read(self, path: str, rng: ByteRange | None, expect: Expected | None = None) -> bytes:
        """The whole object or exactly ``rng``'s bytes, never through a cache."""
        fspath = self.fspath(path)
        size = expect.size if expect is not None else None
        return self.retry(lambda: self.read_once(path, fspath, rng, size), "read", path, rng, paced=True)

    def read_into(self, path: str, rng: ByteRange, size: int | None, out: memoryview) -> None:
        """``rng``'s bytes into ``out`` (``size``: the object's expected size)."""
        fspath = self.fspath(path)
        self.retry(lambda: self.read_once(path, fspath, rng, size, out), "read", path, rng, paced=True)

    def read_once(
        self, path: str, fspath: str, rng: ByteRange | None, size: int | None, out: memoryview | None = None
    ) -> Any:
        """One try of a read: its bytes, or with ``out`` (and ``rng``) read into ``out``."""
        try:
            if out is not None and rng is not None:
                got = self.backend.read_into(fspath, rng, out, size)
                if got != rng.length:
                    self.short_read(path, rng, got, size)
                return None
            data = self.backend.read(fspath, rng, size)
            if rng is None and size is not None and len(data) != size:
                short_whole_read(lambda: self.backend.size(fspath), self.full_url(path), len(data), size)
        except SizeChanged as changed:
            raise self.changed(path, rng, changed.actual, size) from None
        if rng is not None and len(data) != rng.length:
            self.short_read(path, rng, len(data), size)
        return data

    def stream(self, path: str, rng: ByteRange | None, size: int | None) -> Body:
        """One GET of ``rng`` (None: a plain GET of the whole object), tried once: its body."""
        self.pace()  # a request of its caller's try, which is not paced itself
        try:
            return self.backend.stream(self.fspath(path), rng, size)
        except SizeChanged as changed:
            raise self.changed(path, rng, changed.actual, size) from None

    def size(self, path: str) -> int:
        """The object's size in bytes."""
        fspath = self.fspath(path)
        return self.retry(lambda: self.backend.size(fspath), "size", path, paced=True)

    # -- errors --------------------------------------------------------------------

    def changed(self, path: str, rng: ByteRange | None, actual: int, expected: int | None) -> StorageError:
        """The error of an object whose size is not the manifest's."""
        return size_changed_error(self.full_url(path), path, rng, actual, expected)

    def short_read(self, path: str, rng: ByteRange, got: int, expected: int | None = None) -> None:
        """Raise the error of a read of ``rng`` that brought only ``got`` bytes."""
        size_now = lambda: self.backend.size(self.fspath(path))  # noqa: E731
        short_read(size_now, self.full_url(path), path, rng, got, expected)
