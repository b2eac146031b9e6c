"""A cache entry whose bytes fail their check is dropped and fetched again, once.

# NOTE [ Healing the cache ]
# A cache entry is checked when it is filled (NOTE [ Filling the cache ] in
# shardstream/storage/cached.py), but a disk can flip a bit later, and a file can be
# copied over another; every later read of it would then fail its block CRC, epoch after
# epoch, with an error naming the object on storage (which is fine), and nothing would
# fetch it again. So a read from the cache that fails its check (NOTE [ Checksummed
# reads ]), or a sidecar from the cache that fails its own checksum or its manifest
# entry, drops the entry, with a warning naming the cache file, and is read again: the
# entry is filled anew from storage, a shard's checked against its CRC-32 as any fill is.
# Only what fails then is an error (on_error="skip": skipped), naming the object: the
# copy on storage itself differs from its index. A reader drops an entry once; another
# of its reads of the same shard that failed on the old bytes reads the new entry. The
# cost falls on failures only: a read that passes its check is never read twice.
"""

from __future__ import annotations

import logging
import threading

from shardstream.dataset.fetch import ByteFetcher
from shardstream.types import ByteRange

__all__ = ["CacheHealer"]

_log = logging.getLogger("shardstream.dataset")


class CacheHealer:
    """One reader's entries dropped after a failed check (NOTE [ Healing the cache ])."""

    def __init__(self, fetcher: ByteFetcher) -> None:
        self.fetcher = fetcher
        self._lock = threading.Lock()
        self._dropped: set[str] = set()

    def read_again(self, path: str, rng: ByteRange | None, offset: int) -> bytes | memoryview | None:
        """``rng`` of ``path`` (None: all of it) read again, its cache entry dropped first
        (once per path) after the bytes at ``offset`` failed their check; None where the
        storage has no cache (the bytes are the storage's own: nothing to heal)."""
        fetcher = self.fetcher
        if not fetcher.storage.cached:
            return None
        with self._lock:
            first = path not in self._dropped
            self._dropped.add(path)
        if first:
            entry = fetcher.drop_cached(path)
            _log.warning(
                "the cached copy of %s failed its check at offset %d: cache file %s dropped, "
                "the shard is fetched again from storage",
                fetcher.storage.full_url(path),
                offset,
                entry,
            )
        return fetcher.read(path, rng)
