"""Parquet files (one, or a folder of them as Spark and Ray write): one sample per row.

A ``__key__`` column names the samples; without one a sample is named by its number
across all files (``000000042``). Files are read in order of path, a row group at a
time; Spark's ``_SUCCESS`` markers are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from shardstream.errors import PackError
from shardstream.pack.sources.base import (
    Entry,
    Source,
    folder_of,
    has_suffix,
    open_input,
    sample_key,
    source_files,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

_BATCH_ROWS = 1024


class ParquetSource(Source):
    """A Parquet file, or a folder holding only Parquet files."""

    name = "parquet"

    @classmethod
    def detect(cls, url: str, storage_options: Mapping[str, Any], is_dir: bool) -> bool:
        if not is_dir:
            return has_suffix(url, (".parquet",), compressed=False)
        return folder_of(url, storage_options, (".parquet",))

    def _files(self) -> list[str]:
        return source_files(self.url, self.storage_options, (".parquet",))

    def count(self) -> int:
        total = 0
        for path in self._files():
            with open_input(path, self.storage_options) as f:
                total += _parquet(f, path).metadata.num_rows
        return total

    def estimate(self) -> int | None:
        return self.count()

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[Entry]:
        number = 0
        for path in self._files():
            if stop is not None and number >= stop:
                return
            with open_input(path, self.storage_options) as f:
                pf = _parquet(f, path)
                rows = pf.metadata.num_rows
                if number + rows <= start:
                    number += rows
                    continue
                yield from self._rows(pf, path, number, start, stop)
                number += rows

    def _rows(
        self, pf: pq.ParquetFile, path: str, number: int, start: int, stop: int | None
    ) -> Iterator[Entry]:
        """Entries of one file whose first row is sample ``number`` of the source."""
        import pyarrow as pa  # on demand: NOTE [ pyarrow on demand ] in shardstream.formats.parquet

        groups = []
        for group in range(pf.metadata.num_row_groups):
            rows = pf.metadata.row_group(group).num_rows
            if number + rows > start:
                groups.append(group)
            else:
                number += rows
        try:
            pairs = _maps_as_pairs(pf.schema_arrow)
            for batch in pf.iter_batches(batch_size=_BATCH_ROWS, row_groups=groups, use_threads=False):
                if pairs is not None:
                    batch = batch.cast(pairs)
                for sample in batch.to_pylist():
                    if stop is not None and number >= stop:
                        return
                    if number >= start:
                        key = sample.pop("__key__", None)
                        key = sample_key(number) if key is None else str(key)
                        sample["__key__"] = key
                        yield Entry(key, sample, None, path)
                    number += 1
        except (OSError, pa.ArrowException) as error:
            raise PackError(f"cannot read Parquet file: {error}", url=path) from None


def _maps_as_pairs(schema: pa.Schema) -> pa.Schema | None:
    """``schema`` with each map column (nested too) as a list of ``{"key", "value"}``
    structs, or None where it has none. A map comes out of Arrow as a list of (key,
    value) tuples, which no column type holds (its items mix types); the structs are how
    Parquet itself stores a map, so no key or value is lost, whatever their types, and a
    tar shard holds them as JSON."""
    import pyarrow as pa

    fields = [field.with_type(_pairs(field.type)) for field in schema]
    changed = any(field.type != old.type for field, old in zip(fields, schema, strict=True))
    return pa.schema(fields, metadata=schema.metadata) if changed else None


def _pairs(arrow_type: pa.DataType) -> pa.DataType:
    import pyarrow as pa

    if pa.types.is_map(arrow_type):
        entry = pa.struct(
            [
                pa.field("key", _pairs(arrow_type.key_type), nullable=False),
                pa.field("value", _pairs(arrow_type.item_type)),
            ]
        )
        return pa.list_(entry)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        item = _pairs(arrow_type.value_type)
        return pa.large_list(item) if pa.types.is_large_list(arrow_type) else pa.list_(item)
    if pa.types.is_struct(arrow_type):
        return pa.struct(
            [
                arrow_type.field(i).with_type(_pairs(arrow_type.field(i).type))
                for i in range(arrow_type.num_fields)
            ]
        )
    return arrow_type


def _parquet(f: Any, path: str) -> pq.ParquetFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f)
    except (OSError, pa.ArrowException) as error:
        raise PackError(f"not a readable Parquet file: {error}", url=path) from None
