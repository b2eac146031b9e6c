"""How many bytes a sample adds to a shard, fast enough to ask for every sample.

For samples in memory this is the format's own ``sample_size``: exact for tar and fast
in the usual case (NOTE [ Fast tar sample sizes ] in ``shardstream.formats._tarwrite``).
A folder of files is planned before any file is read, so ``file_sample_sizer`` sizes a
sample from its key, field names and file sizes alone: a tar member's bytes depend on
its name and its data size only.
"""

from __future__ import annotations

from collections.abc import Callable

from shardstream.formats import ShardFormat
from shardstream.formats.base import Sample

__all__ = ["file_sample_sizer", "sample_sizer"]

_BLOCK = 512
_NAME_FIELD = 100  # bytes of the ustar name field


def sample_sizer(fmt: ShardFormat) -> Callable[[Sample], int]:
    """A function giving ``fmt.sample_size(sample)``."""
    return fmt.sample_size


def file_sample_sizer(fmt: ShardFormat) -> Callable[[str, tuple[tuple[str, str, int], ...]], int]:
    """``size(key, files)`` for a sample of files ``(field, path, size)`` not read yet.

    The exact size is that of the same sample with empty values plus the data, padded
    to whole blocks for tar; plain ASCII names that fit the ustar name field (one
    header block per member) skip building that sample.
    """
    exact = fmt.sample_size
    tar = fmt.name == "tar"
    known: dict[str, int] = {}  # field name -> its length, for plain ASCII names

    def size(key: str, files: tuple[tuple[str, str, int], ...]) -> int:
        if tar and key.isascii():
            total = longest = 0
            for field, _, n in files:
                length = known.get(field)
                if length is None:
                    if not _plain(field):
                        break
                    length = known[field] = len(field)
                if length > longest:
                    longest = length
                total += (n + 1023) & -512  # a header block, then the data padded to whole blocks
            else:
                if len(key) + 1 + longest <= _NAME_FIELD and total:
                    return total
        overhead = exact({"__key__": key, **{field: b"" for field, _, _ in files}})
        block = _BLOCK if tar else 1
        return overhead + sum(-(-n // block) * block for _, _, n in files)

    return size


def _plain(field: str) -> bool:
    """A data field whose name needs no validation beyond the folder source's own."""
    return bool(field) and field[0] != "_" and field.isascii() and "/" not in field and "\0" not in field
