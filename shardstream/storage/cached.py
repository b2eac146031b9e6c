"""A Storage's reads through its shard cache (NOTE [ Shard cache ] in cache.py).

# NOTE [ Filling the cache ]
# An entry is filled the first time any byte of its shard is read: the whole object is
# fetched and written to the entry's temp file as its bytes arrive, then checked (size,
# and the manifest's sha256) and renamed into place. With a ``ReadPool`` the object comes
# in parts, several GETs in flight (NOTE [ Reads in parts ] in parts.py), each written
# at its offset with ``pwrite`` (nothing is held in memory but the parts in flight), so a
# cold epoch with ``cache_dir`` moves the bytes at the speed of a streamed one and the
# warm epoch maps the local files. Without a pool (``Storage.open``, a plain
# ``Storage.read``) the parts are read one after the other.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, cast

from shardstream.errors import UsageError
from shardstream.storage import local
from shardstream.storage.cache import ShardCache
from shardstream.storage.expect import Expected, changed_error
from shardstream.storage.parts import ReadPool, split, wait_all
from shardstream.types import ByteRange

if TYPE_CHECKING:
    from shardstream.storage.core import Storage

__all__ = ["cache_key", "cached_path", "read_cached"]

_DOWNLOAD_CHUNK = 32 * 2**20  # without a pool: ranged reads of this size, each retried


def read_cached(
    storage: Storage, path: str, rng: ByteRange | None, expect: Expected | None, pool: ReadPool | None
) -> bytes:
    for _ in range(3):  # an entry evicted by another process between fetch and read is fetched again
        entry = cached_path(storage, path, expect, pool)
        try:
            data = local.read(entry, rng)
        except FileNotFoundError:
            continue
        if rng is not None and len(data) != rng.length:
            storage._short_read(path, rng, len(data))
        return data
    return storage._read_direct(path, rng, expect)


def cache_key(storage: Storage, path: str) -> str:
    """The object's name in the cache; its entries are also keyed by content where the
    manifest names it (NOTE [ Reads check the manifest ] in expect.py)."""
    return f"{storage._fs_options().get('endpoint_url') or ''}|{storage.full_url(path)}"


def cached_path(
    storage: Storage, path: str, expect: Expected | None = None, pool: ReadPool | None = None
) -> str:
    """The local path of a complete cache entry of ``path``, filled first if need be."""
    cache = storage._cache
    if cache is None:
        raise UsageError("no cache_dir set", url=storage.url)
    known = expect.size if expect is not None else None
    return cache.fetch(
        cache_key(storage, path),
        (lambda: known) if known is not None else (lambda: storage.size(path)),
        lambda tmp, n: _fill(storage, path, tmp, n, expect, pool),
        url=storage.full_url(path),
        content=expect.content_key if expect is not None else "",
    )


def _fill(
    storage: Storage, path: str, tmp: str, size: int, expect: Expected | None, pool: ReadPool | None
) -> None:
    """Write the object's ``size`` bytes to ``tmp`` (NOTE [ Filling the cache ]), then
    check its sha256 against the manifest's."""
    whole = ByteRange(0, size)
    parts = split(whole) if pool is not None else None
    if parts is None or len(parts) == 1:
        parts = [ByteRange(s, min(size, s + _DOWNLOAD_CHUNK)) for s in range(0, size, _DOWNLOAD_CHUNK)]
    try:  # reads raise ShardstreamErrors only: an OSError is the cache's disk
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            _write_parts(storage, path, fd, parts, expect, pool)
        finally:
            os.close(fd)
        got = _sha256(tmp) if expect is not None and expect.sha256 else None
    except OSError as error:
        raise cast(ShardCache, storage._cache).disk_error(error, storage.full_url(path)) from error
    if got is not None and expect is not None and got != expect.sha256.lower():
        what = f"its sha256 is {got}, the manifest says {expect.sha256}"
        raise changed_error(storage.full_url(path), path, what)


def _write_parts(
    storage: Storage,
    path: str,
    fd: int,
    parts: list[ByteRange],
    expect: Expected | None,
    pool: ReadPool | None,
) -> None:
    def one(part: ByteRange) -> None:
        data = storage._read_direct(path, part, expect)  # retried alone
        view, offset = memoryview(data), part.start
        while view:  # pwrite may write less than asked
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written

    if pool is None or len(parts) == 1:
        for part in parts:
            one(part)
        return
    wait_all([pool.submit(one, part) for part in parts])


def _sha256(file: str) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(4 * 2**20):
            digest.update(chunk)
    return digest.hexdigest()
