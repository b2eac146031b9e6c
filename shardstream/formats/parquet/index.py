"""The sample index of a Parquet shard: its footer and where each row group lies.

A sample is a row. Rows are read a row group at a time, so the byte range of a run of
rows is the union of the row groups holding them. The sidecar keeps the file's footer
too, so a reader parses the schema and row-group metadata without touching the shard,
and decodes from nothing but the fetched row-group bytes (see ``_SparseFile``).
"""

from __future__ import annotations

import struct
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.errors import FormatError, UsageError
from shardstream.formats._sidecar import (
    StringTable,
    array_section,
    pack_sidecar,
    read_array,
    unpack_strings,
    unpack_versioned,
)
from shardstream.formats.base import SampleIndex
from shardstream.formats.checks import ShardChecks
from shardstream.formats.parquet.typed import EXTENSION_KEY
from shardstream.types import ByteRange

KEY_COLUMN = "__key__"
MAGIC = b"PAR1"
_KIND = b"pq\0\0"
_VERSION = 2  # 2: the shard's checks follow the index (NOTE [ Checksummed reads ]); 1 still loads
_SECTIONS = {1: 5, 2: 8}
_MAX_ROWS = 1 << 48  # rows in one shard beyond this are corruption, and would overflow sums


def parse_footer(footer: bytes, *, name: str) -> pq.FileMetaData:
    """The ``FileMetaData`` of a footer (the thrift bytes before the length and magic)."""
    framed = MAGIC + footer + struct.pack("<I", len(footer)) + MAGIC
    try:
        return pq.read_metadata(pa.BufferReader(framed))
    except (pa.ArrowException, OSError, ValueError) as error:
        raise FormatError(f"corrupt Parquet footer: {error}", shard=name) from None


def row_group_spans(metadata: pq.FileMetaData) -> np.ndarray:
    """(first row, rows, byte start, byte end) per row group, as parquet-cpp computes column ranges."""
    spans = np.zeros((metadata.num_row_groups, 4), dtype=np.int64)
    first = 0
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        start, end = None, 0
        for j in range(group.num_columns):
            column = group.column(j)
            col_start = column.data_page_offset
            dictionary = column.dictionary_page_offset
            if column.has_dictionary_page and dictionary and 0 < dictionary < col_start:
                col_start = dictionary
            start = col_start if start is None else min(start, col_start)
            end = max(end, col_start + column.total_compressed_size)
        spans[i] = (first, group.num_rows, start or 0, end)
        first += group.num_rows
    return spans


