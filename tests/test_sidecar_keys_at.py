"""StringTable.at: the strings at given rows, a slice where the rows are consecutive."""

from __future__ import annotations

import numpy as np
import pytest

from shardstream.formats._sidecar import pack_strings, unpack_strings

KEYS = [f"{i:05d}" for i in range(50)] + ["odd-one", "ü-key"]


def _table():  # type: ignore[no-untyped-def]
    blob, ends = pack_strings(KEYS)
    return unpack_strings(memoryview(blob), memoryview(ends), len(KEYS), name="s", what="keys")


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [7],
        list(range(10, 30)),  # one run in order: a slice
        list(range(40, 52)),
        [3, 4, 5, 9],  # not consecutive
        [5, 4, 3],  # consecutive, but backwards
        [1, 1, 2],
        [51, 0],
    ],
)
def test_at_gives_the_rows_strings(rows: list[int]) -> None:
    table = _table()
    got = table.at(np.array(rows, dtype=np.int64))
    assert got == [KEYS[r] for r in rows]
    got.append("x")  # a list of its own: the table's strings stay as they are
    assert table.strings() == KEYS


@pytest.mark.parametrize("rows", [[50, 51, 52, 53], [51, 52], [60, 61]])
def test_rows_past_the_table_raise_and_never_come_back_short(rows: list[int]) -> None:
    """Consecutive rows that run past the table are no slice: a slice would give fewer keys
    than rows, and a sample's values would lose their keys silently."""
    with pytest.raises(IndexError):
        _table().at(np.array(rows, dtype=np.int64))
