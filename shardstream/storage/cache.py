"""A local disk cache of whole shards, shared safely by processes, evicting LRU.

# NOTE [ Shard cache ]
# The first read of any byte range of an object downloads the whole object into
# ``cache_dir``; later reads slice the local copy. Rules that keep it safe:
# - Atomic: a download goes to ``.sscache-tmp-*`` in the cache dir, is checked against
#   the object's size, and is renamed into place, so no reader (in any process) ever
#   sees a half file. A per-entry ``flock`` makes concurrent processes wait for one
#   download instead of repeating it; correctness never depends on the lock, only on
#   the rename.
# - Tolerant: an entry can vanish (another process evicted it) between lookup and open;
#   the reader then downloads it again.
# - Validated: the first use of an entry in a process compares its size with the
#   object's (one HEAD); a stale or wrong-size copy is replaced. An entry whose bytes
#   fail a reader's check later (a flipped bit on disk, a file swapped for another) is
#   dropped by that reader and fetched again, once (NOTE [ Healing the cache ] in
#   shardstream/dataset/heal.py).
# - Full disk: an OSError while writing an entry (ENOSPC, EDQUOT, EIO) is a StorageError
#   naming the cache directory and the object (``disk_error``; the caller's download
#   raises it for its writes); the temp file goes, as on any failure.
# - LRU: every hit bumps the entry's mtime (visible to all processes; atime is often
#   disabled), and after each download the oldest entries go until the total is under
#   ``limit``. The entry just downloaded is kept even if it alone is over the limit.
# - Owned files only: the cache marks its directory with ``MARKER`` and only ever
#   deletes files named by its own scheme (``sscache-<40 hex>``, their ``.lock`` and
#   its own temp files); anything else in the directory is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator

from shardstream.errors import StorageError, TransientStorageError, UsageError

__all__ = ["MARKER", "ShardCache"]

MARKER = ".shardstream-cache"
_ENTRY = re.compile(r"sscache-[0-9a-f]{40}")
_TEMP_PREFIX = ".sscache-tmp-"
_STALE_TEMP_SECONDS = 24 * 3600  # a temp file this old belongs to a crashed download
_MARKER_TEXT = (
    "This directory is a shardstream shard cache. Files named sscache-* are managed by\n"
    "shardstream and may be deleted at any time; other files are never touched.\n"
)


class ShardCache:
    """Whole objects cached under ``directory``, at most ``limit`` bytes (None: no limit)."""

    def __init__(self, directory: str, limit: int | None = None) -> None:
        if limit is not None and limit < 0:
            raise UsageError(f"cache_limit must be >= 0 bytes, not {limit}")
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.limit = limit
        self._sizes: dict[str, int] = {}  # entry name -> object size, checked in this process
        try:
            os.makedirs(self.directory, exist_ok=True)
            marker = os.path.join(self.directory, MARKER)
            if not os.path.exists(marker):
                with open(marker, "w") as f:
                    f.write(_MARKER_TEXT)
        except OSError as error:
            raise StorageError(f"cannot use cache directory: {error}", url=self.directory) from error

    def entry_path(self, key: str, content: str = "") -> str:
        """Where the cached copy of the object named ``key`` lives (it may not exist):
        one entry per ``content`` (what identifies the object's bytes, if known)."""
        return os.path.join(self.directory, f"{_object_prefix(key)}{_digest(f'{key}|{content}', 20)}")

    def fetch(
        self,
        key: str,
        size: Callable[[], int],
        download: Callable[[str, int], None],
        *,
        url: str | None = None,
        content: str = "",
    ) -> str:
        """The path of a complete local copy of ``key``, downloading it if needed.

        ``size()`` gives the object's size (asked once per entry and process);
        ``download(temp_path, size)`` writes the whole object to ``temp_path``; ``url``
        names the object in errors (else ``key``); ``content`` as for ``entry_path``.
        """
        path = self.entry_path(key, content)
        name = os.path.basename(path)
        expected = self._sizes.get(name)
        if expected is None:
            expected = size()
        if self._is_complete(path, expected):
            self._sizes[name] = expected
            return path
        try:
            with self._entry_lock(path):
                if not self._is_complete(path, expected):  # another process may have just done it
                    self._download(path, expected, download, url or key)
        except _CacheDiskError as error:
            raise self.disk_error(error.error, url or key) from error.error
        self._sizes[name] = expected
        self.evict(keep=path)
        return path

    def disk_error(self, error: OSError, url: str) -> StorageError:
        """The error for a failed write of the cache's own files (full disk, quota...)."""
        return StorageError(
            f"cannot write the shard cache in {self.directory}: {error.strerror or error}"
            " (free space there, set cache_limit, or use another cache_dir)",
            url=url,
        )

    def forget(self, key: str) -> None:
        """Drop every cached copy of ``key``, whatever its content (after the object was
        deleted or rewritten)."""
        prefix = _object_prefix(key)
        try:
            with os.scandir(self.directory) as scan:
                names = [e.name for e in scan if e.name.startswith(prefix) and _ENTRY.fullmatch(e.name)]
        except FileNotFoundError:
            return
        for name in names:
            self._sizes.pop(name, None)
            for victim in (name, name + ".lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, victim))

    def drop(self, key: str, content: str = "") -> str:
        """Delete the entry of ``key`` for ``content`` (one that failed a check, say), if it
        is there (another process may have evicted it); its path. The next ``fetch``
        downloads it again."""
        path = self.entry_path(key, content)
        self._sizes.pop(os.path.basename(path), None)
        for victim in (path, path + ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(victim)
        return path

    def _is_complete(self, path: str, expected: int) -> bool:
        try:
            actual = os.stat(path).st_size
        except FileNotFoundError:
            return False
        if actual != expected:
            return False
        _touch(path)  # LRU: a hit makes the entry the newest
        return True

    def _download(self, path: str, expected: int, download: Callable[[str, int], None], key: str) -> None:
        tmp = os.path.join(self.directory, f"{_TEMP_PREFIX}{secrets.token_hex(8)}")
        try:
            download(tmp, expected)
            got = os.path.getsize(tmp)
            if got != expected:
                raise TransientStorageError(f"cache download got {got} of {expected} bytes", url=key)
            try:
                os.replace(tmp, path)
            except OSError as error:
                raise _CacheDiskError(error) from error
            _touch(path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    @contextlib.contextmanager
    def _entry_lock(self, path: str) -> Iterator[None]:
        try:
            fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as error:
            raise _CacheDiskError(error) from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def evict(self, keep: str | None = None) -> None:
        """Delete least-recently-used entries until the cache is within its limit."""
        if self.limit is None or not os.path.exists(os.path.join(self.directory, MARKER)):
            return
        entries = []
        now = time.time()
        with os.scandir(self.directory) as scan:
            for entry in scan:
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if _ENTRY.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    entries.append((stat.st_mtime_ns, entry.path, stat.st_size))
                elif entry.name.startswith(_TEMP_PREFIX) and now - stat.st_mtime > _STALE_TEMP_SECONDS:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        total = sum(size for _, _, size in entries)
        for _, path, size in sorted(entries):
            if total <= self.limit:
                break
            if path == keep:
                continue
            for victim in (path, path + ".lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(victim)
            self._sizes.pop(os.path.basename(path), None)
            total -= size

    def total_bytes(self) -> int:
        """Bytes held by cache entries now (all processes)."""
        total = 0
        with os.scandir(self.directory) as scan:
            for entry in scan:
                if _ENTRY.fullmatch(entry.name):
                    with contextlib.suppress(FileNotFoundError):
                        total += entry.stat(follow_symlinks=False).st_size
        return total


class _CacheDiskError(Exception):
    """An OSError of the cache's own files, on its way to ``disk_error``."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _object_prefix(key: str) -> str:
    # An entry's name starts with its object's digest, so ``forget`` finds every content
    # cached of one object; the rest is the content's (still ``sscache-<40 hex>``).
    return f"sscache-{_digest(key, 20)}"


def _touch(path: str) -> None:
    # The kernel stamps mtimes from a coarse clock (ticks of ms); time_ns() is finer,
    # so two uses in quick succession still order correctly for LRU.
    now = time.time_ns()
    with contextlib.suppress(FileNotFoundError):
        os.utime(path, ns=(now, now))
