"""One sample at a time, for ``MapDataset[i]``: the shortest checked read of a sample.

NOTE [ Checked single reads ]
A checked read is widened to whole check blocks (NOTE [ Checksummed reads ]): for one
small tar sample, ``dataset[i]`` would read and CRC a whole block (two where the sample
straddles a boundary), many times its bytes, and most of its time. So the first
checked read of a block also records, in this process, the CRC-32 of every sample that
lies wholly in the bytes it has just checked; a later read of such a sample reads only
its own bytes and checks them against that CRC. The guarantee is the block check's:
the bytes decoded are the bytes the sidecar was written for (a recorded CRC is of bytes
that passed it), and a shard changed since then fails as a checksum mismatch naming the
sample's bytes either way. Only samples shorter than a block are recorded: a longer
read grows by at most two blocks, and a Parquet row's range is its whole row group's
(rows sharing a range share its CRC). The CRCs take 8 bytes per sample of the
``SHARDS_KEPT`` shards first read last, kept with their indexes (so a read looks its
shard up once, not in the sidecar LRU).

What is left of a call is Python per sample, so the shortest path is kept short: where a
shard's index can cut its samples alone (``SampleIndex.singles``: a tar shard whose
samples have the same fields), a sample's span, key and values come from a few lookups in
the index's arrays, no run is laid out and no header parsed, and its values are decoded
by the shard's ``FieldDecoders`` (NOTE [ Single-sample decode ]); other shards (Parquet,
mixed fields) decode the sample as a run of one. ``tools/bench_access.py --only local``
measures it against MosaicML Streaming's ``dataset[i]``.

Local files read by copy (NOTE [ Getting the bytes ]) stay open between reads of this
process, ``OPEN_FILES`` at most: a read is then one ``pread``, where opening, checking
and closing the file cost more than the read. A file truncated while open gives a short
read, a ``StorageError`` naming it; one rewritten in place fails its checksum.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from shardstream.dataset.decode import SampleDecoder
from shardstream.dataset.fields import with_all_fields_one
from shardstream.dataset.indexes import INDEX_CACHE_SIZE
from shardstream.dataset.reader import Read, WindowReader
from shardstream.errors import FormatError
from shardstream.formats.base import Sample, SampleIndex, sample_builder
from shardstream.formats.checks import ShardChecks, crc32
from shardstream.plan import Run
from shardstream.types import ByteRange

__all__ = ["OPEN_FILES", "SHARDS_KEPT", "SampleReads"]

SHARDS_KEPT = INDEX_CACHE_SIZE  # shards whose index and samples' CRCs are kept
OPEN_FILES = 64  # local shards kept open


@dataclass(frozen=True, slots=True)
class _RunOfOne:
    """A window of one sample, for ``WindowReader.locate``."""

    runs: tuple[Run, ...]


# bytes [start, end) of one shard's file kept open: ``OpenFiles.read_span`` bound to it
SpanRead = Callable[[int, int], bytes]


def _span_of(index: SampleIndex) -> Callable[[int], tuple[int, int]]:
    def span(j: int) -> tuple[int, int]:
        rng = index.byte_range(j, j + 1)
        return rng.start, rng.end

    return span


class _Shard:
    """A shard's index, path, how its single samples are cut and decoded, and the CRCs
    recorded of its samples (NOTE [ Checked single reads ])."""

    __slots__ = ("build", "checked", "crc", "decode", "index", "path", "read", "singles")

    def __init__(
        self,
        index: SampleIndex,
        path: str,
        checked: bool,
        decoder: SampleDecoder | None,
        read: SpanRead | None,
    ) -> None:
        self.index, self.path = index, path
        self.read = read  # bytes [start, end) of its file kept open, or None: a read of the reader's
        self.checked = checked and index.checks is not None
        # the recorded CRC of each sample, -1 where none is: an int64 memoryview's items are ints
        self.crc = np.full(index.num_samples if self.checked else 0, -1, np.int64).data.cast("B").cast("q")
        self.singles = index.singles()
        fields = self.singles.fields if self.singles is not None else ()
        self.build = sample_builder(fields)
        self.decode = decoder.for_fields(fields) if decoder is not None and self.singles is not None else None


class SampleReads:
    """Reads of single samples through ``reader`` (this process's), decoded by ``decoder``
    (not with ``None``); see NOTE [ Checked single reads ]."""

    def __init__(self, reader: WindowReader, decoder: SampleDecoder | None = None) -> None:
        self.reader = reader
        self.decoder = decoder
        self._bytes = reader.single_reads(OPEN_FILES)  # local files kept open, where read by copy
        self._read_bytes = reader.fetcher.read_bytes  # bound once, no forwarding: a call per sample
        self._shards: collections.OrderedDict[int, _Shard] = collections.OrderedDict()
        self._lock = threading.Lock()  # for the LRU of shards

    def sample(self, shard: int, position: int) -> Sample:
        """Sample ``position`` of ``shard``, its bytes checked, decoded, with every field of
        the dataset (NOTE [ Missing fields ] in fields.py); a ``FormatError`` of its
        decoding names its URL, shard, offset and key."""
        kept = self._shards.get(shard) or self._keep(shard)
        singles = kept.singles
        if singles is None:  # a Parquet row, a tar shard of mixed fields: a run of one
            sample = self._decoded(shard, position, self._run_of_one(kept, shard, position))
        else:
            data, base = self._checked(kept, shard, position, *singles.span(position))
            values = singles.values(data if type(data) is bytes else bytes(data), base, position)
            if kept.decode is not None:
                try:
                    sample = kept.decode(singles.key(position), values, shard=kept.path)
                except FormatError as error:
                    raise self._located(error, shard, position) from error
            else:
                sample = kept.build(singles.key(position), *values)
                if self.decoder is not None:
                    sample = self._decoded(shard, position, sample)
        fields = self.reader.fields
        # with_all_fields_one's own test first: a call fewer per sample where none is missing
        return sample if len(sample) > len(fields) else with_all_fields_one(sample, fields)

    def _run_of_one(self, kept: _Shard, shard: int, position: int) -> Sample:
        reader, index = self.reader, kept.index
        rng = index.byte_range(position, position + 1)
        data, start = self._checked(kept, shard, position, rng.start, rng.end)
        rng = ByteRange(start, start + len(data))
        # never None: with on_error="raise" a sample that cannot be decoded raises
        return cast(Sample, reader.decode_span(data, rng, index, position, position + 1, kept.path)[0])

    def _checked(
        self, kept: _Shard, shard: int, position: int, start: int, end: int
    ) -> tuple[bytes | memoryview, int]:
        """Sample ``position``'s bytes ``[start, end)`` checked against its recorded CRC, or
        the first time its check blocks (wider), and the offset the bytes returned start at."""
        recorded = kept.crc[position] if kept.checked else -2
        if recorded == -1:
            return self._first_read(kept, shard, position, ByteRange(start, end))
        data = self._read(kept, shard, start, end)
        if recorded >= 0 and crc32(data) != recorded:
            # NOTE [ Healing the cache ] in heal.py
            healed = self.reader.read_again(kept.path, ByteRange(start, end), start)
            if healed is None or crc32(healed) != recorded:
                raise self._mismatch(kept, ByteRange(start, end))
            data = healed
        return data, start

    def _first_read(
        self, kept: _Shard, shard: int, position: int, rng: ByteRange
    ) -> tuple[bytes | memoryview, int]:
        """The sample's check blocks, checked, with the CRCs of the samples they hold recorded."""
        checks = cast(ShardChecks, kept.index.checks)
        wide = checks.widen(rng)
        data = self._read(kept, shard, wide.start, wide.end)
        data, _ = self.reader.check(Read(shard, wide, (0,)), data, kept.index)  # raises: on_error is "raise"
        self._record(kept, wide, data, position, checks.block)
        return data, wide.start

    def _decoded(self, shard: int, position: int, sample: Sample) -> Sample:
        if self.decoder is None:
            return sample
        try:
            return self.decoder(sample, shard=self.reader.manifest.shards[shard].path)
        except FormatError as error:
            raise self._located(error, shard, position) from error

    def _located(self, error: FormatError, shard: int, position: int) -> FormatError:
        return self.reader.locate(error, _RunOfOne((Run(shard, position, position + 1),)), 0)

    def _keep(self, shard: int) -> _Shard:
        reader = self.reader
        path = reader.manifest.shards[shard].path
        kept = _Shard(reader.index(shard), path, reader.verify_checksums, self.decoder, self._span_read(path))
        with self._lock:
            kept = self._shards.setdefault(shard, kept)
            while len(self._shards) > SHARDS_KEPT:
                self._shards.popitem(last=False)
        return kept

    # -- bytes ---------------------------------------------------------------------------

    def _span_read(self, path: str) -> SpanRead | None:
        """The read of ``path``'s file kept open, where local files are read by copy: what
        ``read_bytes`` would end in, bound once per shard (it runs once per sample)."""
        files = self._bytes.files
        if files is None:
            return None
        fetcher = self.reader.fetcher
        return functools.partial(
            files.read_span, path, self.reader.bytes.expected(path), fetcher.storage_error
        )

    def _read(self, kept: _Shard, shard: int, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of ``shard``: one ``pread`` of a file kept open, else a read."""
        read = kept.read
        if read is None:
            return self._read_bytes(shard, ByteRange(start, end), self._bytes)
        data = read(start, end)
        if len(data) != end - start:  # the file is shorter than its index says
            self.reader.fetcher.too_short(Read(shard, ByteRange(start, end), (0,)), start + len(data))
        return data

    # -- checks --------------------------------------------------------------------------

    def _record(
        self, kept: _Shard, wide: ByteRange, data: bytes | memoryview, position: int, block: int
    ) -> None:
        """The CRCs of the samples wholly in ``data`` (``wide``'s bytes, just checked)."""
        index, crc, n = kept.index, kept.crc, len(kept.crc)
        span = kept.singles.span if kept.singles is not None else _span_of(index)
        view = memoryview(data)
        last: tuple[tuple[int, int], int] | None = None
        for step in (-1, 1):  # from the sample read outwards, while samples lie in the bytes
            j = position if step == 1 else position - 1
            while 0 <= j < n:
                one = span(j)
                if one[0] < wide.start or one[1] > wide.end:
                    break
                if one[1] - one[0] < block:
                    if last is None or last[0] != one:  # Parquet rows share their row group's
                        last = one, crc32(view[one[0] - wide.start : one[1] - wide.start])
                    crc[j] = last[1]
                j += step

    def _mismatch(self, kept: _Shard, rng: ByteRange) -> FormatError:
        path = kept.path
        return FormatError(
            f"checksum mismatch in bytes [{rng.start}, {rng.end}): the shard's bytes differ from those it "
            "was indexed with (corrupt, or rewritten)",
            url=self.reader.storage.full_url(path),
            shard=path,
            offset=rng.start,
        )

    def close(self) -> None:
        """Close the files kept open (each at once, or when the read using it ends)."""
        self._bytes.close()
