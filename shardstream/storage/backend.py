"""Storage backends: one class per kind of storage, chosen once when a ``Storage`` is made.

# NOTE [ One backend per Storage ]
# ``Storage`` keeps what every kind of storage shares: paths relative to the dataset
# folder, retries (NOTE [ One retry layer ] in retry.py), the manifest's size checks
# (expect.py) and the shard cache. A backend does the I/O of one kind of storage, on
# paths as that kind spells them (an absolute local path, ``bucket/key``), and tries
# each operation once. ``backend_for`` picks the backend from the URL, once:
# - ``LocalBackend``: local files through the fast paths of ``local``: pread copies
#   (not mappings: see NOTE [ Getting the bytes ] in shardstream/dataset/fetch.py),
#   NOTE [ Only regular files ], atomic renames, an fsync unless the caller defers it;
# - ``S3Backend``: s3fs for writes, listing and HEAD, botocore for object reads (NOTE
#   [ S3 reads without s3fs ] in s3read.py);
# - ``FsspecBackend``: any other fsspec file system.
# Code outside ``storage`` asks a Storage for a capability (``needs_sync``,
# ``local_files``, ``local_root``) and never whether a URL is local.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import IO, Any, ClassVar, cast

from shardstream.errors import UsageError
from shardstream.lifecycle import after_fork_in_child, live_finalizers, this_process
from shardstream.storage import local
from shardstream.storage.expect import SizeChanged
from shardstream.storage.s3read import S3Reader, s3_options, timeouts_of
from shardstream.storage.streams import Body, spooled_writer
from shardstream.types import ByteRange

__all__ = ["Backend", "FsspecBackend", "LocalBackend", "Retried", "S3Backend", "backend_for"]

_S3_PROTOCOLS = ("s3", "s3a")
_ABANDONED: list[Any] = []  # file systems made by a parent process; see NOTE [ Storage across processes ]
# How a backend has an operation retried by its Storage (uploads are retried whole).
Retried = Callable[[Callable[[], None]], None]


def _leave_parent_sessions() -> None:
    """In a fork child: the parent's file systems that hold a session, with the finalizer
    registered to close it (``close_session(loop, ...)`` with the parent's event loop:
    s3fs's; gcsfs registers one of the same shape), are kept in ``_ABANDONED`` and their
    finalizers detached: the sessions are the parent's (NOTE [ Storage across processes ]
    in core.py). Collected in the child, such a file system ran s3fs's finalizer, which
    asks that loop's thread (the child has none) to close the session and waits a whole
    second (fsspec's ``sync`` polls by the second): a stall of any thread that triggered
    the collection, a DataLoader worker's decoding among them. Without the finalizer,
    aiohttp would log the session as unclosed instead, hence kept, never collected."""
    asyncio = sys.modules.get("asyncio")  # not imported: no event loop, no such finalizer
    if asyncio is None:
        return
    for finalizer, info in live_finalizers():
        on_loop = bool(info.args) and isinstance(info.args[0], asyncio.AbstractEventLoop)
        if on_loop and getattr(info.func, "__name__", "") == "close_session":
            held = finalizer.peek()
            if held is not None:
                _ABANDONED.append(held[0])
            finalizer.detach()


after_fork_in_child(_leave_parent_sessions)


class Backend:
    """What one kind of storage does, each operation tried once (``Storage`` retries).

    Every backend can give an fsspec file system of its protocol (``fs``), made per
    process (NOTE [ Storage across processes ] in core.py); the methods below use it
    only where no faster path exists.
    """

    # Whether reads come from local files, so a whole-object read costs no request.
    is_local: ClassVar[bool] = False
    # Whether a written file needs ``sync`` to survive a crash (object stores: no).
    needs_sync: ClassVar[bool] = False
    # Whether ``stream`` gives a GET's body to read as it arrives (NOTE [ Reads in parts ]).
    streams: bool = False

    def timeouts(self) -> str:
        """Each try's own bounds, in words, for an error after a timeout."""
        return ""

    def __init__(self, protocol: str, options: Mapping[str, Any]) -> None:
        self._protocol = protocol
        self._options = dict(options)
        self._fs: Any = None
        self._fs_pid = -1

    def fs_options(self) -> dict[str, Any]:
        return dict(self._options)

    @property
    def fs(self) -> Any:
        """This process's fsspec file system (made on first use, remade after fork)."""
        fs, pid = self._fs, this_process()
        if fs is None or self._fs_pid != pid:
            if fs is not None:
                _ABANDONED.append(fs)
            import fsspec

            fs = self._made(fsspec.filesystem(self._protocol, skip_instance_cache=True, **self.fs_options()))
            self._fs, self._fs_pid = fs, pid
        return fs

    def _made(self, fs: Any) -> Any:
        return fs

    def read(self, fspath: str, rng: ByteRange | None, size: int | None) -> bytes:
        """The object, or up to ``rng.length`` bytes of it; ``size``: its expected total
        size, another raises ``SizeChanged``."""
        raise NotImplementedError

    def read_into(self, fspath: str, rng: ByteRange, out: memoryview, size: int | None) -> int:
        """``read`` of ``rng`` into ``out``; the bytes written (fewer where the object ends)."""
        data = self.read(fspath, rng, size)
        out[: len(data)] = data
        return len(data)

    def stream(self, fspath: str, rng: ByteRange | None, size: int | None) -> Body:
        """One GET of ``rng`` (None: a plain GET of the whole object) whose body is read in
        order with ``readinto`` and then closed; only where ``streams`` is True."""
        raise NotImplementedError

    def latency(self) -> float | None:
        """Seconds a GET takes to answer here, as this process's last ones did (None where
        not measured; NOTE [ A link's latency before its reads ] in cuts.py)."""
        return None

    def size(self, fspath: str) -> int:
        raise NotImplementedError

    def kind(self, fspath: str) -> str:
        """``"folder"`` or ``"file"``; ``FileNotFoundError`` where nothing is."""
        raise NotImplementedError

    def open_direct(self, fspath: str, size: int | None) -> IO[bytes] | None:
        """A file object where one opens cheaply (local files); None: ``Storage`` streams
        the object by ranged reads instead."""
        return None

    def map(self, fspath: str, rng: ByteRange, url: str, size: int | None = None) -> memoryview:
        """The bytes of ``rng`` mapped, not copied (local files only); ``size``: the
        file's expected size, another raises ``SizeChanged``."""
        raise UsageError("only local files can be memory-mapped", url=url)

    def read_only_mount(self, fspath: str) -> bool:
        """Whether ``fspath`` is a local file on a read-only mount (mapping it is safe)."""
        return False

    def find(self, root: str) -> list[str]:
        """Every file under ``root`` as sorted relative paths, temp files hidden."""
        raise NotImplementedError

    def find_sizes(self, root: str) -> list[tuple[str, int]]:
        """(relative path, size) of every file under ``root``, in no particular order."""
        raise NotImplementedError

    def write(self, fspath: str, data: bytes, *, durable: bool, retried: Retried) -> None:
        with self.writer(fspath, durable=durable, retried=retried) as f:
            f.write(data)

    def writer(self, fspath: str, *, durable: bool, retried: Retried) -> AbstractContextManager[IO[bytes]]:
        """An atomic streaming write; ``durable=False``: the caller ``sync``s it later."""
        raise NotImplementedError

    def delete(self, fspath: str) -> None:
        """Remove ``fspath``; a missing one is fine."""
        raise NotImplementedError

    def confine(self, root: str, fspath: str) -> None:
        """Raise unless a write of ``fspath`` stays inside ``root`` (only local folders have links)."""

    def sweep_temp(self, root: str, ours: Callable[[str], bool]) -> None:
        """Remove the temp files of writes that died, at the top of ``root``, whose target
        name ``ours`` accepts (only where in-flight writes live in the folder)."""

    def sync(self, fspath: str) -> None:
        """Make a written file (or a folder's renames) durable; ``OSError`` if that fails."""

    def forget(self, fspath: str) -> None:
        """Drop what this process remembers of ``fspath`` (it was written or deleted)."""

    def close(self) -> None:
        """Release this process's connections (a parent's are left alone)."""
        fs, self._fs = self._fs, None
        if fs is None:
            return
        if self._fs_pid != this_process():  # the parent's: never close it here
            _ABANDONED.append(fs)
            return
        creator = getattr(fs, "_s3creator", None)
        if creator is not None and getattr(fs, "_s3", None) is not None:
            with contextlib.suppress(Exception):
                type(fs).close_session(fs.loop, creator)
            fs._s3 = None


class LocalBackend(Backend):
    """Local files: pread copies, regular files only, atomic renames (see ``local``)."""

    is_local = True
    needs_sync = True

    def read(self, fspath: str, rng: ByteRange | None, size: int | None) -> bytes:
        return local.read(fspath, rng, size=size)

    def read_into(self, fspath: str, rng: ByteRange, out: memoryview, size: int | None) -> int:
        return local.read_range_into(fspath, rng.start, out[: rng.length], size=size)

    def size(self, fspath: str) -> int:
        return os.stat(fspath).st_size

    def kind(self, fspath: str) -> str:
        # os.stat follows links, and raises FileNotFoundError where nothing is
        return "folder" if stat.S_ISDIR(os.stat(fspath).st_mode) else "file"

    def open_direct(self, fspath: str, size: int | None) -> IO[bytes]:
        return local.open_file(fspath, size=size)

    def map(self, fspath: str, rng: ByteRange, url: str, size: int | None = None) -> memoryview:
        return local.map_range(fspath, rng, url, size=size)

    def read_only_mount(self, fspath: str) -> bool:
        return local.on_read_only_mount(fspath)

    def find(self, root: str) -> list[str]:
        return local.list_files(root)

    def find_sizes(self, root: str) -> list[tuple[str, int]]:
        return [(rel, os.stat(os.path.join(root, rel)).st_size) for rel in local.list_files(root)]

    def writer(self, fspath: str, *, durable: bool, retried: Retried) -> AbstractContextManager[IO[bytes]]:
        return local.atomic_writer(fspath, durable=durable)

    def delete(self, fspath: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(fspath)

    def confine(self, root: str, fspath: str) -> None:
        local.check_inside(root, fspath)  # NOTE [ Writes stay inside the folder ] in local.py

    def sweep_temp(self, root: str, ours: Callable[[str], bool]) -> None:
        local.remove_temp_files(root, ours)

    def sync(self, fspath: str) -> None:
        local.fsync_path(fspath)


class FsspecBackend(Backend):
    """Any fsspec file system; made lazily per process (NOTE [ Storage across processes ])."""

    def __init__(self, protocol: str, options: Mapping[str, Any]) -> None:
        super().__init__(protocol, options)
        self._sizes: dict[str, int] = {}
        self._sizes_pid = -1

    def read(self, fspath: str, rng: ByteRange | None, size: int | None) -> bytes:
        # fsspec's cat_file does not say the object's size, so a ranged read asks (a HEAD),
        # once per path and process: NOTE [ One size check per object ]. A whole read is
        # checked by its length instead (RetriedIO.read_once in retried.py).
        if rng is None:
            return bytes(self.fs.cat_file(fspath))
        if size is not None and self._sizes_checked.get(fspath) != size:
            actual = self.size(fspath)
            if actual != size:
                raise SizeChanged(actual)
            self._sizes_checked[fspath] = size
        return bytes(self.fs.cat_file(fspath, start=rng.start, end=rng.end))

    @property
    def _sizes_checked(self) -> dict[str, int]:
        """The objects whose size this process checked, and that size (reset after fork)."""
        pid = this_process()
        if self._sizes_pid != pid:
            self._sizes, self._sizes_pid = {}, pid
        return self._sizes

    def size(self, fspath: str) -> int:
        self.fs.invalidate_cache(fspath)  # another process may have written it since
        return int(self.fs.info(fspath)["size"])

    def kind(self, fspath: str) -> str:
        if self.fs.isdir(fspath):
            return "folder"
        self.fs.info(fspath)  # FileNotFoundError where nothing is
        return "file"

    def find(self, root: str) -> list[str]:
        self.fs.invalidate_cache(root)
        prefix = root + "/"
        rel = (p[len(prefix) :] for p in self.fs.find(root, withdirs=False) if p.startswith(prefix))
        return sorted(p for p in rel if not p.rsplit("/", 1)[-1].startswith(local.TEMP_PREFIX))

    def find_sizes(self, root: str) -> list[tuple[str, int]]:
        self.fs.invalidate_cache(root)
        found = self.fs.find(root, withdirs=False, detail=True)
        prefix = root + "/"
        return [
            (path[len(prefix) :], int(info["size"]))
            for path, info in found.items()
            if path.startswith(prefix) and info.get("type") == "file"
        ]

    def write(self, fspath: str, data: bytes, *, durable: bool, retried: Retried) -> None:
        retried(lambda: self.fs.pipe_file(fspath, bytes(data)))

    @contextlib.contextmanager
    def writer(self, fspath: str, *, durable: bool, retried: Retried) -> Iterator[IO[bytes]]:
        # Spooled outside the dataset and uploaded in one go; an object is durable once
        # its upload returns, so ``durable`` changes nothing here.
        def upload(tmp: str) -> None:
            retried(lambda: self.fs.put_file(tmp, fspath))

        with spooled_writer(upload) as f:
            yield f

    def delete(self, fspath: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(fspath)

    def forget(self, fspath: str) -> None:
        self._sizes_checked.pop(fspath, None)


class S3Backend(FsspecBackend):
    """s3:// through s3fs, but object reads through botocore where the options allow."""

    def __init__(self, protocol: str, options: Mapping[str, Any]) -> None:
        super().__init__(protocol, options)
        # See NOTE [ S3 reads without s3fs ]: None where only s3fs honours the options.
        self.reader = S3Reader.create(self._options)
        self.streams = self.reader is not None

    def timeouts(self) -> str:
        return timeouts_of(self._options)

    def fs_options(self) -> dict[str, Any]:
        # The endpoint from the environment, and one try in botocore: see s3_options.
        return s3_options(self._options)

    def _made(self, fs: Any) -> Any:
        # s3fs's own retry loop (a class attribute, not an option): one try, see
        # NOTE [ One retry layer ] in retry.py.
        fs.retries = 1
        return fs

    def read(self, fspath: str, rng: ByteRange | None, size: int | None) -> bytes:
        if self.reader is None:
            return super().read(fspath, rng, size)
        bucket, _, key = fspath.partition("/")
        return self.reader.read(bucket, key, rng, size=size)

    def read_into(self, fspath: str, rng: ByteRange, out: memoryview, size: int | None) -> int:
        if self.reader is None:
            return super().read_into(fspath, rng, out, size)
        bucket, _, key = fspath.partition("/")
        return self.reader.read_into(bucket, key, rng, out, size=size)

    def stream(self, fspath: str, rng: ByteRange | None, size: int | None) -> Body:
        bucket, _, key = fspath.partition("/")
        return cast(S3Reader, self.reader).stream(bucket, key, rng, size=size)

    def latency(self) -> float | None:
        return self.reader.latency() if self.reader is not None else None

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        super().close()


# Protocols whose URL, with a slash or two lost (``s3:/bucket``, or ``s3://`` once a
# trailing slash is stripped: ``s3:``), would read as a local folder named ``s3:``.
_REMOTE_SCHEMES = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "hf", "http", "https", "memory"}
)


def _refuse_lost_slashes(url: str) -> None:
    """Refuse a local path that is a remote URL with its slashes lost, naming it."""
    scheme, colon, rest = url.partition(":")
    if colon and scheme.lower() in _REMOTE_SCHEMES and not rest.startswith("//"):
        bucket = rest.strip("/")
        what = "names no bucket or folder" if not bucket else f"has one slash: {scheme}://{bucket}?"
        raise UsageError(
            f"{url!r} looks like a {scheme}:// URL that {what} (give one like {scheme}://bucket/dataset; "
            f"a local folder named {scheme}: is ./{url})",
            url=url,
        )


def backend_for(url: str, options: Mapping[str, Any]) -> tuple[Backend, str, str]:
    """The backend of ``url``, the folder's path as it spells paths, and the folder's URL."""
    protocol, path = local.split_protocol(url)
    if local.is_local_url(url):
        _refuse_lost_slashes(url)
        root = os.path.abspath(os.path.expanduser(path))
        return LocalBackend("file", options), root, root if protocol is None else f"file://{root}"
    if protocol in _S3_PROTOCOLS:
        # s3fs's _strip_protocol (fsspec's own), without importing s3fs: with aiobotocore and
        # aiohttp that is 1-2 s of a new process's start (a spawned DataLoader worker's),
        # and reads through botocore never use it (NOTE [ S3 reads without s3fs ]).
        root = path.rstrip("/")
    else:
        import fsspec  # not for local folders: see local.split_protocol

        protocol = protocol or "file"
        try:
            fs_class = fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError) as error:
            raise UsageError(f"unsupported storage URL: {error}", url=url) from None
        root = str(fs_class._strip_protocol(url)).rstrip("/")
    if not root.strip("/"):
        what = "bucket" if protocol in _S3_PROTOCOLS else "folder"
        raise UsageError(f"the URL names no {what} (give one like s3://bucket/dataset)", url=url)
    backend = S3Backend(protocol, options) if protocol in _S3_PROTOCOLS else FsspecBackend(protocol, options)
    return backend, root, url.rstrip("/")
