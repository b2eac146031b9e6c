"""WebDataset-style tar shards: a sample is the members sharing a key (``key.field``).

Reading and writing follow webdataset's conventions with two deliberate differences:
field names keep their case (webdataset lowercases extensions when it reads), and the
writer rejects what webdataset would read back differently (a key with a dot in its
last path part, two consecutive samples with the same key, metadata-like names).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import repeat
from typing import IO

from shardstream.errors import FormatError, UsageError
from shardstream.formats._tarindex import TarIndex
from shardstream.formats._tarscan import scan_tar
from shardstream.formats._tarwrite import TarEncoder, sample_size
from shardstream.formats.base import Sample, SampleIndex, ShardFormat
from shardstream.types import ByteRange

__all__ = ["TarEncoder", "TarFormat", "TarIndex"]


class TarFormat(ShardFormat):
    """Uncompressed tar shards readable by ``webdataset``, ``tarfile`` and GNU tar."""

    name = "tar"
    suffix = ".tar"

    def encoder(self, fileobj: IO[bytes], *, name: str, compression: str | None = None) -> TarEncoder:
        if compression not in (None, "none"):
            raise UsageError(f"tar shards are not compressed (got compression={compression!r})", shard=name)
        return TarEncoder(fileobj, name=name)

    def sample_size(self, sample: Sample) -> int:
        return sample_size(sample, None)

    def build_index(self, fileobj: IO[bytes], *, name: str) -> tuple[TarIndex, tuple[str, ...]]:
        index = scan_tar(fileobj, name)
        return index, index.fields

    def load_index(self, data: bytes, *, name: str) -> TarIndex:
        return TarIndex.from_bytes(data, name=name)

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
        if not isinstance(index, TarIndex):
            raise UsageError(f"a tar shard needs a TarIndex, not {type(index).__name__}", shard=name)
        need = index.byte_range(start, stop)
        if need.start < rng.start or need.end > rng.end or need.end - rng.start > len(data):
            raise FormatError(
                f"samples [{start}, {stop}) need bytes [{need.start}, {need.end}) but got "
                f"[{rng.start}, {rng.start + len(data)}) of range [{rng.start}, {rng.end})",
                shard=name,
                offset=need.start,
            )
        return _samples(data, rng.start, index, start, stop)


def _samples(data: bytes | memoryview, base: int, index: TarIndex, start: int, stop: int) -> Iterator[Sample]:
    # NOTE [ Fast tar decode ]
    # The read hot path never parses a header: member spans come from the index as two
    # Python int lists (numpy does the arithmetic), every member's bytes are sliced by one
    # C-level map, and in the usual case (every sample has the same fields) the dicts are
    # built by map/zip as well, with no Python-level loop per sample or per member.
    m0, m1 = index.members(start, stop)
    starts, ends = index.member_spans(m0, m1, base)
    if isinstance(data, bytes):
        values = list(map(data.__getitem__, map(slice, starts, ends)))
    else:
        values = list(map(bytes, map(memoryview(data).cast("B").__getitem__, map(slice, starts, ends))))
    keys = index.key_slice(start, stop)
    uniform = index.uniform_fields()
    if uniform is not None:
        it = iter(values)
        names = ("__key__", *uniform)
        yield from map(dict, map(zip, repeat(names), zip(keys, *([it] * len(uniform)), strict=True)))
        return
    fields = index.member_fields(m0, m1)
    pos = 0
    for key, count in zip(keys, index.sample_counts(start, stop), strict=True):
        sample: Sample = {"__key__": key}
        sample.update(zip(fields[pos : pos + count], values[pos : pos + count], strict=True))
        pos += count
        yield sample