class ParquetIndex(SampleIndex):
    """Row groups of one Parquet shard, its footer, and the sample keys when it has a key column."""

    def __init__(
        self,
        *,
        name: str,
        file_size: int,
        footer: bytes,
        spans: np.ndarray,
        keys: list[str] | StringTable | None,
    ) -> None:
        self._name = name
        self._file_size = int(file_size)
        self._footer = bytes(footer)
        self._spans = np.asarray(spans, dtype=np.int64).reshape(-1, 4)
        # NOTE [ Keys on first use ] (in _sidecar.py): a loaded sidecar's keys stay a table
        self._keys = keys if keys is None or isinstance(keys, StringTable) else StringTable.of(list(keys))
        rows = self._spans[:, 1]
        problems = []
        if len(rows) and (int(rows.min()) < 0 or sum(rows.tolist()) > _MAX_ROWS):
            raise FormatError("inconsistent Parquet sample index: bad row counts", shard=name)
        self._num_samples = int(rows.sum())  # no overflow: checked above
        if len(self._footer) + 12 > self._file_size:
            problems.append("footer larger than the file")
        if len(rows) and (
            bool(np.any(rows < 0))
            or bool(np.any(self._spans[:, 0] != np.concatenate(([0], np.cumsum(rows)[:-1]))))
            or bool(np.any(self._spans[:, 2] > self._spans[:, 3]))
            or int(self._spans[:, 2].min()) < 0
            or int(self._spans[:, 3].max()) > self._file_size - len(self._footer) - 8
        ):
            problems.append("row groups out of order or outside the file")
        if keys is not None and len(keys) != self._num_samples:
            problems.append(f"{len(keys)} keys for {self._num_samples} rows")
        if problems:
            raise FormatError("inconsistent Parquet sample index: " + "; ".join(problems), shard=name)

    @property
    def name(self) -> str:
        return self._name

    @property
    def num_samples(self) -> int:
        return self._num_samples

    @property
    def keys(self) -> list[str]:
        if self._keys is not None:
            return list(self._keys.strings())
        return [f"{self._name}:{row}" for row in range(self._num_samples)]

    def key_slice(self, start: int, stop: int) -> list[str]:
        if self._keys is not None:
            return self._keys.strings()[start:stop]
        return [f"{self._name}:{row}" for row in range(start, stop)]

    @property
    def file_size(self) -> int:
        return self._file_size

    @property
    def footer(self) -> bytes:
        return self._footer

    @property
    def num_row_groups(self) -> int:
        return len(self._spans)

    @cached_property
    def metadata(self) -> pq.FileMetaData:
        return parse_footer(self._footer, name=self._name)

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        try:
            return self.metadata.schema.to_arrow_schema()
        except (pa.ArrowException, ValueError) as error:
            raise FormatError(f"Parquet schema has no Arrow equivalent: {error}", shard=self._name) from None

    @cached_property
    def typed_columns(self) -> frozenset[str]:
        """The columns made from bytes fields and stored typed, which shardstream reads back
        as those bytes (NOTE [ Typed columns ] in ``typed``)."""
        return frozenset(
            f.name
            for f in self.arrow_schema
            if EXTENSION_KEY in (f.metadata or {})
            and not (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))
        )

    @property
    def key_column(self) -> str | None:
        """``"__key__"`` when the shard names its samples in that column, else None."""
        return KEY_COLUMN if self._keys is not None else None

    @property
    def fields(self) -> tuple[str, ...]:
        """The columns of a sample, in file order, ``__key__`` aside (the sample's name, or nothing)."""
        return tuple(n for n in self.arrow_schema.names if n != KEY_COLUMN)

    @property
    def schema(self) -> dict[str, str]:
        """Column name -> Arrow type, for the manifest."""
        return {f.name: str(f.type) for f in self.arrow_schema}

    def row_groups(self, start: int, stop: int) -> tuple[int, int]:
        """The row groups ``[lo, hi)`` holding rows ``[start, stop)`` (``start < stop``)."""
        first = self._spans[:, 0]
        lo = int(np.searchsorted(first, start, side="right")) - 1
        hi = int(np.searchsorted(first, stop - 1, side="right"))
        return lo, hi

    def first_row(self, group: int) -> int:
        return int(self._spans[group, 0])

    def row_groups_of(self, rows: np.ndarray) -> np.ndarray:
        """The row group of each row at ``rows``."""
        return np.searchsorted(self._spans[:, 0], rows, side="right") - 1

    def first_rows(self, groups: np.ndarray) -> np.ndarray:
        return self._spans[groups, 0]

    def group_rows(self, groups: np.ndarray) -> np.ndarray:
        """The number of rows of each row group at ``groups``."""
        return self._spans[groups, 1]

    def keys_at(self, rows: np.ndarray) -> list[str]:
        """The keys of the samples at ``rows``, in that order."""
        if self._keys is not None:
            return self._keys.at(rows)
        return [f"{self._name}:{row}" for row in rows.tolist()]

    def byte_ranges(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, spans = self._num_samples, self._spans
        outside = (starts < 0) | (starts > stops) | (stops > n)
        if bool(outside.any()) or not self._in_file_order():
            return super().byte_ranges(starts, stops)  # the errors, or row groups out of file order
        lo, hi = np.zeros(starts.shape, dtype=np.int64), np.zeros(starts.shape, dtype=np.int64)
        some = starts < stops  # an empty run's range is (0, 0)
        if bool(some.any()):
            first = spans[:, 0]
            lo[some] = spans[np.searchsorted(first, starts[some], side="right") - 1, 2]
            hi[some] = spans[np.searchsorted(first, stops[some] - 1, side="right") - 1, 3]
        return lo, hi

    def _in_file_order(self) -> bool:
        """Whether each row group's bytes start and end after the previous one's (pyarrow's
        files, and most), so a run's bytes run from its first group's start to its last's end."""
        spans = self._spans
        return not bool(np.any(np.diff(spans[:, 2]) < 0) or np.any(np.diff(spans[:, 3]) < 0))

    def byte_range(self, start: int, stop: int) -> ByteRange:
        n = self._num_samples
        if not 0 <= start <= stop <= n:
            raise UsageError(f"sample range [{start}, {stop}) is outside [0, {n})", shard=self._name)
        if start == stop:
            return ByteRange(0, 0)
        lo, hi = self.row_groups(start, stop)
        return ByteRange(int(self._spans[lo:hi, 2].min()), int(self._spans[lo:hi, 3].max()))

    def to_bytes(self, *, with_checks: bool = True) -> bytes:
        checks = self._checks if with_checks else None
        keys = self._keys if self._keys is not None else StringTable.of([])
        key_blob, key_ends = keys.sections()
        counts = [len(self._spans), self._file_size, int(self._keys is not None), len(keys)]
        return pack_sidecar(
            _KIND,
            _VERSION,
            [
                array_section(counts, "<i8"),
                self._footer,
                array_section(self._spans, "<i8"),
                key_blob,
                key_ends,
                *(checks.sections() if checks is not None else ShardChecks.empty_sections()),
            ],
        )

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, *, name: str) -> ParquetIndex:
        version, sections = unpack_versioned(data, _KIND, (1, _VERSION), name=name)
        if len(sections) != _SECTIONS[version]:
            raise FormatError(
                f"Parquet sample index has {len(sections)} sections, expected {_SECTIONS[version]}",
                shard=name,
            )
        groups, file_size, has_keys, num_keys = read_array(
            sections[0], "<i8", 4, name=name, what="counts"
        ).tolist()
        if min(groups, file_size, num_keys) < 0 or has_keys not in (0, 1):
            raise FormatError("Parquet sample index has bad counts", shard=name)
        spans = read_array(sections[2], "<i8", 4 * groups, name=name, what="row groups")
        checks = ShardChecks.from_sections(sections[5:], name=name) if version > 1 else None
        if checks is not None and checks.size != file_size:
            raise FormatError(
                f"Parquet sample index: checks of {checks.size} bytes, file of {file_size}", shard=name
            )
        keys = unpack_strings(sections[3], sections[4], num_keys, name=name, what="keys")
        index = cls(
            name=name,
            file_size=file_size,
            footer=bytes(sections[1]),
            spans=spans,
            keys=keys if has_keys else None,
        )
        if checks is not None:
            index.bind_checks(checks)
        return index

    def __repr__(self) -> str:
        return (
            f"ParquetIndex(name={self._name!r}, samples={self._num_samples}, row_groups={len(self._spans)})"
        )
