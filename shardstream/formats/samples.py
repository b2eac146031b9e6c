"""Samples as a format gives them: dicts (``Sample``) or columns (``SampleColumns``), built
by a function compiled once per field tuple; the positions of runs of samples; and the
check every format's ``decode`` makes first, that the bytes it got hold the samples asked."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from shardstream.errors import FormatError
from shardstream.types import ByteRange

Sample = dict[str, Any]

# What ``SampleColumns.kinds`` knows of a column: every value is a ``bytes`` (a tar
# member), no value is bytes-like (a typed Parquet column: ``str``, ``int``, ``None``...),
# or nothing (the values' types must be looked at).
BYTES_COLUMN, TYPED_COLUMN, UNKNOWN_COLUMN = "bytes", "typed", ""


@dataclass(slots=True)
class SampleColumns:
    """Samples with the same fields, a column per field: sample ``i`` is
    ``{"__key__": keys[i], fields[0]: values[0][i], ...}``, as :meth:`samples` builds it
    (a repeated name keeps its last value, as in a dict). A format's ``decode_runs`` gives
    these, so that a reader reorders and decodes a column at a time and builds each
    sample's dict once (NOTE [ Bulk decode ] in shardstream/dataset/bulk.py)."""

    fields: tuple[str, ...]
    keys: list[str]
    values: list[list[Any]]
    # per column, what its format knows of its values' types (BYTES_COLUMN, TYPED_COLUMN or
    # UNKNOWN_COLUMN), so that a decoder need not look at every value to tell bytes to
    # decode from typed values to pass through; empty: nothing known of any column
    kinds: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.keys)

    def kind(self, column: int) -> str:
        """What is known of column ``column``'s values (``UNKNOWN_COLUMN`` where nothing is)."""
        return self.kinds[column] if self.kinds else UNKNOWN_COLUMN

    def samples(self) -> list[Sample]:
        return list(map(sample_builder(self.fields), self.keys, *self.values))

    def take(self, positions: list[int]) -> SampleColumns:
        """The samples at ``positions``, in that order."""
        return SampleColumns(
            self.fields,
            list(map(self.keys.__getitem__, positions)),
            [list(map(column.__getitem__, positions)) for column in self.values],
            self.kinds,
        )

    @staticmethod
    def joined(parts: Sequence[SampleColumns]) -> SampleColumns | None:
        """``parts`` one after the other, or None when their fields differ."""
        if not parts or any(part.fields != parts[0].fields for part in parts):
            return None
        if len(parts) == 1:
            return parts[0]
        keys = list(chain.from_iterable(part.keys for part in parts))
        values = [
            list(chain.from_iterable(part.values[f] for part in parts)) for f in range(len(parts[0].fields))
        ]
        kinds = tuple(
            parts[0].kind(f) if all(part.kind(f) == parts[0].kind(f) for part in parts) else UNKNOWN_COLUMN
            for f in range(len(parts[0].fields))
        )
        return SampleColumns(parts[0].fields, keys, values, kinds)


def check_covers_all(
    data: bytes | memoryview,
    rng: ByteRange,
    needs: tuple[np.ndarray, np.ndarray],
    starts: np.ndarray,
    stops: np.ndarray,
    name: str,
) -> None:
    """``check_covers`` for every run ``[starts[i], stops[i])`` of byte range
    ``needs[0][i], needs[1][i]``: raises the error of the first that ``data`` lacks."""
    lo, hi = needs
    short = (lo < rng.start) | (hi > rng.end) | (hi - rng.start > len(data))
    if bool(short.any()):
        i = int(np.argmax(short))
        need = ByteRange(int(lo[i]), int(hi[i]))
        check_covers(data, rng, need, int(starts[i]), int(stops[i]), name)


def run_positions(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The sample positions of runs ``[starts[i], stops[i])`` one after the other (int64)."""
    lengths = np.maximum(stops - starts, 0)
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    return np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)


def check_covers(
    data: bytes | memoryview, rng: ByteRange, need: ByteRange, start: int, stop: int, name: str
) -> None:
    """Raise ``FormatError`` unless ``data`` (the bytes of ``rng``) holds ``need``, the bytes
    of samples ``[start, stop)``: what every format's ``decode`` checks first."""
    if need.start < rng.start or need.end > rng.end or need.end - rng.start > len(data):
        raise FormatError(
            f"samples [{start}, {stop}) need bytes [{need.start}, {need.end}) but got "
            f"[{rng.start}, {rng.start + len(data)}) of range [{rng.start}, {rng.end})",
            shard=name,
            offset=need.start,
        )


@functools.lru_cache(maxsize=256)
def sample_builder(fields: tuple[str, ...]) -> Callable[..., Sample]:
    """``f(key, *values) -> {"__key__": key, fields[0]: values[0], ...}``, compiled once
    per field tuple (see NOTE [ Fast tar decode ] in formats/tar/read.py;
    the bulk decoder builds decoded samples with it too). A repeated name keeps its last value,
    as ``dict(zip(...))`` does."""
    params = ", ".join(f"v{i}" for i in range(len(fields)))
    entries = "".join(f"{name!r}: v{i}, " for i, name in enumerate(fields))
    text = f"lambda key{', ' if params else ''}{params}: {{'__key__': key, {entries}}}"
    code = compile(text, "<shardstream tar sample>", "eval")
    builder: Callable[..., Sample] = eval(code, {"__builtins__": {}})
    return builder
