"""Decoding many samples at once: field by field, with the same results as one by one.

# NOTE [ Bulk decode ]
# Decoding sample by sample costs a dict, an extension lookup and a Python call per field
# per sample: for small samples, most of a decoded epoch. A window (or a
# batch of random reads) is decoded here column by column instead: each field's decoder is
# looked up once, its column decoded in one pass, and the sample dicts built by one
# compiled builder per field tuple (NOTE [ Fast tar decode ]). A streamed window comes
# from the reader as columns already (``SampleColumns``, NOTE [ One call per read ]), so
# no undecoded dict is built at all; a list of samples (a batch of random reads, a window
# with samples the format could not read, a shard of mixed fields) is grouped by field
# names first (one group in the usual case) and taken apart into columns. For the
# built-in decoders a column is one C-level ``map`` (text: ``bytes.decode``; integers: ``int``, which
# parses bytes as ``int(bytes(x))`` does) or, for JSON, ``orjson.loads`` mapped over the
# column where it gives what ``json.loads`` does (NOTE [ JSON by orjson ] in decode.py),
# else one C scanner call per value over the column joined into one ASCII string: no
# ``json.loads`` frames, no encoding sniffing. The scanner must end each value exactly
# where its bytes end; anything else (leading whitespace, a non-ASCII column, a NUL, a bad
# value) falls back to ``json.loads`` per value, so the values are always those
# ``json.loads`` gives. Typed Parquet values (not bytes)
# pass through without a call per value. Which values are bytes to decode and which typed
# values to pass is read off their types, unless the format says it of the whole column
# (``SampleColumns.kinds``: a tar member is always bytes, a typed Parquet column never):
# then no value's type is looked at, a pass over each column of every chunk saved.
# Errors are exactly those of ``SampleDecoder.__call__``: a failing column is redone value
# by value to find which sample failed; a sample keeps the error of its first failing
# field (dict order), with the same message, and only that sample is skipped with
# ``on_error="skip"``. A user decoder is called value by value (once per value), in
# sample order within each field.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from shardstream.dataset.columns import ColumnDecoding, Errors, decode_column, raw_column
from shardstream.dataset.decode import (
    SampleDecoder,
)
from shardstream.dataset.mixture_reader import STREAM_KEY
from shardstream.dataset.reader import report_skip
from shardstream.errors import FormatError, ShardstreamError
from shardstream.formats.base import SampleColumns, sample_builder

__all__ = [
    "CHUNK",
    "StreamDecoders",
    "WindowDecoding",
    "decode_columns",
    "decode_samples",
    "decoded_columns",
    "decoded_window",
]

# Samples of a window decoded at a time: enough for the columns' C-level passes, few
# enough that a chunk's decoded objects are mostly gone before the cyclic GC's next young
# collection, so they are not promoted to be rescanned by full collections over a heap
# that holds the whole window; bigger chunks decode markedly slower
# (tools/bench_stream.py measures decode=True against decode=False).
CHUNK = 64
_first = itemgetter(0)


@dataclass(frozen=True)
class StreamDecoders:
    """A mixture whose streams decode apart: stream ``i``'s samples (``__stream__`` = i)
    go through ``decoders[i]``, or stay raw bytes where it is ``None``."""

    decoders: tuple[SampleDecoder | None, ...]


def decode_samples(
    decoder: SampleDecoder | StreamDecoders,
    samples: list[Any],
    *,
    url: str | None = None,
    shard: str | None = None,
) -> tuple[list[Any], Errors]:
    """``[decoder(s) for s in samples]`` in bulk (NOTE [ Bulk decode ]): the decoded
    samples (``None`` stays ``None``; a sample that failed is ``None`` too) and the error
    of each failed sample by position, as ``decoder(s, url=url, shard=shard)`` raises it."""
    if isinstance(decoder, StreamDecoders):
        return _by_stream(decoder, samples, url, shard)
    out: list[Any] = [None] * len(samples)
    errors: Errors = {}
    for fields, positions in _groups(samples).items():
        group = samples if len(positions) == len(samples) else [samples[p] for p in positions]
        decoded, failures = _decode_group(decoder, fields, group, url, shard)
        if len(positions) == len(samples):
            out = decoded
        else:
            for position, sample in zip(positions, decoded, strict=True):
                out[position] = sample
        for number, error in failures.items():
            out[positions[number]] = None
            errors[positions[number]] = error
    return out, errors


def _by_stream(
    decoders: StreamDecoders, samples: list[Any], url: str | None, shard: str | None
) -> tuple[list[Any], Errors]:
    """:func:`decode_samples` of a mixture's samples, each stream's with its own decoder."""
    out: list[Any] = list(samples)
    errors: Errors = {}
    streams: dict[int, list[int]] = {}
    for position, sample in enumerate(samples):
        if sample is not None:
            streams.setdefault(sample[STREAM_KEY], []).append(position)
    for stream, positions in streams.items():
        decoder = decoders.decoders[stream]
        if decoder is None:
            continue
        decoded, failures = decode_samples(decoder, [samples[p] for p in positions], url=url, shard=shard)
        for position, sample in zip(positions, decoded, strict=True):
            out[position] = sample
        errors.update((positions[number], error) for number, error in failures.items())
    return out, errors


def _groups(samples: list[Any]) -> dict[tuple[str, ...], list[int]]:
    """Positions of the samples by their field names (``None`` samples in no group)."""
    try:
        shapes = set(map(tuple, samples))  # tuple(dict): its keys; tuple(None) raises
    except TypeError:
        shapes = set()
    if len(shapes) == 1:
        return {shapes.pop(): list(range(len(samples)))}
    groups: dict[tuple[str, ...], list[int]] = {}
    for position, sample in enumerate(samples):
        if sample is not None:
            groups.setdefault(tuple(sample), []).append(position)
    return groups


def _decode_group(
    decoder: SampleDecoder, fields: tuple[str, ...], samples: list[Any], url: str | None, shard: str | None
) -> tuple[list[Any], Errors]:
    """Samples that all have ``fields`` (in this order), decoded column by column."""
    columns = [list(map(itemgetter(name), samples)) for name in fields]
    errors: Errors = {}
    key_of = _key_of(samples)
    for number, name in enumerate(fields):
        function = decoder.lookup(name)
        if function is None:
            columns[number] = raw_column(columns[number])
            continue
        columns[number] = decode_column(decoder, function, name, columns[number], key_of, errors, url, shard)
    if fields and fields[0] == "__key__":
        decoded = list(map(sample_builder(fields[1:]), *columns))
    else:
        decoded = list(map(dict, map(zip, repeat(fields), zip(*columns, strict=True))))
    return decoded, errors


def _key_of(samples: list[Any]) -> Callable[[int], object]:
    return lambda position: samples[position].get("__key__")


def decode_columns(
    decoder: SampleDecoder, columns: SampleColumns, *, url: str | None = None, shard: str | None = None
) -> tuple[list[Any], Errors]:
    """``decode_samples(decoder, columns.samples())`` without building the undecoded
    samples: each column decoded, then each sample's dict built once. The columns'
    field names are distinct (``SampleColumns.samples`` keeps a repeated one's last value)."""
    return ColumnDecoding.of(decoder, columns.fields, url, shard)(columns.keys, columns.values, columns.kinds)


@dataclass(slots=True)
class WindowDecoding:
    """What a dataset's windows are decoded with in bulk (``decoded_window``,
    ``decoded_columns``): ``decoder`` for samples given as a list (a mixture whose streams
    decode apart gives its ``StreamDecoders``), ``columns`` for samples given as columns,
    the ``transform``, and ``skip`` (``on_error="skip"``): a sample that cannot be read
    or decoded is then left out and counted in ``skipped``, in this process."""

    decoder: SampleDecoder | StreamDecoders | None
    columns: SampleDecoder | None
    transform: Callable[[dict[str, Any]], Any] | None
    skip: bool
    url: str
    skipped: int = 0

    def skipping(self, error: FormatError) -> None:
        """Count ``error``'s sample as skipped (and log the first of its shard)."""
        self.skipped += 1
        report_skip(error)


def decoded_window(
    decoding: WindowDecoding, ordered: Iterator[Any], window: Any, reader: Any
) -> Iterator[Any]:
    """What a dataset yields for one window given as a list of samples (some ``None``:
    skipped by the format), decoded in bulk.

    ``ordered`` is the window's iterator over its samples in yield order; it is advanced
    in step with what is yielded (the dataset's iteration count reads it), so the samples are
    taken from a copy of it.
    """
    if decoding.decoder is None:
        return _undecoded(decoding, ordered)
    samples = list(copy.copy(ordered))  # a list iterator (_Iteration.start_window's)
    return _chunks(decoding, decoding.decoder, samples, ordered, window, reader)


def _undecoded(decoding: WindowDecoding, ordered: Iterator[Any]) -> Iterator[Any]:
    """The samples of one undecoded window (``decode=False``), those the format could not
    read with ``on_error="skip"`` left out and counted."""
    transform = decoding.transform
    for sample in ordered:
        if sample is None:  # the shard format could not decode it (on_error="skip")
            decoding.skipped += 1
            continue
        yield sample if transform is None else transform(sample)


def decoded_columns(
    decoding: WindowDecoding, columns: SampleColumns, ordered: Iterator[Any], window: Any, reader: Any
) -> Iterator[Any]:
    """What a dataset yields for one window given as columns (in yield order), decoded a
    ``CHUNK`` at a time; ``ordered`` is advanced in step with what is yielded, as in
    :func:`decoded_window`."""
    decoder = decoding.columns
    if decoder is None:
        raise ShardstreamError("a window came as columns to a dataset that does not decode", url=decoding.url)
    if len(set(columns.fields)) != len(columns.fields):  # a repeated name: as the samples have it
        return _chunks(decoding, decoder, columns.samples(), ordered, window, reader)
    return _column_chunks(decoding, decoder, columns, ordered, window, reader)


def _column_chunks(
    decoding: WindowDecoding,
    decoder: SampleDecoder,
    columns: SampleColumns,
    ordered: Iterator[Any],
    window: Any,
    reader: Any,
) -> Iterator[Any]:
    keys, values, kinds = columns.keys, columns.values, columns.kinds
    decode = ColumnDecoding.of(decoder, columns.fields, decoding.url, None)  # once per window

    def chunk(lo: int) -> Iterator[Any]:
        decoded, errors = decode(keys[lo : lo + CHUNK], [column[lo : lo + CHUNK] for column in values], kinds)
        return _yielded(
            decoding, decoded, errors, itertools.islice(ordered, len(decoded)), window, reader, lo
        )

    return chain.from_iterable(map(chunk, range(0, len(keys), CHUNK)))


def _chunks(
    decoding: WindowDecoding,
    decoder: SampleDecoder | StreamDecoders,
    samples: list[Any],
    ordered: Iterator[Any],
    window: Any,
    reader: Any,
) -> Iterator[Any]:
    """The window's samples decoded ``CHUNK`` at a time (NOTE [ Bulk decode ])."""

    def chunk(lo: int) -> Iterator[Any]:
        part = samples[lo : lo + CHUNK]
        decoded, errors = decode_samples(decoder, part, url=decoding.url)
        taken = itertools.islice(ordered, len(part))
        if None in part:  # a sample the format could not read: skipped, and counted
            return _with_errors(decoding, decoded, errors, taken, window, reader, lo)
        return _yielded(decoding, decoded, errors, taken, window, reader, lo)

    return chain.from_iterable(map(chunk, range(0, len(samples), CHUNK)))


# NOTE [ Chunks chained ]
# A window's chunks are decoded one at a time, as its samples are taken, and chained by
# ``itertools.chain``, not yielded by a generator of their own: every sample then passes
# through C code alone between the decoded chunk and the dataset's generator (a generator
# here would resume once per sample, a cost the undecoded stream does not pay).
def _yielded(
    decoding: WindowDecoding,
    decoded: list[Any],
    errors: Errors,
    taken: Iterator[Any],
    window: Any,
    reader: Any,
    base: int,
) -> Iterator[Any]:
    """One decoded chunk's samples, ``taken`` (its part of the window's iterator) advanced
    in step (NOTE [ Chunks chained ])."""
    if errors:
        return _with_errors(decoding, decoded, errors, taken, window, reader, base)
    out = map(_first, zip(decoded, taken, strict=True))  # the hot path: C code only, but the transform
    return out if decoding.transform is None else map(decoding.transform, out)


def _with_errors(
    decoding: WindowDecoding,
    decoded: list[Any],
    errors: Errors,
    ordered: Iterator[Any],
    window: Any,
    reader: Any,
    base: int,
) -> Iterator[Any]:
    """One chunk with a failed or unreadable sample: the others yielded, that one raised or
    skipped as ``on_error`` says; ``base``: the chunk's first position."""
    transform = decoding.transform
    for position, (sample, _) in enumerate(zip(decoded, ordered, strict=True)):
        error = errors.get(position)
        if error is not None:
            if not isinstance(error, FormatError):
                raise error
            located = reader.locate(error, window, int(window.order[base + position]))
            if not decoding.skip:
                raise located from error
            decoding.skipping(located)
            continue
        if sample is None:  # the shard format could not decode it (on_error="skip")
            decoding.skipped += 1
            continue
        yield sample if transform is None else transform(sample)
