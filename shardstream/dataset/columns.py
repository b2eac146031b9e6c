"""One field's values decoded at a time, with the values and errors of decoding them
one by one (NOTE [ Bulk decode ] in bulk.py): the column forms of the built-in decoders,
and what decodes a window's columns chunk by chunk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardstream.dataset.decode import (
    BYTES_TYPES,
    Decoder,
    SampleDecoder,
    column_form,
    failed,
    is_pickle,
    refused,
)
from shardstream.errors import ShardstreamError
from shardstream.formats.base import sample_builder
from shardstream.formats.samples import BYTES_COLUMN, TYPED_COLUMN, UNKNOWN_COLUMN

__all__ = ["ColumnDecoding", "Errors", "decode_column", "raw_column"]

Errors = dict[int, ShardstreamError]  # position in the samples -> the error of that sample
_ONLY_BYTES = frozenset({bytes})


@dataclass(frozen=True, slots=True)
class ColumnDecoding:
    """How columns of ``fields`` decode: each field's decoder looked up and the sample
    builder made once (per window), then applied to each chunk's columns."""

    decoder: SampleDecoder
    fields: tuple[str, ...]
    functions: tuple[Decoder | None, ...]
    build: Callable[..., dict[str, Any]]
    url: str | None
    shard: str | None

    @classmethod
    def of(
        cls, decoder: SampleDecoder, fields: tuple[str, ...], url: str | None, shard: str | None
    ) -> ColumnDecoding:
        functions = tuple(map(decoder.lookup, fields))
        return cls(decoder, fields, functions, sample_builder(fields), url, shard)

    def __call__(
        self, keys: list[str], values: list[list[Any]], kinds: tuple[str, ...] = ()
    ) -> tuple[list[Any], Errors]:
        """The samples of ``keys`` and ``values`` (a column per field) decoded, and the
        error of each that failed; ``kinds``: what the format knows of each column's
        types (``SampleColumns.kinds``), which spares looking at every value's."""
        errors: Errors = {}
        decoded = [
            self._column(number, kinds[number] if kinds else UNKNOWN_COLUMN, column, keys, errors)
            for number, column in enumerate(values)
        ]
        return list(map(self.build, keys, *decoded)), errors

    def _column(
        self, number: int, kind: str, column: list[Any], keys: list[str], errors: Errors
    ) -> list[Any]:
        function = self.functions[number]
        if kind == TYPED_COLUMN or (function is None and kind == BYTES_COLUMN):
            return column  # nothing to decode, no memoryview to make bytes of
        if function is None:
            return raw_column(column)
        name = self.fields[number]
        return decode_column(
            self.decoder,
            function,
            name,
            column,
            keys.__getitem__,
            errors,
            self.url,
            self.shard,
            all_bytes=kind == BYTES_COLUMN,
        )


def raw_column(values: list[Any]) -> list[Any]:
    """A field without a decoder: its values as they are, a memoryview as bytes."""
    if memoryview not in set(map(type, values)):
        return values
    return [bytes(value) if isinstance(value, memoryview) else value for value in values]


def decode_column(
    decoder: SampleDecoder,
    function: Decoder,
    name: str,
    values: list[Any],
    key_of: Callable[[int], object],
    errors: Errors,
    url: str | None,
    shard: str | None,
    *,
    all_bytes: bool = False,
) -> list[Any]:
    """One field's values decoded (``key_of(position)``: the key of the sample at that
    position); the errors of failing samples go into ``errors`` (a sample's first error is
    kept). ``all_bytes``: every value is known to be a ``bytes``, so no value's type is looked at."""
    kinds = _ONLY_BYTES if all_bytes else set(map(type, values))
    fast = column_form(function)  # None for pickle: refused or not, value by value below
    if fast is not None and kinds == _ONLY_BYTES:
        try:
            return fast(values)
        except Exception:  # redone one by one below, to find the sample
            pass
    elif kinds.isdisjoint(BYTES_TYPES) and not any(issubclass(kind, BYTES_TYPES) for kind in kinds):
        return values  # typed values (a Parquet column): nothing to decode
    refuse = is_pickle(function) and not decoder.allow_pickle
    out: list[Any] = []
    for position, value in enumerate(values):
        if not isinstance(value, BYTES_TYPES):
            out.append(value)
            continue
        try:
            if refuse:
                raise refused(name, key_of(position), url=url, shard=shard)
            out.append(function(value))
            continue
        except ShardstreamError as error:
            errors.setdefault(position, error)
        except Exception as error:
            made = failed(name, key_of(position), error, url=url, shard=shard)
            made.__cause__ = error
            errors.setdefault(position, made)
        out.append(None)
    return out
