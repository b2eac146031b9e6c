"""A window's reads checked against their check blocks' CRCs before anything is decoded.

# NOTE [ Checks beside decoding ]
# In a stream (``prefetched``) a window's block checks (NOTE [ Checksummed reads ]) run in
# a thread of the reader's own, read by read in window order, and ``decode`` waits for
# each read's check just before it decodes that read: the first read is decoded while the
# others are checked. Checking them all at the end of the fetch would make a window's
# first read wait for every read's check; where fetching costs nothing (local files
# mapped, a warm cache) that puts a whole window's CRCs between the caller and its
# samples: the epoch's first window, and any window the caller catches up with. Every read
# is still checked before any of its bytes is decoded, a failed check is the same error,
# raised where the window is decoded, and a window's samples come only once all its reads
# are decoded. ``MapDataset``'s batches check each read in the thread that read it (NOTE
# [ Decoding as reads land ] in batch_reads.py). tools/bench_stream.py --only small measures
# checked against unchecked epochs (docs/benchmarks.md, claim checks-cost).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

from shardstream.dataset.runs import Read
from shardstream.errors import FormatError
from shardstream.formats.base import SampleIndex
from shardstream.formats.checks import ShardChecks
from shardstream.manifest import Manifest
from shardstream.types import ByteRange

__all__ = ["Checked", "Fetched", "ReadChecks", "WindowReads"]

# What a window's fetch gives per read: the read, its bytes, the shard's index, and the
# offsets of check blocks that failed (left for decode to skip with on_error="skip"), or
# the future of the bytes (read again where a cache entry failed: NOTE [ Healing the
# cache ] in heal.py) and those offsets.
Checked = tuple["bytes | memoryview", "tuple[int, ...]"]
Fetched = tuple["Read", "bytes | memoryview", SampleIndex, "tuple[int, ...] | Future[Checked]"]

# ``path``'s bytes ``rng`` read again after a failed check at an offset, or None (CacheHealer).
ReadAgain = Callable[[str, "ByteRange | None", int], "bytes | memoryview | None"]


@dataclass(frozen=True, slots=True)
class WindowReads:
    """A window's reads before any byte is read: the reads, what each asks storage for,
    and the sample indexes of their shards."""

    reads: list[Read]
    items: list[tuple[str, ByteRange | None]]
    indexes: dict[int, SampleIndex]

    @property
    def bytes(self) -> int:
        """What the reads hold (a whole-shard read its trailer too: at most WHOLE_SHARD_SLACK more)."""
        return sum(read.rng.length for read in self.reads)


class ReadChecks:
    """The block checks of one reader's reads: inline, or in a thread of its own beside
    decoding once :meth:`beside_decoding` is called (until :meth:`close`)."""

    def __init__(
        self,
        manifest: Manifest,
        url_of: Callable[[str], str],
        read_again: ReadAgain,
        *,
        verify: bool,
        on_error: str,
        check: Callable[[Read, bytes | memoryview, SampleIndex], Checked] | None = None,
    ) -> None:
        """``check``: what checks each read of a window (its owner's seam), by default :meth:`check`."""
        self.manifest, self._url_of, self._read_again = manifest, url_of, read_again
        self.verify, self.on_error = verify, on_error
        self._check_one = check if check is not None else self.check
        self._checker: ThreadPoolExecutor | None = None

    def beside_decoding(self) -> None:
        """From now on check reads in a thread of this reader's own (NOTE [ Checks beside decoding ])."""
        if self.verify and self._checker is None:
            self._checker = ThreadPoolExecutor(1, thread_name_prefix="shardstream-check")

    def checked(self, planned: WindowReads, fetched: list[bytes | memoryview]) -> list[Fetched]:
        """Each read with its bytes, its shard's index and its failed check blocks (in a
        stream, a future of them: NOTE [ Checks beside decoding ])."""
        reads, indexes = planned.reads, planned.indexes
        alone = len(reads) < 2
        return [
            self.later(read, data, indexes[read.shard], alone=alone)
            for read, data in zip(reads, fetched, strict=True)
        ]

    def later(
        self, read: Read, data: bytes | memoryview, index: SampleIndex, *, alone: bool = False
    ) -> Fetched:
        """One read with its bytes, its shard's index and its failed check blocks: checked in
        the checker's thread (a future of them) once there is one, unless the read is its
        window's only one (``alone``: nothing to decode beside its check), else here."""
        if self._checker is None or alone:
            data, bad = self._check_one(read, data, index)
            return read, data, index, bad
        return read, data, index, self._checker.submit(self._check_one, read, data, index)

    def check(self, read: Read, data: bytes | memoryview, index: SampleIndex) -> Checked:
        """The read's bytes and the offsets of its check blocks whose CRC fails; bytes from
        the cache that fail are read again, once (NOTE [ Healing the cache ] in heal.py).
        With ``on_error="raise"`` a block still failing is a ``FormatError`` here, before
        anything is decoded."""
        bad = self._failed_blocks(read, data, index)
        path = self.manifest.shards[read.shard].path
        if bad:
            healed = self._read_again(path, read.rng, bad[0])
            if healed is not None:
                data = healed
                bad = self._failed_blocks(read, data, index)
        if bad and self.on_error != "skip":
            checks = cast(ShardChecks, index.checks)
            raise FormatError(
                f"checksum mismatch in bytes [{bad[0]}, {min(bad[0] + checks.block, checks.size)}): the "
                "shard's bytes differ from those it was indexed with (corrupt, or rewritten)",
                url=self._url_of(path),
                shard=path,
                offset=bad[0],
            )
        return data, tuple(bad)

    def _failed_blocks(self, read: Read, data: bytes | memoryview, index: SampleIndex) -> list[int]:
        """Offsets of the read's check blocks whose CRC fails."""
        checks = index.checks
        if checks is None or not self.verify or not read.rng.length:
            return []
        if read.spans:  # only the blocks its runs take (runs.Read)
            view, start = memoryview(data), read.rng.start
            return [
                offset
                for lo, hi in read.spans
                for offset in checks.bad_blocks(view[lo - start : hi - start], ByteRange(lo, hi))
            ]
        return checks.bad_blocks(data, read.rng)

    def close(self) -> None:
        checker, self._checker = self._checker, None
        if checker is not None and not sys.is_finalizing():  # at exit its thread is joined already
            checker.shutdown(wait=False, cancel_futures=True)
