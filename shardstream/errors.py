"""Every error shardstream raises derives from :class:`ShardstreamError`.

Each error carries what a user needs to find the problem: the URL, the shard, the
byte offset or the line, whichever apply. ``str(error)`` shows them.
"""

from __future__ import annotations

import reprlib

__all__ = [
    "FormatError",
    "KeyNotFoundError",
    "ManifestError",
    "MissingDependencyError",
    "NotADatasetError",
    "PackError",
    "PlanError",
    "ShardstreamError",
    "StateError",
    "StorageError",
    "TransientStorageError",
    "UsageError",
    "shown",
]

# NOTE [ Names in error messages ]
# Keys and member names come from the data, and a hostile tar can carry a name of a
# megabyte (a GNU long-name or PAX header). An error shows ``shown(name)``: its repr, cut
# to the first _SHOWN characters and the name's length. As a last guard a message longer
# than _MAX_MESSAGE keeps its head and tail, so no error ever carries a whole such name.
# ``shard`` and ``url`` come from the data too (a manifest entry's path): one longer than
# _MAX_LOCATION becomes ``shown(value, _SHOWN_LOCATION)``, short enough not to be cut
# again when the error is rebuilt in another process.
_SHOWN = 200
_MAX_MESSAGE = 4096
_MAX_LOCATION = 1024
_SHOWN_LOCATION = 960
_CONTAINERS = reprlib.Repr()  # bounded depth and items; strings inside cut by ``shown``'s limit
_CONTAINERS.maxstring = _CONTAINERS.maxother = _SHOWN


def shown(name: object, limit: int = _SHOWN) -> str:
    """``repr(name)`` for an error message, cut after ``limit`` characters (see NOTE above).

    Safe for any value, hostile ones too: a container is shown a few levels and items
    deep (a plain ``repr`` of a 100k-deep list recurses past the limit), an integer of
    thousands of digits by its length (``str`` refuses it past 4300 digits).
    """
    if isinstance(name, int) and name.bit_length() > 4 * max(limit, 64):
        return f"a number of about {name.bit_length() * 30103 // 100000 + 1} digits"
    text = repr(name) if isinstance(name, (str, bytes, bytearray, int, float)) else _CONTAINERS.repr(name)
    if len(text) <= limit:
        return text
    if isinstance(name, (bytes, bytearray)):
        return f"{text[:limit]}... ({len(name)} bytes)"
    return f"{text[:limit]}... ({len(name) if isinstance(name, str) else len(text)} characters)"


class ShardstreamError(Exception):
    """Base of all shardstream errors.

    ``url``, ``shard``, ``offset`` and ``line`` say where the problem is; each is
    ``None`` when it does not apply.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        shard: str | None = None,
        offset: int | None = None,
        line: int | None = None,
    ) -> None:
        if len(message) > _MAX_MESSAGE:  # NOTE [ Names in error messages ]
            cut = len(message) - _MAX_MESSAGE
            message = f"{message[: _MAX_MESSAGE - 1024]}... ({cut} characters cut) ...{message[-1024:]}"
        self.message = message
        self.url = _location(url)
        self.shard = _location(shard)
        self.offset = offset
        self.line = line
        super().__init__(message)

    def __str__(self) -> str:
        where = []
        if self.url is not None:
            where.append(f"url={self.url}")
        if self.shard is not None:
            where.append(f"shard={self.shard}")
        if self.offset is not None:
            where.append(f"offset={self.offset}")
        if self.line is not None:
            where.append(f"line={self.line}")
        return f"{self.message} ({', '.join(where)})" if where else self.message

    def __reduce__(self):  # keep the context when errors cross DataLoader workers
        kwargs = {"url": self.url, "shard": self.shard, "offset": self.offset, "line": self.line}
        return (_rebuild, (type(self), self.message, kwargs))


def _location(value: str | None) -> str | None:
    """``value`` as it is, or cut when it is longer than _MAX_LOCATION (NOTE [ Names in error messages ])."""
    if not isinstance(value, str) or len(value) <= _MAX_LOCATION:
        return value
    return shown(value, _SHOWN_LOCATION)


def _rebuild(cls: type[ShardstreamError], message: str, kwargs: dict) -> ShardstreamError:
    return cls(message, **kwargs)


class UsageError(ShardstreamError):
    """Bad arguments or options: the CLI exits with status 2."""


class ManifestError(ShardstreamError):
    """A missing, unreadable or unsupported ``manifest.json``."""


class NotADatasetError(ManifestError):
    """A URL with no manifest: a missing path or bucket, raw files, shards another tool
    wrote, or a pack that has not finished; the message says which."""


class FormatError(ShardstreamError):
    """A shard or sample index whose bytes are corrupt, truncated or not of its format."""


class PackError(ShardstreamError):
    """Bad source data met while packing (the CLI exits with status 1)."""


class StorageError(ShardstreamError):
    """A permanent storage failure: missing object, access denied, bad bucket."""


class TransientStorageError(StorageError):
    """A storage failure worth retrying: timeout, 5xx, reset, short read."""


class PlanError(ShardstreamError):
    """Epoch-plan parameters that cannot work (negative sizes, rank out of range)."""


class StateError(ShardstreamError):
    """A resume state that does not fit: other dataset, seed, or unknown version."""


class KeyNotFoundError(ShardstreamError, KeyError):
    """No sample has the ``__key__`` asked for; a ``KeyError`` too, as a mapping's is."""


class MissingDependencyError(UsageError, ImportError):
    """An optional package is not installed; the message names the extra that brings it."""
