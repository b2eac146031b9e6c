"""Integer columns: the range of each Arrow integer type, and integers wider than int64.

# NOTE [ Integers beyond int64 ]
# Python ints have no bound and Arrow infers int64 for them: a uint64 column of a
# Parquet source (2**64 - 1 is a common sentinel) failed with "Python int too large to
# convert to C long". A column whose integers are all in [0, 2**64) with one above int64
# is stored as uint64, as its source had it; a value beyond both ranges is refused,
# naming the column and sample (store it as a string, or in a tar shard, where it is
# text). Every later row is checked against its column's range, so no value fails when
# its row group is flushed.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from shardstream.errors import PackError, shown


def integer_range(arrow_type: pa.DataType) -> range:
    """The integers an Arrow integer type holds."""
    bits = arrow_type.bit_width
    return (
        range(0, 2**bits)
        if pa.types.is_unsigned_integer(arrow_type)
        else range(-(2 ** (bits - 1)), 2 ** (bits - 1))
    )


_INT64 = range(-(2**63), 2**63)
_UINT64 = range(2**64)


def wide_integers(name: str, values: list[Any], keys: list[str]) -> pa.DataType:
    """The type of a column of integers that int64 does not hold: uint64 where they are
    all in [0, 2**64), else a ``PackError`` naming the first sample beyond 64 bits
    (NOTE [ Integers beyond int64 ])."""
    ints = [v for v in values if v is not None]
    if ints and all(type(v) is int and v in _UINT64 for v in ints):
        return pa.uint64()
    for key, value in zip(keys, values, strict=True):
        if type(value) is int and value not in _INT64 and value not in _UINT64:
            where = f"sample {key!r} holds {shown(value)}"
            break
    else:  # nested in a list or dict, or negative beside one above int64
        where = "its values need more than 64 bits (in lists or dicts, or both signs)"
    return _beyond_64_bits(name, where)


def _beyond_64_bits(name: str, where: str) -> pa.DataType:
    raise PackError(
        f"column {name!r}: {where}, beyond Parquet's widest integers (int64, and uint64 for "
        "values from 0 to 2**64 - 1); store such numbers as strings, or pack --format tar"
    )
