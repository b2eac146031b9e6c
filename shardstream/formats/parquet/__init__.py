"""Parquet shards: a sample is a row; read a row group at a time from ranged bytes.

Shards written here keep each sample's key in a ``__key__`` string column; Parquet
written by other tools (Spark, Ray, pandas) has none, and its samples are named
``<shard name>:<row>``. See NOTE [ Parquet shard schema ] for how types are chosen.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator, Mapping
from itertools import repeat
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from shardstream.errors import FormatError, UsageError
from shardstream.formats.base import (
    Sample,
    SampleColumns,
    SampleIndex,
    ShardFormat,
    check_covers,
    check_covers_all,
    run_positions,
)
from shardstream.types import ByteRange

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream.formats.parquet.index import ParquetIndex
    from shardstream.formats.parquet.write import (
        COMPRESSIONS,
        ROW_GROUP_MAX_BYTES,
        ROW_GROUP_MAX_ROWS,
        ParquetEncoder,
    )

__all__ = [
    "COMPRESSIONS",
    "ROW_GROUP_MAX_BYTES",
    "ROW_GROUP_MAX_ROWS",
    "ParquetEncoder",
    "ParquetFormat",
    "ParquetIndex",
]

_MAX_FOOTER = 256 << 20  # a footer length beyond this is corruption, not metadata
_LAZY = {  # NOTE [ pyarrow on demand ]: these names import pyarrow, so only on first use
    "COMPRESSIONS": "shardstream.formats.parquet.write",
    "ROW_GROUP_MAX_BYTES": "shardstream.formats.parquet.write",
    "ROW_GROUP_MAX_ROWS": "shardstream.formats.parquet.write",
    "ParquetEncoder": "shardstream.formats.parquet.write",
    "ParquetIndex": "shardstream.formats.parquet.index",
}

# NOTE [ pyarrow on demand ]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# Importing pyarrow (and numpy with it) is slow, paid by every ``shardstream``
# command and every pack worker process, though most write tar. The registry in
# ``shardstream.formats`` holds a ParquetFormat instance, so this module must import
# cheaply: pyarrow and the modules built on it are imported inside the functions that
# write or read a Parquet shard, and the re-exported names resolve on first access.


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def _arrow_errors() -> tuple[type[BaseException], ...]:
    import pyarrow as pa

    return (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError)


class ParquetFormat(ShardFormat):
    """Parquet shards (pyarrow), readable by pyarrow, DuckDB, pandas and Hugging Face datasets."""

    name = "parquet"
    suffix = ".parquet"
    token_field = "input_ids"
    token_lists = True  # a list<int64> column, as Hugging Face and DuckDB read input_ids

    def encoder(self, fileobj: IO[bytes], *, name: str, compression: str | None = None) -> ParquetEncoder:
        from shardstream.formats.parquet.write import ParquetEncoder

        return ParquetEncoder(fileobj, name=name, compression=compression)

    def sample_size(self, sample: Sample) -> int:
        from shardstream.formats.parquet.write import estimate_size

        return estimate_size(sample)

    def build_index(self, fileobj: IO[bytes], *, name: str) -> tuple[ParquetIndex, tuple[str, ...]]:
        from shardstream.formats.parquet.index import MAGIC, ParquetIndex, parse_footer, row_group_spans

        try:
            size = fileobj.seek(0, io.SEEK_END)
            if size < 12:
                raise FormatError(f"not a Parquet file: {size} bytes", shard=name, offset=0)
            fileobj.seek(size - 8)
            trailer = fileobj.read(8)
            if len(trailer) != 8 or trailer[4:] != MAGIC:
                raise FormatError("not a Parquet file (no PAR1 at its end)", shard=name, offset=size - 4)
            footer_len = struct.unpack("<I", trailer[:4])[0]
            if footer_len + 12 > size or footer_len > _MAX_FOOTER:
                raise FormatError(f"bad Parquet footer length {footer_len}", shard=name, offset=size - 8)
            fileobj.seek(size - 8 - footer_len)
            footer = fileobj.read(footer_len)
        except OSError as error:
            raise FormatError(f"cannot read the Parquet footer: {error}", shard=name) from None
        if len(footer) != footer_len:
            raise FormatError("truncated Parquet footer", shard=name, offset=size - 8 - footer_len)
        metadata = parse_footer(footer, name=name)
        keys = _read_keys(fileobj, metadata, name) if _has_key_column(metadata) else None
        try:
            index = ParquetIndex(
                name=name, file_size=size, footer=footer, spans=row_group_spans(metadata), keys=keys
            )
        except _arrow_errors() as error:
            raise FormatError(f"corrupt Parquet metadata: {error}", shard=name) from None
        return index, index.fields

    def load_index(self, data: bytes, *, name: str) -> ParquetIndex:
        from shardstream.formats.parquet.index import ParquetIndex

        return ParquetIndex.from_bytes(data, name=name)

    def decode(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        start: int,
        stop: int,
        *,
        name: str,
    ) -> Iterator[Sample]:
        from shardstream.formats.parquet.index import ParquetIndex

        if not isinstance(index, ParquetIndex):
            raise UsageError(f"a Parquet shard needs a ParquetIndex, not {type(index).__name__}", shard=name)
        need = index.byte_range(start, stop)  # checks start and stop
        if start == stop:
            return iter(())
        check_covers(data, rng, need, start, stop, name)
        return iter(_rows(data, rng.start, index, start, stop, name))

    def decode_runs(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        starts: np.ndarray,
        stops: np.ndarray,
        *,
        name: str,
        typed_values: Mapping[str, str] | None = None,
    ) -> SampleColumns | list[Sample]:
        """``ShardFormat.decode_runs``; ``typed_values``: fields whose typed column of that
        kind ("text", "integer") comes as it is, not as bytes (NOTE [ Typed values passed
        through ] in dataset/decode.py)."""
        from shardstream.formats.parquet.index import ParquetIndex

        if not isinstance(index, ParquetIndex):
            raise UsageError(f"a Parquet shard needs a ParquetIndex, not {type(index).__name__}", shard=name)
        lo, hi = index.byte_ranges(starts, stops)  # checks the runs
        some = stops > starts
        if not bool(some.any()):
            return []
        starts, stops = starts[some], stops[some]
        check_covers_all(data, rng, (lo[some], hi[some]), starts, stops, name)
        return _rows_at(data, rng.start, index, run_positions(starts, stops), name, typed_values or {})


def _has_key_column(metadata: pq.FileMetaData) -> bool:
    import pyarrow as pa

    from shardstream.formats.parquet.index import KEY_COLUMN

    try:
        field = metadata.schema.to_arrow_schema().field(KEY_COLUMN)
    except (KeyError, pa.ArrowException, ValueError):
        return False
    return pa.types.is_string(field.type) or pa.types.is_large_string(field.type)


def _read_keys(fileobj: IO[bytes], metadata: pq.FileMetaData, name: str) -> list[str]:
    """The ``__key__`` column: the only data an index of our own shards reads."""
    import pyarrow.parquet as pq

    from shardstream.formats.parquet.index import KEY_COLUMN

    try:
        fileobj.seek(0)
        table = pq.ParquetFile(fileobj, metadata=metadata, pre_buffer=False).read(
            columns=[KEY_COLUMN], use_threads=False
        )
        keys = table.column(0).to_pylist()
    except _arrow_errors() as error:
        raise FormatError(f"cannot read the Parquet {KEY_COLUMN} column: {error}", shard=name) from None
    return [f"{name}:{row}" if key is None else key for row, key in enumerate(keys)]


class _SparseFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some segments are known.

    pyarrow reads a row group through it as if it were the whole shard; a read outside
    the known segments is an ``OSError`` (it would mean the index and the bytes disagree).
    """

    def __init__(self, size: int, segments: list[tuple[int, bytes | memoryview]]) -> None:
        super().__init__()
        self._size = size
        self._segments = [(start, memoryview(data).cast("B")) for start, data in segments]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        if end <= self._pos:
            return b""
        for start, data in self._segments:
            if start <= self._pos and end <= start + len(data):
                chunk = bytes(data[self._pos - start : end - start])
                self._pos = end
                return chunk
        raise OSError(f"bytes [{self._pos}, {end}) of the shard are not in the fetched range")

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def _sparse(data: bytes | memoryview, base: int, index: ParquetIndex) -> _SparseFile:
    """The shard as pyarrow reads it: ``data`` from ``base``, and the footer."""
    from shardstream.formats.parquet.index import MAGIC

    footer = index.footer
    tail = footer + struct.pack("<I", len(footer)) + MAGIC
    return _SparseFile(index.file_size, [(base, data), (index.file_size - len(tail), tail)])


