"""How many bytes a sample adds to a shard, fast enough to ask for every sample.

For samples in memory this is the format's own ``sample_size`` (for tar exact and fast
in the usual case: NOTE [ Fast tar sample sizes ] in ``shardstream.formats.tar.header``).
A folder of files is cut into shards before any file is read, so ``file_sample_sizer`` sizes a
sample from its key, field names and file sizes alone, by the format's ``file_sizer``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardstream.formats import ShardFormat
from shardstream.formats.base import Sample

__all__ = ["file_sample_sizer", "sample_sizer"]


def sample_sizer(fmt: ShardFormat) -> Callable[[Sample], int]:
    """A function giving ``fmt.sample_size(sample)``."""
    return fmt.sample_size


def file_sample_sizer(fmt: ShardFormat) -> Callable[[str, tuple[Any, ...]], int]:
    """``size(key, (fields, sizes))`` for a sample of files not read yet (``fmt.file_sizer``)."""
    sized = fmt.file_sizer()

    def size(key: str, where: tuple[Any, ...]) -> int:
        fields, sizes = where
        return sized(key, fields, sizes)

    return size
