"""How many bytes a sample adds to a shard, fast enough to ask for every sample.

For samples in memory this is the format's own ``sample_size``: exact for tar and fast
in the usual case (NOTE [ Fast tar sample sizes ] in ``shardstream.formats.tar.header``).
A folder of files is planned before any file is read, so ``file_sample_sizer`` sizes a
sample from its key, field names and file sizes alone: a tar member's bytes depend on
its name and its data size only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardstream.formats import ShardFormat
from shardstream.formats.base import Sample

__all__ = ["file_sample_sizer", "sample_sizer"]

_BLOCK = 512
_NAME_FIELD = 100  # bytes of the ustar name field


def sample_sizer(fmt: ShardFormat) -> Callable[[Sample], int]:
    """A function giving ``fmt.sample_size(sample)``."""
    return fmt.sample_size


def file_sample_sizer(fmt: ShardFormat) -> Callable[[str, tuple[Any, ...]], int]:
    """``size(key, (fields, sizes))`` for a sample of files not read yet.

    The exact size is that of the same sample with empty values plus the data, padded
    to whole blocks for tar; plain ASCII names that fit the ustar name field (one
    header block per member) skip building that sample.
    """
    exact = fmt.sample_size
    tar = fmt.name == "tar"
    longest: dict[tuple[str, ...], int] = {}  # field set -> longest name, or -1 if not all plain

    def size(key: str, where: tuple[Any, ...]) -> int:
        fields, sizes = where
        if tar:
            name = longest.get(fields)
            if name is None:
                name = longest[fields] = max(map(len, fields)) if all(map(_plain, fields)) else -1
            if name >= 0 and len(key) + 1 + name <= _NAME_FIELD and key.isascii():
                total = 0
                for n in sizes:
                    total += (n + 1023) & -512  # a header block, then the data in whole blocks
                return total
        overhead = exact({"__key__": key, **dict.fromkeys(fields, b"")})
        block = _BLOCK if tar else 1
        return overhead + sum(-(-n // block) * block for n in sizes)

    return size


def _plain(field: str) -> bool:
    """A data field whose name needs no validation beyond the folder source's own."""
    return bool(field) and field[0] != "_" and field.isascii() and "/" not in field and "\0" not in field
