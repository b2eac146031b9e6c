"""Typed Parquet columns for fields given as bytes: text, integers and JSON by extension.

# NOTE [ Typed columns ]
# A folder of ``.txt``/``.cls``/``.json`` files (or a tar) gives every field as bytes. As
# binary columns, DuckDB, pandas and Hugging Face users saw ``b'1\n'`` where a WebDataset
# user gets 1. So a Parquet shard stores a bytes field by its extension (the part of its
# name after the last dot, lowercased, as the decoders read it):
# - text (``txt``, ``text``, ``transcript``, ``caption``, ``md``): a UTF-8 string column;
# - integers (``cls``, ``cls2``, ``class``): int64, parsed as ``int`` (and the tar decoder)
#   parses the bytes, so ``b'1\n'`` is 1;
# - JSON (``json``, ``jsn``): a string column holding the document's text as it was. Not
#   a struct: a struct needs the same keys and types in every sample, turns a missing key
#   into a null, and cannot hold a document that is a list or a number; the text keeps
#   every document whole, and DuckDB (``json`` functions) and pandas read it as text;
# - anything else (``npy``, images, ...): a binary column.
# Every column made from bytes records its field's extension in the Arrow field metadata
# (``shardstream.extension``), so any reader knows how to decode it.
# shardstream reads a typed column back as the bytes it was made from (``as_bytes``): its
# text's UTF-8, its integer's decimal digits. Decoding then runs the same decoders, the
# user's too, on the same bytes as for a tar shard, and ``decode=False`` gives bytes for
# every field in both formats. The one difference: an integer comes back as its digits
# alone (``b'1'``), without whatever whitespace its file had around it (``b'1\n'``),
# which carries nothing ``int`` keeps.
# A value its column cannot hold (a ``.cls`` that is no integer or outside int64, a
# ``.txt`` that is not UTF-8) is refused, naming the sample: its decoder would fail on it
# in a tar shard too, and a column that fell back to binary in one shard only would give
# that shard another schema (Hugging Face and DuckDB refuse to read them together).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from shardstream.errors import PackError, shown
from shardstream.formats.samples import BYTES_COLUMN, TYPED_COLUMN, UNKNOWN_COLUMN

EXTENSION_KEY = b"shardstream.extension"
_TEXT = frozenset({"txt", "text", "transcript", "caption", "md"})
_INTEGER = frozenset({"cls", "cls2", "class"})
_JSON = frozenset({"json", "jsn"})
_INT64 = range(-(2**63), 2**63)
# Values below which a column is turned back into bytes in Python rather than by Arrow
# casts, which pay a fixed cost per call however short the column (a run of a few samples).
_CAST_FROM = 256


def extension_of(field: str) -> str:
    """The extension a field is decoded by: ``"seg.PNG"`` -> ``"png"``."""
    return field.rsplit(".", 1)[-1].lower()


def _text(data: Any) -> str:
    return (data if type(data) is bytes else bytes(data)).decode("utf-8")


def _integer(data: Any) -> int:
    value = int(data if type(data) is bytes else bytes(data))
    if value not in _INT64:
        raise ValueError("it does not fit in 64 bits")
    return value


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    **dict.fromkeys(_TEXT | _JSON, _text),
    **dict.fromkeys(_INTEGER, _integer),
}


def converter(field: str) -> Callable[[Any], Any] | None:
    """What the column of ``field``, given as bytes, stores for them (NOTE [ Typed columns ]):
    a function of the bytes that raises ``ValueError`` for bytes its column cannot hold,
    or None for a binary column."""
    return _CONVERTERS.get(extension_of(field))


class FieldError(PackError):
    """A PackError about one field of a sample: ``field`` names it, so a pack can point at
    the file it came from (a folder source's ``KEY.FIELD``)."""

    def __init__(self, message: str, *, field: str | None = None, **where: Any) -> None:
        super().__init__(message, **where)
        self.field = field


def typed_column_error(field: str, value: Any, key: str, shard: str, error: ValueError) -> FieldError:
    """The error for a value of ``field`` that its typed column cannot hold."""
    what = "an integer" if _CONVERTERS[extension_of(field)] is _integer else "UTF-8 text"
    return FieldError(
        f"sample {key!r}: field {field!r} is {shown(bytes(value))}, which is not {what} ({error}); "
        f"a Parquet shard stores .{extension_of(field)} fields in a typed column, as their decoder "
        "reads them: fix the file, or give the field another extension to store it as bytes",
        field=field,
        shard=shard,
    )


def as_bytes(column: pa.ChunkedArray) -> list[Any]:
    """A typed column's values as the bytes they were made from: text as UTF-8, integers as
    digits (a missing value stays None)."""
    integers = pa.types.is_integer(column.type)
    if len(column) >= _CAST_FROM:
        return (column.cast(pa.string()) if integers else column).cast(pa.binary()).to_pylist()
    values = column.to_pylist()
    if integers:
        return [None if v is None else b"%d" % v for v in values]
    return list(map(str.encode, values)) if None not in values else [v and v.encode() for v in values]


def values_of(column: pa.ChunkedArray, typed: bool, wanted: str | None) -> tuple[list[Any], str]:
    """A column's values for a reader: a typed column as its bytes (``as_bytes``), or as it
    is where ``wanted`` names its kind ("text", "integer": the reader's decoder would make
    the same values of the bytes); any other column as it is. And what is known of their
    types (``SampleColumns.kinds``)."""
    kind = column.type
    if (
        not typed
        or (wanted == "integer" and pa.types.is_integer(kind))
        or (wanted == "text" and _text_type(kind))
    ):
        return column.to_pylist(), _kind_of(kind, column.null_count)
    return as_bytes(column), BYTES_COLUMN if not column.null_count else UNKNOWN_COLUMN


def _text_type(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _kind_of(kind: pa.DataType, nulls: int) -> str:
    """What ``to_pylist`` of a column of type ``kind`` with ``nulls`` nulls gives: bytes
    alone (a binary column without nulls), no bytes-like value at all (text, numbers,
    booleans: a null is None), or either (any other type: a dictionary or extension
    type may hold bytes)."""
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return BYTES_COLUMN if not nulls else UNKNOWN_COLUMN
    plain = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, _text_type)
    return TYPED_COLUMN if any(test(kind) for test in plain) else UNKNOWN_COLUMN
