"""The checksums of an object already stored, read back as a stream.

A pack compares a shard it is about to write with the one at its name (NOTE
[ Restartable shards ] in ``pack.shard``); ``index`` and ``verify`` hash shards another
tool or an earlier run wrote. Both read the object the same way, so it is done here,
below ``pack`` and ``catalog``.
"""

from __future__ import annotations

import hashlib

from shardstream.formats.checks import BlockHasher, ShardChecks
from shardstream.storage import Storage

__all__ = ["checks_of", "sha256_of"]

_READ_CHUNK = 8 << 20


def sha256_of(storage: Storage, path: str) -> str:
    """The sha256 of a stored object, read as a stream."""
    digest = hashlib.sha256()
    with storage.open(path) as f:
        while chunk := f.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def checks_of(storage: Storage, path: str) -> ShardChecks:
    """The size, sha256 and block CRCs of a stored object, read once as a stream."""
    hasher = BlockHasher()
    with storage.open(path) as f:
        while chunk := f.read(_READ_CHUNK):
            hasher.update(chunk)
    return hasher.checks()
