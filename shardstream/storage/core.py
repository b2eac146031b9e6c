"""``Storage``: one dataset folder at any fsspec URL, with retries and atomic writes.

# NOTE [ Storage across processes ]
# A Storage pickles as its configuration (url, storage_options, retry policy, cache
# settings), never as a live client, so DataLoader workers started by spawn or
# forkserver rebuild their own. Under fork the object is inherited instead: the file
# system is made lazily with ``skip_instance_cache=True`` and remembered with the pid
# that made it; a process with another pid makes a fresh one. The parent's file system
# is then kept referenced in ``_ABANDONED`` and never used or closed in the child:
# closing it there would run s3fs's finalizer on connections (and TLS state) that the
# parent still owns. The botocore client that reads s3:// objects follows the same rules
# (see NOTE [ S3 reads without s3fs ] in s3read.py).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, TypeVar, cast

from shardstream.errors import ManifestError, StorageError, TransientStorageError, UsageError
from shardstream.manifest import MANIFEST_NAME, Manifest
from shardstream.storage import local
from shardstream.storage.cache import ShardCache
from shardstream.storage.expect import Expected, SizeChanged, changed_error, download, size_changed_error
from shardstream.storage.retry import RetryPolicy, call_with_retry, is_not_found, permanent_error
from shardstream.storage.s3read import S3Reader, s3_options, timeouts_of
from shardstream.storage.streams import RangeReader, spooled_writer
from shardstream.types import ByteRange

__all__ = ["Storage"]

R = TypeVar("R")

_S3_PROTOCOLS = ("s3", "s3a")
_DOWNLOAD_CHUNK = 32 * 2**20  # cache downloads go in ranged reads of this size, each retried
_STREAM_BUFFER = 4 * 2**20  # read-ahead of open() streams on remote objects
_ABANDONED: list[Any] = []  # file systems made by a parent process; see NOTE [ Storage across processes ]


class Storage:
    """A dataset folder at any fsspec URL (local path, file://, s3://, memory://...).

    Paths given to methods are relative to the folder (``"shard-000000.tar"``). Reads
    retry transient errors per ``retry``; writes are atomic. With ``cache_dir`` set,
    remote shards are kept whole on local disk (see NOTE [ Shard cache ]).
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        cache_dir: str | None = None,
        cache_limit: int | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.strip():
            raise UsageError(f"storage URL must be a non-empty string, not {url!r}")
        if "::" in url:
            raise UsageError("chained fsspec URLs (a::b) are not supported; use cache_dir to cache", url=url)
        if cache_limit is not None and cache_dir is None:
            raise UsageError("cache_limit needs cache_dir", url=url)
        protocol, path = local.split_protocol(url)
        self._protocol = protocol or "file"
        self._is_local = local.is_local_url(url)
        self._options = dict(storage_options or {})
        self.retry = retry if retry is not None else RetryPolicy()
        self.cache_dir = cache_dir
        self.cache_limit = cache_limit
        if self._is_local:
            self._root = os.path.abspath(os.path.expanduser(path))
            self.url = self._root if protocol is None else f"file://{self._root}"
        else:
            import fsspec  # not for local folders: see local.split_protocol

            try:
                fs_class = fsspec.get_filesystem_class(self._protocol)
            except (ValueError, ImportError) as error:
                raise UsageError(f"unsupported storage URL: {error}", url=url) from None
            self._root = str(fs_class._strip_protocol(url)).rstrip("/")
            self.url = url.rstrip("/")
            if not self._root.strip("/"):
                raise UsageError("the URL names no folder (like s3://bucket/dataset)", url=url)
        # Local files are already local: caching them would only copy them.
        self._cache = ShardCache(cache_dir, cache_limit) if cache_dir and not self._is_local else None
        self._fs: Any = None
        self._fs_pid = -1
        self._sizes: dict[str, int] = {}
        self._sizes_pid = -1
        # Object reads on s3:// skip s3fs; see NOTE [ S3 reads without s3fs ] in s3read.py.
        self._s3 = S3Reader.create(self._options) if self._protocol in _S3_PROTOCOLS else None

    # -- configuration, pickling, life cycle ---------------------------------------

    @property
    def local_files(self) -> bool:
        """Whether reads come from local files: a local folder, or remote shards cached whole."""
        return self._is_local or self._cache is not None

    @property
    def cached(self) -> bool:
        """Whether reads come from whole local copies in ``cache_dir`` (remote shards only)."""
        return self._cache is not None

    @property
    def storage_options(self) -> dict[str, Any]:
        return dict(self._options)

    def __reduce__(self):  # configuration only; see NOTE [ Storage across processes ]
        args = (self.url, self._options, self.retry, self.cache_dir, self.cache_limit)
        return (_rebuild, args)

    def __repr__(self) -> str:  # never show storage_options: they may hold secrets
        return f"Storage({self.url!r})"

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def fs(self) -> Any:
        """This process's fsspec file system (made on first use, remade after fork)."""
        fs, pid = self._fs, os.getpid()
        if fs is None or self._fs_pid != pid:
            if fs is not None:
                _ABANDONED.append(fs)
            import fsspec

            fs = fsspec.filesystem(self._protocol, skip_instance_cache=True, **self._fs_options())
            if self._protocol in _S3_PROTOCOLS:
                # s3fs's own retry loop (a class attribute, not an option): one try, see
                # NOTE [ One retry layer ] in retry.py.
                fs.retries = 1
            self._fs, self._fs_pid = fs, pid
        return fs

    def _fs_options(self) -> dict[str, Any]:
        # The endpoint from the environment, and one try in botocore: see s3_options.
        return s3_options(self._options) if self._protocol in _S3_PROTOCOLS else dict(self._options)

    def close(self) -> None:
        """Release this process's connections; the Storage can still be used later."""
        if self._s3 is not None:
            self._s3.close()
        fs, self._fs = self._fs, None
        if fs is None:
            return
        if self._fs_pid != os.getpid():  # the parent's: never close it here
            _ABANDONED.append(fs)
            return
        creator = getattr(fs, "_s3creator", None)
        if creator is not None and getattr(fs, "_s3", None) is not None:
            with contextlib.suppress(Exception):
                type(fs).close_session(fs.loop, creator)
            fs._s3 = None

    # -- paths ---------------------------------------------------------------------

    def full_url(self, path: str) -> str:
        """The URL of ``path`` (relative to the dataset folder)."""
        self._check_path(path)
        return f"{self.url}/{path}" if path else self.url

    def _fspath(self, path: str) -> str:
        self._check_path(path)
        return f"{self._root}/{path}" if path else self._root

    def _check_path(self, path: str) -> None:
        if not isinstance(path, str) or path.startswith("/") or "://" in path or ".." in path.split("/"):
            raise UsageError(
                f"path must be relative and inside the dataset folder, not {path!r}", url=self.url
            )

    def _retry(self, operation: Callable[[], R], what: str, path: str, rng: ByteRange | None = None) -> R:
        options = self._options
        timeouts = (lambda: timeouts_of(options)) if self._protocol in _S3_PROTOCOLS else ""
        return call_with_retry(
            operation,
            self.retry,
            what=what,
            url=self.full_url(path),
            rng=rng,
            timeouts=timeouts,  # made only for an error that timed out
            bounded=what != "write",  # uploads keep their attempts: NOTE [ Bounded waits ]
        )

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
            return self._read_direct(path, rng, expect)
        return self._read_cached(path, rng, expect)

    def _read_direct(self, path: str, rng: ByteRange | None, expect: Expected | None = None) -> bytes:
        fspath = self._fspath(path)
        size = expect.size if expect is not None else None
        return self._retry(lambda: self._read_once(path, fspath, rng, size), "read", path, rng)

    def _read_once(self, path: str, fspath: str, rng: ByteRange | None, size: int | None) -> bytes:
        try:
            if self._is_local:
                data = local.read(fspath, rng, size=size)
            elif self._s3 is not None:
                bucket, _, key = fspath.partition("/")
                data = self._s3.read(bucket, key, rng, size=size)
            else:
                data = self._read_fsspec(fspath, rng, size)
            if rng is None and size is not None and len(data) != size:
                self._short_whole_read(path, fspath, len(data), size)
        except SizeChanged as changed:
            raise self._changed(path, rng, changed.actual, size) from None
        if rng is not None and len(data) != rng.length:
            self._short_read(path, rng, len(data), size)
        return data

    def _read_fsspec(self, fspath: str, rng: ByteRange | None, size: int | None) -> bytes:
        # fsspec's cat_file does not say the object's size, so a ranged read asks (a HEAD),
        # once per path and process: NOTE [ One size check per object ]. A whole read is
        # checked by its length instead (_read_once).
        if rng is None:
            return bytes(self.fs.cat_file(fspath))
        if size is not None and self._sizes_checked.get(fspath) != size:
            actual = self._size_once(fspath)
            if actual != size:
                raise SizeChanged(actual)
            self._sizes_checked[fspath] = size
        return bytes(self.fs.cat_file(fspath, start=rng.start, end=rng.end))

    @property
    def _sizes_checked(self) -> dict[str, int]:
        """The objects whose size this process checked, and that size (reset after fork)."""
        pid = os.getpid()
        if self._sizes_pid != pid:
            self._sizes, self._sizes_pid = {}, pid
        return self._sizes

    def _short_whole_read(self, path: str, fspath: str, got: int, size: int) -> None:
        """A whole read of ``got`` bytes of an object the manifest says has ``size``: an
        object of another size, or (the object still has ``size`` bytes) a cut transfer."""
        actual = self._size_once(fspath)
        if actual != size:
            raise SizeChanged(actual)
        raise TransientStorageError(f"short read: {got} of {size} bytes", url=self.full_url(path))

    def _changed(self, path: str, rng: ByteRange | None, actual: int, expected: int | None) -> StorageError:
        return size_changed_error(self.full_url(path), path, rng, actual, expected)

    def _short_read(self, path: str, rng: ByteRange, got: int, expected: int | None = None) -> None:
        size = self._size_once(self._fspath(path))
        if expected is not None and size != expected:
            raise self._changed(path, rng, size, expected)
        where = f"bytes [{rng.start}, {rng.end})"
        if size < rng.end:  # no retry will make the object longer
            raise StorageError(
                f"{where} are past the end of the object ({size} bytes)",
                url=self.full_url(path),
                offset=rng.start,
            )
        raise TransientStorageError(f"short read: {got} of {rng.length} {where}", url=self.full_url(path))

    def _read_cached(self, path: str, rng: ByteRange | None, expect: Expected | None) -> bytes:
        for _ in range(3):  # an entry evicted by another process between fetch and read is fetched again
            cached = self._cached_path(path, expect)
            try:
                data = local.read(cached, rng)
            except FileNotFoundError:
                continue
            if rng is not None and len(data) != rng.length:
                self._short_read(path, rng, len(data))
            return data
        return self._read_direct(path, rng, expect)

    def _cache_key(self, path: str) -> str:
        """The object's name in the cache; its entries are also keyed by content where the
        manifest names it (NOTE [ Reads check the manifest ])."""
        return f"{self._fs_options().get('endpoint_url') or ''}|{self.full_url(path)}"

    def _cached_path(self, path: str, expect: Expected | None = None) -> str:
        cache = self._cache
        if cache is None:
            raise UsageError("no cache_dir set", url=self.url)
        known = expect.size if expect is not None else None
        return cache.fetch(
            self._cache_key(path),
            (lambda: known) if known is not None else (lambda: self.size(path)),
            lambda tmp, n: self._download(path, tmp, n, expect),
            url=self.full_url(path),
            content=expect.content_key if expect is not None else "",
        )

    def _download(self, path: str, tmp: str, size: int, expect: Expected | None) -> None:
        read = lambda rng: self._read_direct(path, rng, expect)  # noqa: E731
        try:  # reads raise ShardstreamErrors only: an OSError is the cache's disk
            got = download(read, tmp, size, _DOWNLOAD_CHUNK, expect.sha256 if expect is not None else "")
        except OSError as error:
            raise cast(ShardCache, self._cache).disk_error(error, self.full_url(path)) from error
        if got is not None and expect is not None:
            what = f"its sha256 is {got}, the manifest says {expect.sha256}"
            raise changed_error(self.full_url(path), path, what)

    def open(self, path: str, *, expect: Expected | None = None) -> IO[bytes]:
        """A sequential (and seekable) binary read stream; use it as a context manager.

        With ``expect``, an object of another size fails at once (local files and the
        cache are checked on open, remote streams on every ranged read).
        """
        if self._cache is not None:
            return open(self._cached_path(path, expect), "rb")  # the caller closes it
        if self._is_local:
            return self._open_local(path, expect)
        size = expect.size if expect is not None and expect.size is not None else self.size(path)
        raw = RangeReader(
            lambda start, end: self._read_direct(path, ByteRange(start, end), expect),
            size,
            self.full_url(path),
        )
        return io.BufferedReader(raw, buffer_size=_STREAM_BUFFER)

    def _open_local(self, path: str, expect: Expected | None) -> IO[bytes]:
        size = expect.size if expect is not None else None
        try:
            return local.open_file(self._fspath(path), size=size)
        except SizeChanged as changed:
            raise self._changed(path, None, changed.actual, size) from None
        except OSError as error:
            raise permanent_error(error, "open", self.full_url(path)) from error

    def size(self, path: str) -> int:
        """The object's size in bytes."""
        fspath = self._fspath(path)
        return self._retry(lambda: self._size_once(fspath), "size", path)

    def _size_once(self, fspath: str) -> int:
        if self._is_local:
            return os.stat(fspath).st_size
        self.fs.invalidate_cache(fspath)  # another process may have written it since
        return int(self.fs.info(fspath)["size"])

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a file, or for local paths also a folder)."""
        fspath = self._fspath(path)

        def check() -> bool:
            try:
                self._size_once(fspath)
            except FileNotFoundError:
                return False
            except Exception as error:
                if is_not_found(error):
                    return False
                raise
            return True

        return self._retry(check, "exists", path)

    def list_files(self) -> list[str]:
        """Every file under the folder, recursively, as sorted relative paths."""
        if self._is_local:
            return local.list_files(self._root)

        def find() -> list[str]:
            self.fs.invalidate_cache(self._root)
            return list(self.fs.find(self._root, withdirs=False))

        prefix = self._root + "/"
        found = self._retry(find, "list", "")
        rel = (p[len(prefix) :] for p in found if p.startswith(prefix))
        return sorted(p for p in rel if not p.rsplit("/", 1)[-1].startswith(local.TEMP_PREFIX))

    # -- writing -------------------------------------------------------------------

    def write(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path`` atomically: readers see no object or all of it."""
        if self._is_local:
            with self.writer(path) as f:
                f.write(data)
            return
        fspath = self._fspath(path)
        self._retry(lambda: self.fs.pipe_file(fspath, bytes(data)), "write", path)
        self._forget_cached(path)

    @contextlib.contextmanager
    def writer(self, path: str) -> Iterator[IO[bytes]]:
        """An atomic streaming write; on an exception nothing becomes visible.

        Local: a ``.shardstream-tmp-*`` file next to the target, renamed on success.
        Remote: a ``shardstream-*`` temp file, uploaded in one go on success (s3fs uses
        a multipart upload for large files; an upload is retried as a whole).
        """
        fspath = self._fspath(path)
        if self._is_local:
            with local.atomic_writer(fspath) as f:
                yield f
            return

        def upload(tmp: str) -> None:
            self._retry(lambda: self.fs.put_file(tmp, fspath), "write", path)

        with spooled_writer(upload) as f:
            yield f
        self._forget_cached(path)

    def delete(self, path: str) -> None:
        """Remove ``path``; a missing one is fine."""
        fspath = self._fspath(path)
        if self._is_local:
            with contextlib.suppress(FileNotFoundError):
                os.remove(fspath)
            return

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(fspath)

        self._retry(remove, "delete", path)
        self._forget_cached(path)

    def _forget_cached(self, path: str) -> None:
        self._sizes_checked.pop(self._fspath(path), None)
        if self._cache is not None:
            self._cache.forget(self._cache_key(path))

    # -- manifest ------------------------------------------------------------------

    def read_manifest(self) -> Manifest:
        """The dataset's manifest (always read from storage, never from the cache)."""
        url = self.full_url(MANIFEST_NAME)
        try:
            data = self._read_direct(MANIFEST_NAME, None)
        except StorageError as error:
            if is_not_found(error):
                raise ManifestError(
                    f"no {MANIFEST_NAME} at {self.url}: not a shardstream dataset (run `shardstream index {self.url}`)",
                    url=url,
                ) from None
            raise
        return Manifest.from_json(data, url=url)

    def write_manifest(self, manifest: Manifest) -> None:
        """Write ``manifest.json`` atomically (do it last: it makes the folder a dataset)."""
        self.write(MANIFEST_NAME, manifest.to_json().encode())


def _rebuild(
    url: str, options: dict[str, Any], retry: RetryPolicy, cache_dir: str | None, cache_limit: int | None
) -> Storage:
    return Storage(url, options, retry=retry, cache_dir=cache_dir, cache_limit=cache_limit)
