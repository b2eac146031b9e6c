"""WebDataset-style tar shards: a sample is the members sharing a key (``key.field``).

Reading and writing follow webdataset's conventions with two deliberate differences:
field names keep their case (webdataset lowercases extensions when it reads), and the
writer rejects what webdataset would read back differently (a key with a dot in its
last path part, two consecutive samples with the same key, metadata-like names).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

import numpy as np

from shardstream.errors import UsageError
from shardstream.formats.base import (
    FileSizer,
    Sample,
    SampleColumns,
    SampleIndex,
    ShardFormat,
    check_covers,
    check_covers_all,
)
from shardstream.formats.tar.header import file_sample_sizer
from shardstream.formats.tar.index import TarIndex
from shardstream.formats.tar.read import tar_runs, tar_samples
from shardstream.formats.tar.scan import check_fields, scan_tar
from shardstream.formats.tar.write import TarEncoder, sample_size
from shardstream.types import ByteRange

__all__ = ["TarEncoder", "TarFormat", "TarIndex"]

# A sample cannot be fetched with a ranged read from inside a compressed stream.
_COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tar.lz4")


class TarFormat(ShardFormat):
    """Uncompressed tar shards readable by ``webdataset``, ``tarfile`` and GNU tar."""

    name = "tar"
    suffix = ".tar"
    sequential_index = True  # headers, then data skipped or read, in file order
    stores_bytes = True
    member_overhead = 512  # a header block; the padding to 512 bytes comes on top

    def encoder(self, fileobj: IO[bytes], *, name: str, compression: str | None = None) -> TarEncoder:
        if compression not in (None, "none"):
            raise UsageError(f"tar shards are not compressed (got compression={compression!r})", shard=name)
        return TarEncoder(fileobj, name=name)

    def sample_size(self, sample: Sample) -> int:
        return sample_size(sample, None)

    def file_sizer(self) -> FileSizer:
        return file_sample_sizer()

    def refusal(self, path: str) -> str | None:
        if not path.lower().endswith(_COMPRESSED_SUFFIXES):
            return None
        return (
            "compressed tar shards are not supported: a sample cannot be fetched with a ranged read "
            "from inside a compressed stream; decompress them, or repack with `shardstream pack`"
        )

    def build_index(self, fileobj: IO[bytes], *, name: str) -> tuple[TarIndex, tuple[str, ...]]:
        index = scan_tar(fileobj, name)
        return index, index.fields

    def load_index(self, data: bytes, *, name: str) -> TarIndex:
        index = TarIndex.from_bytes(data, name=name)
        check_fields(index)
        return index

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
        check_covers(data, rng, need, start, stop, name)
        return tar_samples(data, rng.start, index, start, stop)

    def decode_runs(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        starts: np.ndarray,
        stops: np.ndarray,
        *,
        name: str,
    ) -> SampleColumns | list[Sample]:
        if not isinstance(index, TarIndex):
            raise UsageError(f"a tar shard needs a TarIndex, not {type(index).__name__}", shard=name)
        check_covers_all(data, rng, index.byte_ranges(starts, stops), starts, stops, name)
        return tar_runs(data, rng.start, index, starts, stops)
