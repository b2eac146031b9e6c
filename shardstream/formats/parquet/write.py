"""The Parquet shard encoder: rows buffered into small row groups, schema inferred once.

# NOTE [ Parquet shard schema ]
# A field given as bytes is first stored by its extension (NOTE [ Typed columns ] in
# ``typed``): text and JSON as str, integers as int, the rest as bytes.
# The schema is inferred from the first row group (up to ROW_GROUP_MAX_ROWS rows): the
# column order is the order in which names first appear, ``__key__`` (string) first;
# bytes -> binary, str -> string, int -> int64, float -> double (int and float mixed in
# one column -> double), bool -> bool, lists -> list<...>, dicts -> struct<...> (a native
# Parquet struct, so DuckDB and pandas see typed fields rather than JSON text);
# datetime, date, time, timedelta and Decimal map as pyarrow maps them. A column that
# is None in every row of the first row group has Arrow type null and stays empty.
# Every row is checked when it is written, so a bad row is rejected with its key and
# the encoder stays usable: before the schema exists, each value must be storable and
# each column of one kind; after, each row must fit the schema (no new column, no str
# where bytes were, no dict key outside its struct). Only a conflict nested inside the
# lists or dicts of the first row group surfaces later, when that row group is flushed.
# Missing columns and missing struct keys read back as None.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.errors import PackError, UsageError, shown
from shardstream.formats.base import Sample, ShardEncoder
from shardstream.formats.keys import check_key_value
from shardstream.formats.parquet.index import KEY_COLUMN, MAGIC, ParquetIndex, parse_footer, row_group_spans
from shardstream.formats.parquet.integers import integer_range, wide_integers
from shardstream.formats.parquet.typed import EXTENSION_KEY, converter, extension_of, typed_column_error

ROW_GROUP_MAX_ROWS = 1024
ROW_GROUP_MAX_BYTES = 1 << 20  # of estimated row data, before compression
COMPRESSIONS = ("zstd", "snappy", "gzip", "none")
_MAX_FOOTER = 64 << 20  # bytes of the file's tail kept while the writer closes


def normalize_compression(compression: str | None, name: str) -> str:
    value = "zstd" if compression is None else str(compression).lower()
    if value not in COMPRESSIONS:
        raise UsageError(
            f"unknown Parquet compression {compression!r}; known: {', '.join(COMPRESSIONS)}", shard=name
        )
    return value


def estimate_size(sample: Sample) -> int:
    """Roughly the bytes a row adds before compression: payload lengths, 8 per number."""
    total = 0
    for value in sample.values():
        if isinstance(value, (bytes, str, bytearray)):
            total += len(value)
        elif isinstance(value, (list, tuple, dict)):
            total += 8 + 16 * len(value)
        else:
            total += 8
    return total


class _TailSink:
    """The file object pyarrow writes to: counts bytes, keeps the tail written while closing.

    ``close`` is not passed on: the contract leaves the caller's file object open.
    """

    def __init__(self, fileobj: IO[bytes]) -> None:
        self.file = fileobj
        self.count = 0
        self.closed = False
        self.tail: list[bytes] | None = None
        self.tail_bytes = 0

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.file.write(chunk)
        self.count += len(chunk)
        if self.tail is not None:
            self.tail.append(chunk)
            self.tail_bytes += len(chunk)
            while self.tail_bytes - len(self.tail[0]) >= _MAX_FOOTER:
                self.tail_bytes -= len(self.tail.pop(0))
        return len(chunk)

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        flush = getattr(self.file, "flush", None)
        if flush is not None:
            flush()

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False


_OTHER_TYPES = (datetime.datetime, datetime.date, datetime.time, datetime.timedelta, decimal.Decimal)


def _kind(value: Any) -> str | None:
    """The column kind a Python value asks for; None for a type a shard cannot store."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "binary"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "struct"
    if isinstance(value, _OTHER_TYPES):
        return type(value).__name__
    return None


def _merge_kinds(old: str, new: str) -> str | None:
    """The kind of a column holding both; None when no Arrow type holds both."""
    if old == new or new == "null":
        return old
    if old == "null":
        return new
    if {old, new} == {"int", "float"}:
        return "float"
    return None


