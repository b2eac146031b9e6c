"""Finding a sample by its ``__key__`` through the manifest and the sidecars.

# NOTE [ Key lookup ]
# The manifest lists shards, not keys; each shard's sidecar lists its samples' keys in
# shard order. A lookup never reads shard data, only sidecars (through the reader's LRU):
# - Shards whose keys are sorted, each shard's keys above the previous shard's (what
#   ``shardstream pack`` of one flat folder or a ShardWriter fed keys in order writes), are
#   searched by bisection: about log2(shards) sidecars, then a bisection in one shard.
# - Otherwise (keys in another order, or the bisection did not find it) the sidecars are
#   read one by one, each turned into a key -> position dict when first searched: O(shards)
#   sidecar reads and O(samples in the shard) time and memory per shard, once; the dicts
#   of the last ``KEY_TABLES`` shards searched are kept, the others rebuilt when needed.
# A key that two samples share gives one of their indices.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from typing import Any

from shardstream.errors import KeyNotFoundError, shown
from shardstream.formats.base import SampleIndex

__all__ = ["KEY_TABLES", "KeyFinder"]

KEY_TABLES = 16  # key -> position dicts kept, see NOTE [ Key lookup ]


class KeyFinder:
    """``index_of(key)`` over a dataset's shards, by their sidecars (NOTE [ Key lookup ])."""

    def __init__(self, reader: Any, offsets: list[int]) -> None:
        self._reader = reader  # a WindowReader: its ``index(shard)`` reads and keeps sidecars
        self._offsets = offsets  # dataset index of each shard's first sample
        self._ordered: dict[int, bool] = {}  # shard -> whether its keys are sorted
        self._tables: collections.OrderedDict[int, dict[str, int]] = collections.OrderedDict()

    def index_of(self, key: str) -> int:
        """The dataset index of the sample named ``key``; a ``KeyNotFoundError`` (a
        ``ShardstreamError`` and a ``KeyError``) if there is none."""
        if not isinstance(key, str):
            raise self._missing(key, f"a key is a str, not {type(key).__name__}")
        shard = self._bisect(key)
        if shard is not None:
            found = self._in_shard(shard, key)
            if found is not None:
                return self._offsets[shard] + found
        for shard in range(len(self._offsets)):
            found = self._in_shard(shard, key)
            if found is not None:
                return self._offsets[shard] + found
        raise self._missing(key, f"no sample of its {len(self._offsets)} shards has it")

    def _missing(self, key: object, why: str) -> KeyNotFoundError:
        storage = getattr(self._reader, "storage", None)
        return KeyNotFoundError(f"key {shown(key)} not found: {why}", url=getattr(storage, "url", None))

    def _index(self, shard: int) -> SampleIndex:
        index: SampleIndex = self._reader.index(shard)
        return index

    def _sorted(self, shard: int) -> bool:
        ordered = self._ordered.get(shard)
        if ordered is None:
            keys = self._index(shard).keys
            ordered = self._ordered[shard] = all(a < b for a, b in itertools.pairwise(keys))
        return ordered

    def _bisect(self, key: str) -> int | None:
        """The shard that would hold ``key`` if the dataset's keys are sorted; None as soon
        as a shard met on the way is not sorted, or is empty."""
        lo, hi = 0, len(self._offsets)
        while lo < hi:
            mid = (lo + hi) // 2
            index = self._index(mid)
            if not index.num_samples or not self._sorted(mid):
                return None
            keys = _Keys(index)
            if key < keys[0]:
                hi = mid
            elif key > keys[len(keys) - 1]:
                lo = mid + 1
            else:
                return mid
        return None

    def _in_shard(self, shard: int, key: str) -> int | None:
        """``key``'s position in ``shard``, or None."""
        index = self._index(shard)
        if self._sorted(shard):
            keys = _Keys(index)
            at = bisect.bisect_left(keys, key)
            return at if at < len(keys) and keys[at] == key else None
        table = self._tables.get(shard)
        if table is None:
            table = {}
            for position, name in enumerate(index.keys):
                table.setdefault(name, position)
            self._tables[shard] = table
            while len(self._tables) > KEY_TABLES:
                self._tables.popitem(last=False)
        self._tables.move_to_end(shard)
        return table.get(key)


class _Keys:
    """The keys of one shard as a sequence, one at a time (``SampleIndex.keys`` copies all)."""

    __slots__ = ("_index",)

    def __init__(self, index: Any) -> None:
        self._index = index

    def __len__(self) -> int:
        return int(self._index.num_samples)

    def __getitem__(self, position: int) -> str:
        key: str = self._index.key_slice(position, position + 1)[0]
        return key