def _rows_at(
    data: bytes | memoryview,
    base: int,
    index: ParquetIndex,
    rows: np.ndarray,
    name: str,
    wanted: Mapping[str, str],
) -> SampleColumns:
    """The rows at ``rows`` (sorted or not), as columns: their row groups are read once."""
    import pyarrow.parquet as pq

    from shardstream.formats.parquet.index import KEY_COLUMN
    from shardstream.formats.parquet.typed import values_of

    groups = index.row_groups_of(rows)
    needed, at = np.unique(groups, return_inverse=True)
    counts = index.group_rows(needed)
    offsets = np.cumsum(counts) - counts  # where each needed group starts in the table
    taken = offsets[at] + rows - index.first_rows(groups)
    try:
        parquet = pq.ParquetFile(_sparse(data, base, index), metadata=index.metadata, pre_buffer=False)
        table = _taken(parquet.read_row_groups(needed.tolist(), use_threads=False), taken)
        names = [n for n in table.column_names if n != KEY_COLUMN]  # a non-str __key__ is no sample data
        typed = index.typed_columns  # read back as the bytes they were made from: NOTE [ Typed columns ]
        columns = [values_of(table.column(n), n in typed, wanted.get(n)) for n in names]
    except _arrow_errors() as error:
        raise FormatError(f"cannot decode {len(rows)} rows: {error}", shard=name) from None
    values = [column for column, _ in columns]
    return SampleColumns(tuple(names), index.keys_at(rows), values, tuple(kind for _, kind in columns))


