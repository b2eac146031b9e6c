"""Single samples of a tar shard cut by their spans: what ``TarIndex.singles`` gives when
every sample has the same fields. Built from the index's arrays, so the index module
makes it without this module importing the index back."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from shardstream.formats.base import SingleSamples
from shardstream.formats.tar.header import BLOCK as HEADER_BLOCK
from shardstream.formats.tar.members import check_uncompressed


class TarSingles(SingleSamples):
    """Single samples of a tar shard whose samples all have the same ``fields``: spans and
    values by a few lookups in the index's arrays, no header parsed (NOTE [ Fast tar decode ]).
    The arrays are seen through int64 memoryviews, whose items are Python ints at once."""

    __slots__ = ("_first", "_keys", "_name", "_offset", "_size", "_start", "fields")

    def __init__(
        self, name: str, keys: Sequence[str], arrays: Iterable[np.ndarray], fields: tuple[str, ...]
    ) -> None:
        """``arrays``: the index's ``sample_start``, ``member_first``, ``member_offset`` and
        ``member_size`` (``TarIndex.sample_arrays``); ``keys``: every sample's key."""
        self.fields = fields
        self._name = name
        self._keys = keys
        self._start, self._first, self._offset, self._size = map(_int_view, arrays)

    def span(self, position: int) -> tuple[int, int]:
        last = self._first[position + 1] - 1
        return self._start[position], self._offset[last] + self._size[last]

    def key(self, position: int) -> str:
        return self._keys[position]

    def values(self, data: bytes, base: int, position: int) -> list[bytes]:
        if base == 0:  # a shard replaced by its compressed self after indexing says so
            check_uncompressed(bytes(data[:HEADER_BLOCK]), self._name)
        offset, size = self._offset, self._size
        return [
            data[offset[m] - base : offset[m] - base + size[m]]
            for m in range(self._first[position], self._first[position + 1])
        ]


def _int_view(array: np.ndarray) -> memoryview:
    return np.ascontiguousarray(array, dtype=np.int64).data.cast("B").cast("q")
