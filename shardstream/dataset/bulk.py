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
# pass through without a call per value.
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
from itertools import repeat
from operator import itemgetter
from typing import Any

from shardstream.dataset.decode import (
    _BYTES,
    Decoder,
    SampleDecoder,
    _integer,
    _json,
    _json_column,
    _pickle,
    _text,
    failed,
    refused,
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
Errors = dict[int, ShardstreamError]  # position in the samples -> the error of that sample
_first = itemgetter(0)


# The built-ins' column forms (same values, same exceptions); see NOTE [ Bulk decode ].
_COLUMNS: dict[Decoder, Callable[[list[bytes]], list[Any]]] = {
    _text: lambda values: list(map(bytes.decode, values)),
    _integer: lambda values: list(map(int, values)),
    _json: _json_column,
}


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
            columns[number] = _raw(columns[number])
            continue
        columns[number] = _column(decoder, function, name, columns[number], key_of, errors, url, shard)
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
    errors: Errors = {}
    decoded = []
    for name, values in zip(columns.fields, columns.values, strict=True):
        function = decoder.lookup(name)
        if function is None:
            decoded.append(_raw(values))
        else:
            decoded.append(
                _column(decoder, function, name, values, columns.keys.__getitem__, errors, url, shard)
            )
    return list(map(sample_builder(columns.fields), columns.keys, *decoded)), errors


def _raw(values: list[Any]) -> list[Any]:
    """A field without a decoder: its values as they are, a memoryview as bytes."""
    if memoryview not in set(map(type, values)):
        return values
    return [bytes(value) if isinstance(value, memoryview) else value for value in values]


def _column(
    decoder: SampleDecoder,
    function: Decoder,
    name: str,
    values: list[Any],
    key_of: Callable[[int], object],
    errors: Errors,
    url: str | None,
    shard: str | None,
) -> list[Any]:
    """One field's values decoded (``key_of(position)``: the key of the sample at that
    position); the errors of failing samples go into ``errors`` (a sample's first error is kept)."""
    kinds = set(map(type, values))
    if kinds.isdisjoint(_BYTES) and not any(issubclass(kind, _BYTES) for kind in kinds):
        return values  # typed values (a Parquet column): nothing to decode
    refuse = function is _pickle and not decoder.allow_pickle
    fast = _COLUMNS.get(function)
    if fast is not None and kinds == {bytes} and not refuse:
        try:
            return fast(values)
        except Exception:  # redone one by one below, to find the sample
            pass
    out: list[Any] = []
    for position, value in enumerate(values):
        if not isinstance(value, _BYTES):
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
    transform = decoding.transform
    fields, keys, values = columns.fields, columns.keys, columns.values
    for lo in range(0, len(keys), CHUNK):
        part = SampleColumns(fields, keys[lo : lo + CHUNK], [column[lo : lo + CHUNK] for column in values])
        decoded, errors = decode_columns(decoder, part, url=decoding.url)
        taken = itertools.islice(ordered, len(decoded))
        if not errors:  # the hot path: C code only, but the transform
            out = map(_first, zip(decoded, taken, strict=True))
            yield from out if transform is None else map(transform, out)
        else:
            yield from _with_errors(decoding, decoded, errors, taken, window, reader, lo)


def _chunks(
    decoding: WindowDecoding,
    decoder: SampleDecoder | StreamDecoders,
    samples: list[Any],
    ordered: Iterator[Any],
    window: Any,
    reader: Any,
) -> Iterator[Any]:
    """The window's samples decoded ``CHUNK`` at a time (NOTE [ Bulk decode ])."""
    transform = decoding.transform
    for lo in range(0, len(samples), CHUNK):
        part = samples[lo : lo + CHUNK]
        decoded, errors = decode_samples(decoder, part, url=decoding.url)
        taken = itertools.islice(ordered, len(part))
        if not errors and None not in part:  # the hot path: C code only, but the transform
            out = map(_first, zip(decoded, taken, strict=True))
            yield from out if transform is None else map(transform, out)
        else:
            yield from _with_errors(decoding, decoded, errors, taken, window, reader, lo)


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