def _taken(table: pa.Table, taken: np.ndarray) -> pa.Table:
    """``table.take(taken)``; a slice where ``taken`` is consecutive rows (a read's runs in
    order: the usual case). The slice is free, and calls no compute kernel: the first
    ``take`` in a forked process (a DataLoader worker whose parent read no Parquet) cost
    ~0.3 s, setting up what later calls reuse."""
    count = len(taken)
    if count and int(taken[-1]) - int(taken[0]) == count - 1 and bool((np.diff(taken) == 1).all()):
        return table.slice(int(taken[0]), count)
    return table.take(taken)


def _rows(
    data: bytes | memoryview, base: int, index: ParquetIndex, start: int, stop: int, name: str
) -> Iterator:
    import pyarrow.parquet as pq

    from shardstream.formats.parquet.index import KEY_COLUMN
    from shardstream.formats.parquet.typed import as_bytes

    lo, hi = index.row_groups(start, stop)
    try:
        parquet = pq.ParquetFile(_sparse(data, base, index), metadata=index.metadata, pre_buffer=False)
        table = parquet.read_row_groups(list(range(lo, hi)), use_threads=False)
        table = table.slice(start - index.first_row(lo), stop - start)
        names = [n for n in table.column_names if n != KEY_COLUMN]  # a non-str __key__ is no sample data
        typed = index.typed_columns  # read back as the bytes they were made from: NOTE [ Typed columns ]
        columns = [as_bytes(table.column(n)) if n in typed else table.column(n).to_pylist() for n in names]
    except _arrow_errors() as error:
        raise FormatError(f"cannot decode rows [{start}, {stop}): {error}", shard=name) from None
    keys = index.key_slice(start, stop)
    return map(dict, map(zip, repeat(("__key__", *names)), zip(keys, *columns, strict=True)))
