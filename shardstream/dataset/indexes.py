"""The sample indexes (sidecars) a dataset keeps in each process: a small LRU."""

from __future__ import annotations

import collections
import threading

from shardstream.formats.base import SampleIndex
from shardstream.manifest import ShardInfo

__all__ = ["INDEX_CACHE_SIZE", "IndexCache"]

# Sidecars kept per worker: a shuffled window stripes over 4 x its shards' worth, and the
# next window is read while this one is decoded.
INDEX_CACHE_SIZE = 48

# NOTE [ Sidecars across epochs ]
# Every iteration makes a new WindowReader, but the sidecars it loads are kept by the
# dataset (one IndexCache per dataset and process, made with its Storage and anew after a
# fork, as the Storage is), so the next epoch of a persistent DataLoader
# worker or of an in-process loop does not read them again (on S3, one GET per shard per
# epoch, a visible share of an epoch). They are keyed by the shard's whole
# manifest entry (paths, sizes, sha256), so another manifest never gets a stale index,
# and held while the dataset lives: at most INDEX_CACHE_SIZE of them.


class IndexCache:
    """A small thread-safe LRU of sample indexes; one per dataset and process (NOTE [ Sidecars
    across epochs ])."""

    __slots__ = ("_items", "_lock", "size")

    def __init__(self, size: int = INDEX_CACHE_SIZE) -> None:
        self.size = size
        self._items: collections.OrderedDict[ShardInfo, SampleIndex] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: ShardInfo) -> SampleIndex | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: ShardInfo, index: SampleIndex) -> None:
        with self._lock:
            self._items[key] = index
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
