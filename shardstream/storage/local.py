"""Fast paths for local files: exact ranged reads, atomic writes, recursive listing."""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from typing import IO

from shardstream.errors import StorageError
from shardstream.storage.expect import SizeChanged
from shardstream.types import ByteRange

__all__ = [
    "TEMP_PREFIX",
    "absolute_url",
    "atomic_writer",
    "check_inside",
    "file_kind",
    "fsync_path",
    "list_files",
    "map_range",
    "open_file",
    "on_read_only_mount",
    "open_regular",
    "read",
    "read_all",
    "read_range",
    "read_range_into",
    "remove_temp_files",
]

# In-flight files of ``atomic_writer`` start with this; ``list_files`` hides them.
TEMP_PREFIX = ".shardstream-tmp-"
# An in-flight file's name: the prefix, a random part, then its target's name (cut to 100).
_TEMP_RE = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]+-(.+)$")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_PREADV = getattr(os, "preadv", None)


# NOTE [ Only regular files ]
# Opening a FIFO for reading blocks until a writer comes, and a read of a character
# device (/dev/zero) never ends: a FIFO where a shard, sidecar or manifest should be
# would hang index, verify, inspect and streaming forever. So every local read opens
# with O_NONBLOCK (which returns at once for a FIFO), refuses anything that fstat does
# not call a regular file, and only then reads, in blocking mode again.
def open_regular(path: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file (a directory
    raises ``IsADirectoryError``, anything else not regular a ``StorageError``)."""
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"is a directory: {path}")
    raise StorageError(f"not a regular file ({file_kind(mode)}): refusing to read it", url=path)


_KINDS = {
    stat.S_IFREG: "a regular file",
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in words: "a FIFO", "a socket", ..."""
    return _KINDS.get(stat.S_IFMT(mode), f"mode {stat.filemode(mode)}")


# NOTE [ Writes stay inside the folder ]
# A dataset folder whose ``.shardstream`` is a symbolic link to another dataset's (a
# copy made with ``cp -s``, a link meant to share sidecars) would have a pack with
# ``overwrite`` replace the other dataset's manifest and sidecars, and its
# ``remove_temp_files`` sweep the other's temp files. So every write, delete and sweep
# in a local folder first resolves the folders between the root and its target: a link
# that leads outside the root, or a file where a folder must be, is refused, naming it,
# before anything changes. The root itself may be a link (the user named it), and so may
# the target (a rename replaces the link; a delete removes the link, not what it names).
def check_inside(root: str, path: str) -> None:
    """Raise ``StorageError`` unless writing ``path`` (below ``root``) stays inside ``root``:
    every folder between must be a folder, and a link among them must lead inside ``root``
    (NOTE [ Writes stay inside the folder ])."""
    real_root = os.path.realpath(root)
    folders = os.path.relpath(path, root).split(os.sep)[:-1]
    current = root
    for name in folders:
        current = os.path.join(current, name)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return  # made as a real folder by the write
        if stat.S_ISLNK(mode):
            target = os.path.realpath(current)
            if os.path.commonpath([target, real_root]) != real_root:
                raise StorageError(
                    f"{current} is a symbolic link to {target}, outside the dataset folder {root}: "
                    "shardstream writes only inside the folder it packs or indexes; replace the link "
                    "with a folder of its own (or remove it)",
                    url=current,
                )
            mode = os.stat(current).st_mode
        if not stat.S_ISDIR(mode):
            raise StorageError(
                f"{current} is {file_kind(mode)}, not a folder: shardstream keeps its manifest and "
                "sample indexes in a folder of that name; move the file away (or use another folder)",
                url=current,
            )


def _check_size(fd: int, size: int | None) -> None:
    if size is not None:
        actual = os.fstat(fd).st_size
        if actual != size:
            raise SizeChanged(actual)


def open_file(path: str, *, size: int | None = None) -> IO[bytes]:
    """``path`` (a regular file) open for buffered reading; ``size``: its expected size,
    another raises ``SizeChanged``."""
    fd = open_regular(path)
    try:
        _check_size(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")  # the caller closes it


def read(path: str, rng: ByteRange | None, *, size: int | None = None) -> bytes:
    """The whole file (``rng`` None) or ``read_range`` of ``rng``."""
    if rng is None:
        return read_all(path, size=size)
    return read_range(path, rng.start, rng.length, size=size)


def read_range(path: str, start: int, length: int, *, size: int | None = None) -> bytes:
    """Up to ``length`` bytes of ``path`` from ``start`` (fewer only at the end of the file).

    ``size``: the file's expected total size; another raises ``SizeChanged``.
    ``os.pread`` allocates the result once and the kernel copies straight into it, so
    a large range is read at raw-read speed with no extra copy; a second call is only
    needed when the kernel returns less than asked (over 2 GiB on Linux).
    """
    fd = open_regular(path)
    try:
        _check_size(fd, size)
        data = os.pread(fd, length, start)
        if len(data) == length or not data:
            return data
        parts, got = [data], len(data)
        while got < length:
            chunk = os.pread(fd, length - got, start + got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_range_into(path: str, start: int, out: memoryview, *, size: int | None = None) -> int:
    """``len(out)`` bytes of ``path`` from ``start`` into ``out``: the bytes written (fewer
    only at the end of the file). ``size``: the file's expected total size; another raises
    ``SizeChanged``. A copy, as ``read_range``'s, into a buffer the caller chose (NOTE
    [ Read buffers ] in sinks.py says why a long read's buffer is not a new ``bytes``)."""
    fd = open_regular(path)
    try:
        _check_size(fd, size)
        got, length = 0, len(out)
        while got < length:
            if _PREADV is None:  # no preadv (Windows): one more copy
                data = os.pread(fd, length - got, start + got)
                n = len(data)
                out[got : got + n] = data
            else:
                n = _PREADV(fd, [out[got:]], start + got)
            if not n:
                break
            got += n
        return got
    finally:
        os.close(fd)


def read_all(path: str, *, size: int | None = None) -> bytes:
    """The whole file; unbuffered, so the result is sized by fstat and filled in place.

    ``size``: the file's expected size; another raises ``SizeChanged``.
    """
    fd = open_regular(path)
    with open(fd, "rb", buffering=0) as f:
        _check_size(fd, size)
        return f.readall()


@contextlib.contextmanager
def atomic_writer(path: str, *, durable: bool = True) -> Iterator[IO[bytes]]:
    """Write ``path`` so that readers see no file or the whole file, never part of it.

    Bytes go to a temp file in the same directory (same file system, so the final
    ``os.replace`` is atomic); on an exception the temp file is removed and ``path`` is
    untouched. With ``durable`` the file is fsynced before the rename, so a crash cannot
    leave an empty file under the final name. ``durable=False`` renames without it: the
    file is still whole for readers, and the caller must ``fsync_path`` it (and its
    directory) before anything that relies on it surviving a crash is written. The pack
    does so before the manifest: see NOTE [ Durable before the manifest ] in
    ``shardstream.pack.durable``.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    base = os.path.basename(path)[:100]
    tmp = os.path.join(directory, f"{TEMP_PREFIX}{secrets.token_hex(6)}-{base}")
    # 0o666 and the process umask, as a plain open() would give (mkstemp gives 0o600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_temp_files(root: str, ours: Callable[[str], bool]) -> None:
    """Delete the files that ``atomic_writer`` left in ``root`` (not below) when its process
    died, where ``ours(target name)`` says they are the caller's; other processes may be
    writing theirs. A target name longer than 100 characters is seen cut to 100."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        match = _TEMP_RE.match(name)
        if match and ours(match.group(1)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))


def map_range(path: str, rng: ByteRange, url: str, *, size: int | None = None) -> memoryview:
    """The bytes of ``rng`` of the file ``path``, memory-mapped (read ahead, not copied).

    Only for files that are never truncated in place (the shard cache's entries, files
    on a read-only mount, or where the user says so): a mapped file cut short kills the
    process with SIGBUS on first touch (NOTE [ Getting the bytes ] in
    shardstream/dataset/fetch.py). ``size``: the file's expected size; another raises
    ``SizeChanged``.
    """
    with open(open_regular(path), "rb") as f:  # NOTE [ Only regular files ]
        fd = f.fileno()
        _check_size(fd, size)
        size = os.fstat(fd).st_size
        if size < rng.end:
            raise StorageError(
                f"bytes [{rng.start}, {rng.end}) are past the end of the file ({size} bytes)",
                url=url,
                offset=rng.start,
            )
        base = rng.start - rng.start % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, rng.end - base, offset=base, access=mmap.ACCESS_READ)
    mapped.madvise(mmap.MADV_WILLNEED)  # read ahead now, in the prefetch thread's time
    return memoryview(mapped)[rng.start - base :]


def on_read_only_mount(path: str) -> bool:
    """Whether ``path`` lies on a file system mounted read-only (no file on it can be
    truncated in place, so mapping its files is safe); False where it cannot be told."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        return False


def split_protocol(url: str) -> tuple[str | None, str]:
    """(protocol, path) of a URL, as ``fsspec.core.split_protocol`` splits it.

    Here so that local paths never import fsspec (and its asyncio), a noticeable share of a
    CLI command's start.
    """
    if "://" in url:
        protocol, path = url.split("://", 1)
        if len(protocol) > 1:  # not a Windows drive letter
            return protocol, path
    if url.startswith("data:"):
        protocol, path = url.split(":", 1)
        return protocol, path
    return None, url


def is_local_url(url: str) -> bool:
    """Whether ``url`` is a local path (plain, ``file://`` or ``local://``)."""
    return split_protocol(url)[0] in (None, "file", "local")


def local_path(url: str) -> str:
    """The absolute path of a local URL (plain, ``file://``, ``local://``; ``~`` expanded)."""
    for prefix in ("file://", "local://", "file:", "local:"):
        if url.startswith(prefix):
            url = url[len(prefix) :]
            break
    return os.path.abspath(os.path.expanduser(url))


def absolute_url(url: str) -> str:
    """A local URL as its absolute path (so one folder has one name), any other unchanged."""
    return os.path.abspath(local_path(url)) if is_local_url(url) else url


def fsync_path(path: str) -> None:
    """Flush a file's data (or a directory's entries: renames) to stable storage."""
    flags = os.O_RDONLY | _O_CLOEXEC | (_O_DIRECTORY if os.path.isdir(path) else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_files(root: str) -> list[str]:
    """Every file under ``root`` (recursive) as sorted '/'-separated relative paths."""
    found = []
    for directory, _dirs, names in os.walk(root):
        rel = os.path.relpath(directory, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        found += [prefix + name for name in names if not name.startswith(TEMP_PREFIX)]
    return sorted(found)