def _checker(arrow_type: pa.DataType) -> Callable[[Any], bool]:
    """A predicate telling whether a Python value converts to ``arrow_type`` (None always does)."""
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return lambda v: v is None or isinstance(v, (bytes, bytearray, memoryview))
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return lambda v: v is None or isinstance(v, str)
    if pa.types.is_boolean(arrow_type):
        return lambda v: v is None or isinstance(v, bool)
    if pa.types.is_integer(arrow_type):
        fits = integer_range(arrow_type)
        return lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v in fits)
    if pa.types.is_floating(arrow_type):
        return lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
    if pa.types.is_null(arrow_type):
        return lambda v: v is None
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        item = _checker(arrow_type.value_type)
        return lambda v: v is None or (isinstance(v, (list, tuple)) and all(map(item, v)))
    if pa.types.is_struct(arrow_type):
        fields = {
            arrow_type.field(i).name: _checker(arrow_type.field(i).type) for i in range(arrow_type.num_fields)
        }
        return lambda v: (
            v is None
            or (isinstance(v, dict) and v.keys() <= fields.keys() and all(fields[k](x) for k, x in v.items()))
        )
    return lambda v: True  # other inferred types (timestamps, decimals): pyarrow checks them at flush


class ParquetEncoder(ShardEncoder):
    """Writes samples as rows of one Parquet file, in row groups of bounded size."""

    def __init__(self, fileobj: IO[bytes], *, name: str, compression: str | None = None) -> None:
        self._name = name
        self._compression = normalize_compression(compression, name)
        self._sink = _TailSink(fileobj)
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None
        self._checks: dict[str, Callable[[Any], bool]] = {}
        self._kinds: dict[str, str] = {}  # column -> kind, while the schema is not inferred yet
        # column -> key of the first sample with a value there: where its type came from
        self.schema_origins: dict[str, str] = {}
        self._extensions: dict[str, str] = {}  # column -> extension, of fields given as bytes
        self._converters: dict[str, Callable[[Any], Any] | None] = {}  # NOTE [ Typed columns ]
        self._rows: list[Sample] = []
        self._row_bytes = 0
        self._keys: list[str] = []
        self._index: ParquetIndex | None = None

    @property
    def num_samples(self) -> int:
        return len(self._keys)

    @property
    def num_bytes(self) -> int:
        return self._sink.count + (0 if self._index is not None else self._row_bytes)

    def write(self, sample: Sample) -> None:
        if self._index is not None:
            raise PackError("write after close", shard=self._name, offset=self._sink.count)
        if not isinstance(sample, dict):
            raise PackError(f"a sample must be a dict, not {type(sample).__name__}", shard=self._name)
        key = sample.get(KEY_COLUMN)
        if not isinstance(key, str):
            raise PackError(f"sample key must be a str, not {shown(key)}", shard=self._name)
        check_key_value(key, self._name)  # a value, not a path: NOTE [ Safe sample keys ]
        sample = self._typed(key, sample)
        if self._schema is not None:
            self._check_row(key, sample)
        else:
            self._check_kinds(key, sample)
        self._rows.append(sample)
        self._keys.append(key)
        self._row_bytes += estimate_size(sample)
        if len(self._rows) >= ROW_GROUP_MAX_ROWS or self._row_bytes >= ROW_GROUP_MAX_BYTES:
            self._flush()

    def _typed(self, key: str, sample: Sample) -> Sample:
        """``sample`` with its bytes fields as their columns store them (NOTE [ Typed columns ])."""
        typed = None
        converters = self._converters
        for field, value in sample.items():
            if not isinstance(value, (bytes, bytearray, memoryview)) or not isinstance(field, str):
                continue
            if field not in converters:
                converters[field] = converter(field)  # (the key is a str: checked first)
                self._extensions[field] = extension_of(field)
            convert = converters[field]
            if convert is None:
                continue
            if typed is None:
                typed = dict(sample)
            try:
                typed[field] = convert(value)
            except ValueError as error:  # UnicodeDecodeError is one
                raise typed_column_error(field, value, key, self._name, error) from None
        return sample if typed is None else typed

    def _check_row(self, key: str, sample: Sample) -> None:
        checks = self._checks
        for field, value in sample.items():
            check = checks.get(field)
            if check is None:
                raise PackError(
                    f"sample {key!r} has column {field!r}, which is not in the shard's schema "
                    f"({', '.join(checks)}) inferred from its first rows",
                    shard=self._name,
                )
            if not check(value):
                what = shown(value) if type(value) is int else f"of type {type(value).__name__}"
                raise PackError(
                    f"sample {key!r}: column {field!r} value {what} does not fit the "
                    f"shard's schema type {self._schema.field(field).type}",  # type: ignore[union-attr]
                    shard=self._name,
                )

    def _check_kinds(self, key: str, sample: Sample) -> None:
        """Before the schema exists: every value storable, and of one kind per column."""
        merged = {}
        for field, value in sample.items():
            if not isinstance(field, str):
                raise PackError(f"sample {key!r}: column names must be str, not {field!r}", shard=self._name)
            kind = _kind(value)
            if kind is None:
                raise PackError(
                    f"sample {key!r}: column {field!r} has a {type(value).__name__}, which a Parquet shard "
                    "cannot store (use bytes, str, int, float, bool, None, lists or dicts of those)",
                    shard=self._name,
                )
            old = self._kinds.get(field, "null")
            both = _merge_kinds(old, kind)
            if both is None:
                raise PackError(
                    f"sample {key!r}: column {field!r} holds a {kind} here but a {old} in earlier samples",
                    shard=self._name,
                )
            merged[field] = both
            if value is not None:
                self.schema_origins.setdefault(field, key)
        self._kinds.update(merged)

    def _infer_schema(self, rows: list[Sample]) -> pa.Schema:
        names: dict[str, None] = {KEY_COLUMN: None}
        for row in rows:
            names.update(dict.fromkeys(row))
        fields = []
        for name in names:
            column = [row.get(name) for row in rows]
            try:
                try:
                    values = pa.array(column, type=pa.string() if name == KEY_COLUMN else None)
                except OverflowError:  # NOTE [ Integers beyond int64 ] in integers.py
                    keys = [row[KEY_COLUMN] for row in rows]
                    values = pa.array(column, type=wide_integers(name, column, keys))
            except PackError as error:
                raise PackError(error.message, shard=self._name) from None
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
                raise PackError(
                    f"column {name!r} has values of mixed or unsupported types in the first rows "
                    f"(samples {rows[0][KEY_COLUMN]!r} to {rows[-1][KEY_COLUMN]!r}): {error} (the items "
                    "of a list, and a dict key's values, must be of one type in every sample)",
                    shard=self._name,
                ) from None
            extension = self._extensions.get(name)
            metadata = None if extension is None else {EXTENSION_KEY: extension.encode()}
            fields.append(pa.field(name, values.type, metadata=metadata))
        return pa.schema(fields)

    def _open(self, schema: pa.Schema) -> pq.ParquetWriter:
        dictionary = [  # not for columns made from bytes (typed or not): their row groups are small
            f.name
            for f in schema
            if f.name != KEY_COLUMN
            and f.name not in self._extensions
            and not (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))
        ]
        return pq.ParquetWriter(
            self._sink,
            schema,
            compression=self._compression,
            use_dictionary=dictionary,
            write_statistics=True,
            store_schema=True,
        )

    def _flush(self) -> None:
        """Write the buffered rows as one row group; on error they stay buffered and nothing is written."""
        rows = self._rows
        if self._writer is None:
            self._start(rows)
        if rows:
            try:
                columns = [pa.array([row.get(f.name) for row in rows], type=f.type) for f in self._schema]  # type: ignore[union-attr]
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
                raise PackError(
                    f"samples {rows[0][KEY_COLUMN]!r} to {rows[-1][KEY_COLUMN]!r} do not fit the shard's "
                    f"schema: {error}",
                    shard=self._name,
                ) from None
            table = pa.Table.from_arrays(columns, schema=self._schema)
            self._writer.write_table(table, row_group_size=len(rows))  # type: ignore[union-attr]
        self._rows, self._row_bytes = [], 0

    def _start(self, rows: list[Sample]) -> None:
        """Infer the schema from the first rows, check them against it, open the writer."""
        self._schema = self._infer_schema(rows)
        self._checks = {f.name: _checker(f.type) for f in self._schema}
        try:
            for row in rows:  # pyarrow unions struct keys, but not types inside lists
                self._check_row(row[KEY_COLUMN], row)
        except PackError:
            self._schema, self._checks = None, {}
            raise
        self._writer = self._open(self._schema)

    def close(self) -> ParquetIndex:
        if self._index is not None:
            return self._index
        self._flush()
        sink = self._sink
        sink.tail, sink.tail_bytes = [], 0
        self._writer.close()  # type: ignore[union-attr]
        tail = b"".join(sink.tail)
        sink.tail = None
        if len(tail) < 8 or tail[-4:] != MAGIC:
            raise PackError("pyarrow wrote no Parquet footer", shard=self._name)
        footer_len = struct.unpack("<I", tail[-8:-4])[0]
        if footer_len + 8 > len(tail):
            raise PackError(f"Parquet footer of {footer_len} bytes is too large to index", shard=self._name)
        footer = tail[-8 - footer_len : -8]
        metadata = parse_footer(footer, name=self._name)
        self._index = ParquetIndex(
            name=self._name,
            file_size=sink.count,
            footer=footer,
            spans=row_group_spans(metadata),
            keys=self._keys,
        )
        return self._index
