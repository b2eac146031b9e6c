"""``Storage``: one dataset folder at any fsspec URL, with retries and atomic writes.

# NOTE [ Storage across processes ]
# A Storage pickles as its configuration (url, storage_options, retry policy, cache
# settings), never as a live client, so DataLoader workers started by spawn or
# forkserver rebuild their own. Under fork the object is inherited instead: the file
# system is made lazily with ``skip_instance_cache=True`` and remembered with the pid
# that made it; another process makes a fresh one (NOTE [ Per-process state ] in
# lifecycle.py). The parent's is kept in ``_ABANDONED`` (backend.py), unused and unclosed:
# closing it there would run s3fs's finalizer on connections (and TLS state) that the
# parent still owns. So is every file system of the parent's with an open session (ours
# or the user's), at fork, and its finalizer detached (``_leave_parent_sessions`` in
# backend.py): collected in the child, s3fs's stalls the thread that collects it, for
# long enough to delay a DataLoader worker's first samples.
# The botocore client that reads s3:// objects follows the same rules
# (see NOTE [ S3 reads without s3fs ] in s3read.py). What a Storage does on each kind of
# storage is its backend's: NOTE [ One backend per Storage ] in backend.py.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, TypeVar

from shardstream.errors import NotADatasetError, StorageError, UsageError
from shardstream.manifest import LEGACY_MANIFEST_NAME, MANIFEST_NAME, Manifest
from shardstream.storage import cached as through_cache
from shardstream.storage import local
from shardstream.storage.backend import Backend, backend_for
from shardstream.storage.cache import ShardCache
from shardstream.storage.expect import Expected, SizeChanged
from shardstream.storage.pacing import StartPacing
from shardstream.storage.parts import Tell, read_parts
from shardstream.storage.read_pool import ReadPool
from shardstream.storage.retried import RetriedIO
from shardstream.storage.retry import RetryPolicy, is_not_found, permanent_error
from shardstream.storage.s3read import S3Reader
from shardstream.storage.streams import RangeReader
from shardstream.types import ByteRange

__all__ = ["Storage"]

R = TypeVar("R")

_STREAM_BUFFER = 4 * 2**20  # read-ahead of open() streams on remote objects


class Storage:
    """A dataset folder at any fsspec URL (local path, file://, s3://, memory://...).

    Paths given to methods are relative to the folder (``"shard-000000.tar"``). Reads
    retry transient errors per ``retry``; writes are atomic. With ``cache_dir`` set,
    remote shards are kept whole on local disk (see NOTE [ Shard cache ]). A
    ``read_only`` Storage refuses every write and delete (pack sources read through one).
    With ``pacing``, this process's first reads of a remote folder wait their turn
    (NOTE [ Paced start ] in pacing.py).
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        cache_dir: str | None = None,
        cache_limit: int | None = None,
        read_only: bool = False,
        pacing: StartPacing | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.strip():
            raise UsageError(f"storage URL must be a non-empty string, not {url!r}")
        if "::" in url:
            raise UsageError("chained fsspec URLs (a::b) are not supported; use cache_dir to cache", url=url)
        if cache_limit is not None and cache_dir is None:
            raise UsageError("cache_limit needs cache_dir", url=url)
        self._options = dict(storage_options or {})
        policy = retry if retry is not None else RetryPolicy()
        self.cache_dir = cache_dir
        self.cache_limit = cache_limit
        self.read_only = read_only
        # Chosen once: see NOTE [ One backend per Storage ] in backend.py.
        self._backend: Backend
        self._backend, self._root, self.url = backend_for(url, self._options)
        # what long reads and the cache's reads use of this Storage (NOTE [ Reads in parts ])
        self._io = RetriedIO(self._backend, self._root, self.url, policy, pacing)
        # Local files are already local: caching them would only copy them.
        local_files = self._backend.is_local
        self._cache = ShardCache(cache_dir, cache_limit) if cache_dir and not local_files else None

    # -- configuration, pickling, life cycle ---------------------------------------

    @property
    def retry(self) -> RetryPolicy:
        """How transient errors are retried (it may be replaced: reads take it as they start)."""
        return self._io.policy

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        self._io.policy = policy

    @property
    def pacing(self) -> StartPacing | None:
        """How this process's first reads are paced (None: not paced, or a local folder)."""
        return self._io.pacing

    @property
    def local_files(self) -> bool:
        """Whether reads come from local files: a local folder, or remote shards cached whole."""
        return self._backend.is_local or self._cache is not None

    @property
    def cached(self) -> bool:
        """Whether reads come from whole local copies in ``cache_dir`` (remote shards only)."""
        return self._cache is not None

    @property
    def read_only_mount(self) -> bool:
        """Whether the folder is local, on a file system mounted read-only: its files
        cannot be truncated in place, so mapping them is safe (NOTE [ Getting the bytes ]
        in shardstream/dataset/fetch.py)."""
        return self._backend.read_only_mount(self._root)

    @property
    def needs_sync(self) -> bool:
        """Whether a file written with ``durable=False`` needs ``sync`` to survive a crash
        (local folders; an object is durable once its upload returns)."""
        return self._backend.needs_sync

    @property
    def local_root(self) -> str | None:
        """The folder's absolute path where it is on local disk, else None.

        For code that must walk local files itself (the pack's folder source refuses a
        FIFO without opening it); everything else goes through the Storage's methods.
        """
        return self._root if self._backend.is_local else None

    @property
    def storage_options(self) -> dict[str, Any]:
        return dict(self._options)

    @property
    def _s3(self) -> S3Reader | None:
        """The botocore reader of s3:// objects, or None (NOTE [ S3 reads without s3fs ])."""
        return getattr(self._backend, "reader", None)

    def __reduce__(self):  # configuration only; see NOTE [ Storage across processes ]
        args = (self.url, self._options, self.retry, self.cache_dir, self.cache_limit, self.read_only)
        return (_rebuild, (*args, self.pacing))

    def __repr__(self) -> str:  # never show storage_options: they may hold secrets
        return f"Storage({self.url!r})"

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def fs(self) -> Any:
        """This process's fsspec file system (made on first use, remade after fork)."""
        return self._backend.fs

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint the folder is read through ("" for the default one or no S3)."""
        return self._io.endpoint_url

    def latency(self) -> float | None:
        """Seconds this process's small GETs here took to answer, at least (None: none
        measured, or no S3; NOTE [ A link's latency before its reads ] in cuts.py)."""
        return self._io.latency()

    def close(self) -> None:
        """Release this process's connections; the Storage can still be used later."""
        self._backend.close()

    # -- paths ---------------------------------------------------------------------

    def full_url(self, path: str) -> str:
        """The URL of ``path`` (relative to the dataset folder)."""
        return self._io.full_url(path)

    def _fspath(self, path: str) -> str:
        return self._io.fspath(path)

    def _retry(self, operation: Callable[[], R], what: str, path: str, rng: ByteRange | None = None) -> R:
        return self._io.retry(operation, what, path, rng)

    # -- reading -------------------------------------------------------------------

    def read(self, path: str, rng: ByteRange | None = None, *, expect: Expected | None = None) -> bytes:
        """The whole object, or exactly the bytes of ``rng``.

        Transient errors and short reads are retried; a missing object fails at once
        with ``StorageError`` ("not found ..."), naming the URL and byte range. With
        ``expect`` (what the manifest says the object is), an object of another size
        fails at once too; see NOTE [ Reads check the manifest ] in expect.py.
        """
        if rng is not None and rng.length == 0:
            return b""
        if self._cache is None:
            return self._io.read(path, rng, expect)
        return through_cache.read_cached(self._io, self._cache, path, rng, expect)

    def read_parts(
        self, path: str, rng: ByteRange | None, *, expect: Expected | None, pool: ReadPool, tell: Tell = None
    ) -> bytes | memoryview:
        """``read``, a long read (a whole object too, where ``expect`` gives its size) in
        parts read by ``pool``'s threads into one buffer (NOTE [ Reads in parts ]), telling
        ``tell(bytes)`` as they arrive; a plain ``read`` where the Storage is cached."""
        if self._cache is not None:
            return self.read(path, rng, expect=expect)
        return read_parts(self._io, path, rng, expect, pool, tell)

    def open(self, path: str, *, expect: Expected | None = None) -> IO[bytes]:
        """A sequential (and seekable) binary read stream; use it as a context manager.

        With ``expect``, an object of another size fails at once (local files and the
        cache are checked on open, remote streams on every ranged read).
        """
        if self._cache is not None:  # the caller closes it
            opener = lambda entry: open(entry, "rb")  # noqa: E731, SIM115
            return through_cache.with_entry(
                self._io, self._cache, path, expect, None, opener, lambda: self._stream(path, expect)
            )
        opened = self._open_direct(path, expect)
        if opened is not None:
            return opened
        return self._stream(path, expect)

    def _stream(self, path: str, expect: Expected | None) -> IO[bytes]:
        """A stream of ranged reads of an object, not cached."""
        size = expect.size if expect is not None and expect.size is not None else self.size(path)
        raw = RangeReader(
            lambda start, end: self._io.read(path, ByteRange(start, end), expect),
            size,
            self.full_url(path),
        )
        return io.BufferedReader(raw, buffer_size=_STREAM_BUFFER)

    def _open_direct(self, path: str, expect: Expected | None) -> IO[bytes] | None:
        size = expect.size if expect is not None else None
        try:
            return self._backend.open_direct(self._io.fspath(path), size)
        except SizeChanged as changed:
            raise self._io.changed(path, None, changed.actual, size) from None
        except OSError as error:
            raise permanent_error(error, "open", self.full_url(path)) from error

    def size(self, path: str) -> int:
        """The object's size in bytes."""
        return self._io.size(path)

    def map(
        self,
        path: str,
        rng: ByteRange,
        *,
        expect: Expected | None = None,
        pool: ReadPool | None = None,
        tell: Tell = None,
    ) -> memoryview:
        """The bytes of ``rng`` memory-mapped, not copied: from the shard cache, or a local file.

        Reads copy by default on purpose: a local file truncated while mapped kills the
        process with SIGBUS, and only cache entries are never truncated in place (NOTE
        [ Getting the bytes ] in shardstream/dataset/fetch.py). Object stores have no
        mapping: ``UsageError`` there without ``cache_dir``. ``pool`` and ``tell``: the
        threads that fill a cache entry in parts, and whom they tell of its bytes.
        """
        if self._cache is not None:  # the cache entry, checked against expect
            mapped = lambda entry: local.map_range(entry, rng, self.full_url(path))  # noqa: E731
            uncached = lambda: memoryview(self._io.read(path, rng, expect))  # noqa: E731
            return through_cache.with_entry(self._io, self._cache, path, expect, pool, mapped, uncached, tell)
        size = expect.size if expect is not None else None
        try:
            return self._backend.map(self._io.fspath(path), rng, self.full_url(path), size)
        except SizeChanged as changed:
            raise self._io.changed(path, rng, changed.actual, size) from None

    def is_folder(self, path: str = "") -> bool:
        """Whether ``path`` is a folder (else a file); a missing one fails as "not found"."""
        fspath = self._io.fspath(path)
        return self._io.retry(lambda: self._backend.kind(fspath) == "folder", "info", path)

    def list_sizes(self) -> list[tuple[str, int]]:
        """(relative path, size) of every file under the folder, recursively, in no order."""
        return self._io.retry(lambda: self._backend.find_sizes(self._root), "list", "")

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a file, or for local paths also a folder)."""
        fspath = self._io.fspath(path)

        def check() -> bool:
            try:
                self._backend.size(fspath)
            except FileNotFoundError:
                return False
            except Exception as error:
                if is_not_found(error):
                    return False
                raise
            return True

        return self._io.retry(check, "exists", path)

    def list_files(self) -> list[str]:
        """Every file under the folder, recursively, as sorted relative paths."""
        return self._io.retry(lambda: self._backend.find(self._root), "list", "")

    # -- writing -------------------------------------------------------------------

    def write(self, path: str, data: bytes, *, durable: bool = True) -> None:
        """Store ``data`` at ``path`` atomically: readers see no object or all of it.

        ``durable=False``: see ``writer``.
        """
        fspath = self._target(path)
        self._backend.write(fspath, data, durable=durable, retried=self._upload_retry(path))
        self._forget_cached(path)

    @contextlib.contextmanager
    def writer(self, path: str, *, durable: bool = True) -> Iterator[IO[bytes]]:
        """An atomic streaming write; on an exception nothing becomes visible.

        Local: a ``.shardstream-tmp-*`` file next to the target, fsynced and renamed on
        success. Remote: a ``shardstream-*`` temp file, uploaded in one go on success
        (s3fs uses a multipart upload for large files; an upload is retried as a whole).
        ``durable=False`` renames a local file without its fsync: the caller must
        ``sync`` it and then the folder (``sync("")``) before anything relies on it
        surviving a crash (NOTE [ Durable before the manifest ] in pack/durable.py).
        An uploaded object is durable either way.
        """
        fspath = self._target(path)
        with self._backend.writer(fspath, durable=durable, retried=self._upload_retry(path)) as f:
            yield f
        self._forget_cached(path)

    def _upload_retry(self, path: str) -> Callable[[Callable[[], None]], None]:
        return lambda upload: self._io.retry(upload, "write", path)

    def delete(self, path: str) -> None:
        """Remove ``path``; a missing one is fine."""
        fspath = self._target(path)
        self._io.retry(lambda: self._backend.delete(fspath), "delete", path)
        self._forget_cached(path)

    def sync(self, path: str = "") -> None:
        """Make ``path`` (written with ``durable=False``), or with ``""`` the renames into
        the folder, durable; nothing to do where ``needs_sync`` is False.

        Raises the ``OSError`` of a failed fsync as it is: its caller says what could not
        be made durable (``shardstream.pack.durable``).
        """
        self._backend.sync(self._io.fspath(path))

    def remove_temp_files(self, ours: Callable[[str], bool], folder: str = "") -> None:
        """Delete what writes that died left in flight at the top of ``folder`` (the
        folder's own top by default), where ``ours(target name)`` says it is the caller's
        (other writers may be busy).

        Only local folders hold such files: remote writes spool outside the dataset.
        """
        self._target(f"{folder}/-" if folder else "-")  # the folders down to ``folder``
        self._backend.sweep_temp(self._io.fspath(folder), ours)

    def _target(self, path: str) -> str:
        """The file system path of ``path``, to be written or deleted: refused on read-only
        storage, or where it would lead outside the folder (NOTE [ Writes stay inside the
        folder ] in local.py)."""
        if self.read_only:
            raise UsageError(f"read-only storage: cannot change {path or 'the folder'!r}", url=self.url)
        fspath = self._io.fspath(path)
        self._backend.confine(self._root, fspath)
        return fspath

    def drop_cached(self, path: str, expect: Expected | None = None) -> str | None:
        """Delete ``path``'s cache entry (for what ``expect`` says of it), one whose bytes
        failed a check: the entry's file (None without a cache)."""
        if self._cache is None:
            return None
        content = expect.content_key if expect is not None else ""
        return self._cache.drop(through_cache.cache_key(self._io, path), content)

    def _forget_cached(self, path: str) -> None:
        self._backend.forget(self._io.fspath(path))
        if self._cache is not None:
            self._cache.forget(through_cache.cache_key(self._io, path))

    # -- manifest ------------------------------------------------------------------

    def read_manifest(self) -> Manifest:
        """The dataset's manifest (always read from storage, never from the cache): in
        ``.shardstream/``, or at the top of a dataset of the legacy layout."""
        for name in (MANIFEST_NAME, LEGACY_MANIFEST_NAME):
            try:
                data = self._io.read(name, None)
            except StorageError as error:
                if is_not_found(error):
                    continue
                if any(isinstance(e, NotADirectoryError) for e in (error.__cause__, error.__context__)):
                    self._backend.confine(self._root, self._io.fspath(name))  # names the file in the way
                raise
            return Manifest.from_json(data, url=self.full_url(name))
        raise NotADatasetError(
            f"no {MANIFEST_NAME} (nor {LEGACY_MANIFEST_NAME}) at {self.url}: not a shardstream dataset "
            f"(run `shardstream index {self.url}`)",
            url=self.full_url(MANIFEST_NAME),
        )

    def write_manifest(self, manifest: Manifest) -> None:
        """Write ``.shardstream/manifest.json`` atomically (do it last: it makes the folder a dataset)."""
        self.write(MANIFEST_NAME, manifest.to_json().encode())


def _rebuild(
    url: str,
    options: dict[str, Any],
    retry: RetryPolicy,
    cache_dir: str | None,
    cache_limit: int | None,
    read_only: bool = False,
    pacing: StartPacing | None = None,
) -> Storage:
    return Storage(
        url,
        options,
        retry=retry,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        read_only=read_only,
        pacing=pacing,
    )
