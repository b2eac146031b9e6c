"""Decoding a window's reads: one format call per read, samples put in yield order.

A read's runs are decoded in one format call (NOTE [ One call per read ] in runs.py),
sample by sample where that call fails or a check block failed; with ``on_error="skip"``
a sample that cannot be decoded is ``None`` (``report_skip`` logs the first per shard).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from itertools import chain
from typing import Any, cast

import numpy as np

from shardstream.dataset.fields import with_all_fields
from shardstream.dataset.read_checks import Fetched
from shardstream.dataset.runs import Read, run_table, taken_from_reads
from shardstream.errors import FormatError
from shardstream.formats.base import Sample, SampleColumns, SampleIndex, ShardFormat
from shardstream.formats.checks import BLOCK, ShardChecks
from shardstream.manifest import Manifest
from shardstream.types import ByteRange

__all__ = ["WindowDecoder", "report_skip"]

_log = logging.getLogger("shardstream.dataset")


class WindowDecoder:
    """Decodes one dataset's reads (``manifest``'s shards, in ``fmt``); ``index(shard)``
    gives a shard's sample index, ``url_of(path)`` an object's URL for errors."""

    def __init__(
        self,
        manifest: Manifest,
        fmt: ShardFormat,
        *,
        index: Callable[[int], SampleIndex],
        url_of: Callable[[str], str],
        on_error: str,
        columns: bool,
        decode_read: Callable[..., SampleColumns | list[Sample | None]] | None = None,
        typed_values: Mapping[str, str] | None = None,
    ) -> None:
        """``decode_read``: what decodes each read (its owner's seam), by default
        :meth:`decode_read`; ``typed_values``: fields a Parquet shard may give as its typed
        column holds them (NOTE [ Typed values passed through ] in decode.py)."""
        self.manifest, self.format, self._index, self._url_of = manifest, fmt, index, url_of
        self.on_error, self.columns = on_error, columns
        self.fields = manifest.fields  # every sample has them all: NOTE [ Missing fields ] in fields.py
        self._holes = 0  # samples the format could not decode, replaced by None
        self._decode_one = decode_read if decode_read is not None else self.decode_read
        self._typed: dict[str, Any] = {"typed_values": typed_values} if typed_values else {}

    def decode(
        self, window: Any, fetched: list[Fetched], order: np.ndarray | None = None
    ) -> tuple[SampleColumns | list[Sample | None], bool]:
        """The samples of ``window``'s runs from :meth:`fetch`'s bytes, and whether any is
        ``None`` (skipped as corrupt). They come in ``order`` (positions in the
        concatenation of the runs' samples, as ``Window.order`` gives the yield order), or
        in run order; as ``SampleColumns`` where the reader keeps ``columns`` and every read
        decoded to columns of the same fields, else as a list. Each read's runs are decoded
        in one format call and its bytes let go as soon as they are; everything else is
        array work, none of it per run (NOTE [ One call per read ])."""
        table, holes = run_table(window.runs), self._holes
        fetched.reverse()
        parts: list[SampleColumns | list[Sample | None]] = []
        numbers: list[tuple[int, ...]] = []
        while fetched:
            read, data, index, bad = fetched.pop()
            if isinstance(bad, Future):
                data, bad = bad.result()  # its check is done before its bytes are decoded
            mine = table[list(read.runs)]
            part = with_all_fields(
                self._decode_one(read, data, index, bad, mine[:, 1], mine[:, 2]), self.fields
            )
            # samples built while their values are in the CPU cache, unless a decoder takes columns
            parts.append(
                cast(list[Sample | None], part.samples())
                if not self.columns and isinstance(part, SampleColumns)
                else part
            )
            numbers.append(read.runs)
            del data
        moved = taken_from_reads(table, numbers, order)
        if all(isinstance(part, SampleColumns) for part in parts):
            columns = SampleColumns.joined(cast(list[SampleColumns], parts))
            if columns is not None:
                return (columns if moved is None else columns.take(moved)), self._holes != holes
        samples = list(chain.from_iterable(p.samples() if isinstance(p, SampleColumns) else p for p in parts))
        return (samples if moved is None else list(map(samples.__getitem__, moved))), self._holes != holes

    def decode_read(
        self,
        read: Read,
        data: bytes | memoryview,
        index: SampleIndex,
        bad: tuple[int, ...],
        starts: np.ndarray,
        stops: np.ndarray,
    ) -> SampleColumns | list[Sample | None]:
        """The samples of ``read``'s runs (``starts``, ``stops``) in one format call; run by
        run, as ever, where a check block failed or that call raised (NOTE [ One call per read ])."""
        name = self.manifest.shards[read.shard].path
        if not bad:
            try:
                # only a shard with typed columns takes typed_values (a Parquet shard's index says so)
                typed = self._typed if getattr(index, "typed_columns", None) else {}
                got = self.format.decode_runs(data, read.rng, index, starts, stops, name=name, **typed)
            except FormatError:
                got = None
            if got is not None and len(got) == int((stops - starts).sum()):
                return cast("SampleColumns | list[Sample | None]", got)
        out: list[Sample | None] = []
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
            if bad:  # on_error="skip": the samples of failed blocks are left out (bad implies checks)
                block = cast(ShardChecks, index.checks).block
                out += self._read_one_by_one(data, read.rng, index, start, stop, name, (bad, block))
            else:
                out += self.decode_span(data, read.rng, index, start, stop, name)
        return out

    def decode_span(
        self, data: bytes | memoryview, rng: ByteRange, index: SampleIndex, start: int, stop: int, name: str
    ) -> list[Sample | None]:
        """Samples ``[start, stop)`` of shard ``name`` from ``data`` (the bytes of ``rng``);
        with ``on_error="skip"`` one by one, ``None`` for each that fails."""
        try:
            samples: list[Sample | None] = list(self.format.decode(data, rng, index, start, stop, name=name))
        except FormatError as error:
            if self.on_error != "skip":
                raise self._named(error, name, rng) from error
            return self._read_one_by_one(data, rng, index, start, stop, name)
        if len(samples) != stop - start:
            wrong = FormatError(f"decoded {len(samples)} samples, expected {stop - start}", offset=rng.start)
            raise self._named(wrong, name, rng)
        return samples

    def _read_one_by_one(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        start: int,
        stop: int,
        name: str,
        bad: tuple[tuple[int, ...], int] = ((), BLOCK),
    ) -> list[Sample | None]:
        """``on_error="skip"``: decode sample by sample, ``None`` for each that fails or
        has bytes in a check block of ``bad`` (its offsets, the block size)."""
        view = memoryview(data)
        out: list[Sample | None] = []
        for i in range(start, stop):
            one = index.byte_range(i, i + 1)
            try:
                _check_blocks(one, *bad)
                part = view[one.start - rng.start : one.end - rng.start]
                out.extend(self.format.decode(part, one, index, i, i + 1, name=name))
            except FormatError as error:
                out.append(None)
                self._holes += 1
                report_skip(self._named(error, name, one))
        return out

    def _named(self, error: FormatError, shard: str, rng: ByteRange) -> FormatError:
        return FormatError(
            error.message,
            url=error.url or self._url_of(shard),
            shard=error.shard or shard,
            offset=error.offset if error.offset is not None else rng.start,
        )

    def locate(self, error: FormatError, window: Any, position: int) -> FormatError:
        """``error`` about the sample at ``position`` of ``window``'s concatenated runs,
        naming its URL, shard, byte offset and key."""
        for run in window.runs:
            shard, start, stop = run.shard, run.start, run.stop
            if position < stop - start:
                info = self.manifest.shards[shard]
                index = self._index(shard)
                i = start + position
                key = index.keys[i]
                message = error.message if key in error.message else f"{error.message} [sample {key!r}]"
                return type(error)(
                    message,
                    url=self._url_of(info.path),
                    shard=info.path,
                    offset=index.byte_range(i, i + 1).start,
                )
            position -= stop - start
        return error


def _check_blocks(rng: ByteRange, bad: tuple[int, ...], block: int) -> None:
    for offset in bad:
        if offset < rng.end and rng.start < offset + block:
            raise FormatError(f"checksum mismatch in bytes [{offset}, {offset + block})", offset=offset)


_SKIPPED: collections.Counter[str] = collections.Counter()  # per shard URL, in this process


def report_skip(error: FormatError) -> None:
    """Count a sample skipped with ``on_error="skip"``; log the first of each shard."""
    shard = error.url or error.shard or ""
    _SKIPPED[shard] += 1
    if _SKIPPED[shard] == 1:
        _log.warning("skipping corrupt samples (on_error='skip'); the first in this shard: %s", error)
