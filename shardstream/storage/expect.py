"""What the manifest says an object is, checked on every read (``Expected``).

# NOTE [ Reads check the manifest ]
# A dataset's shards are never rewritten in place by shardstream, but a user may run
# ``pack --overwrite`` into the same folder, swap a file, or truncate one. Two rules keep
# a reader from serving another dataset's bytes under this manifest:
# - Every read given an ``Expected`` checks the object's total size: a local file's
#   fstat, a ranged S3 GET's ``Content-Range: bytes a-b/TOTAL``, a whole GET's
#   ``Content-Length`` (a HEAD on the fsspec path). A mismatch is a permanent
#   ``StorageError`` ("changed since the manifest was written"), never retried.
# - The shard cache keys an entry by the object's content (the shard's sha256; a
#   sidecar by its shard's sha256, its path and its size, as the manifest holds no hash
#   of its own), so an overwritten dataset never hits the old one's entries, and a
#   downloaded shard is checked before it is kept: by its sidecar's CRC-32 where the
#   reader knows it, else by the manifest's sha256 (NOTE [ Filling the cache ]).
#
# NOTE [ One size check per object ]
# Only the fsspec path (not s3://, not local files) has no total size in its responses,
# so there the size costs a HEAD. It is asked once per object and process (a fork asks
# again, and a write or delete through the Storage forgets it), before the first ranged
# read; later ranged reads rely on the sidecar's block CRCs, which a reader checks on
# every range. A whole read is checked by its length: a shorter body is a HEAD then,
# and if the object still has the manifest's size the transfer was cut (transient,
# retried), else the object changed (permanent).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shardstream.errors import StorageError, TransientStorageError
from shardstream.types import ByteRange

__all__ = [
    "Expected",
    "SizeChanged",
    "changed_error",
    "short_read",
    "short_whole_read",
    "size_changed_error",
]


@dataclass(frozen=True, slots=True)
class Expected:
    """An object as the manifest describes it.

    ``size``: its total size in bytes (None: not known, not checked). ``sha256``: its
    content hash (hex), if known: checked when the cache downloads it, unless ``crc32``
    gives the CRC-32 of its bytes by then (a shard whose sidecar is loaded, NOTE
    [ Filling the cache ]). ``version``: what identifies its content for the cache when
    it has no hash of its own (a sidecar: its shard's sha256).
    """

    size: int | None
    sha256: str = ""
    version: str = ""
    crc32: Callable[[], int | None] | None = field(default=None, compare=False)

    @property
    def content_key(self) -> str:
        return f"{self.size}|{self.sha256}|{self.version}"


class SizeChanged(Exception):
    """The object's total size is ``actual``, not the expected one (``Storage`` names it)."""

    def __init__(self, actual: int) -> None:
        super().__init__(actual)
        self.actual = actual


def changed_error(url: str, shard: str, what: str, *, offset: int | None = None) -> StorageError:
    """The permanent error for an object that is not what the manifest says."""
    return StorageError(
        f"{what}: changed since the manifest was written (was the dataset packed again? "
        "open it again to read its new manifest)",
        url=url,
        shard=shard,
        offset=offset,
    )


def size_changed_error(
    url: str, shard: str, rng: ByteRange | None, actual: int, expected: int | None
) -> StorageError:
    """``changed_error`` for an object of ``actual`` bytes that the manifest says has ``expected``."""
    start, end = (rng.start, rng.end) if rng is not None else (0, expected or 0)
    if actual < end:
        what = f"bytes [{start}, {end}) are past the end of the object ({actual} bytes, the manifest says {expected})"
    else:
        what = f"the object has {actual} bytes, the manifest says {expected}"
    return changed_error(url, shard, what, offset=start)


def short_whole_read(size_now: Callable[[], int], url: str, got: int, size: int) -> None:
    """A whole read of ``got`` bytes of an object the manifest says has ``size``: an
    object of another size (``SizeChanged``), or (it still has ``size`` bytes) a cut
    transfer (transient)."""
    actual = size_now()
    if actual != size:
        raise SizeChanged(actual)
    raise TransientStorageError(f"short read: {got} of {size} bytes", url=url)


def short_read(
    size_now: Callable[[], int], url: str, path: str, rng: ByteRange, got: int, expected: int | None
) -> None:
    """A ranged read of ``got`` bytes, fewer than ``rng`` asked: the object changed, the
    range is past its end (both permanent), or the transfer was cut (transient)."""
    size = size_now()
    if expected is not None and size != expected:
        raise size_changed_error(url, path, rng, size, expected)
    where = f"bytes [{rng.start}, {rng.end})"
    if size < rng.end:  # no retry will make the object longer
        raise StorageError(
            f"{where} are past the end of the object ({size} bytes)", url=url, offset=rng.start
        )
    raise TransientStorageError(f"short read: {got} of {rng.length} {where}", url=url)
