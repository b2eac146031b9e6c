"""What ties a sample index to its shard's bytes: the shard's size, sha256 and block CRCs.

# NOTE [ Checksummed reads ]
# A whole-shard sha256 cannot be checked on a ranged read, so a flipped byte inside a
# sample, a shard swapped for another of the same size, or a shard rewritten under a
# running epoch would stream as wrong data. Version 2 sidecars therefore carry:
# - the shard's size and sha256, checked against the manifest entry when the sidecar is
#   loaded: a sidecar beside the wrong shard, or under another manifest, is refused;
# - a CRC-32 of every BLOCK-byte block of the shard (the last one shorter), checked
#   on every read: a reader widens each ranged read to block boundaries (a read is a
#   run of many samples, so this adds at most two blocks to it) and checks each block
#   before anything in it is decoded. A mismatch is a FormatError naming the offset.
# Why fixed byte blocks rather than groups of samples or row groups: the CRCs are
# computed in the same sequential pass that hashes the shard (the pack's hashing thread,
# ``index``'s and ``verify``'s one read of it), with no knowledge of the format, and they
# cover every byte a decoder may touch, headers and Parquet pages included. Why in the
# reader's fetch (the prefetch thread) rather than in decode: the CRC releases the
# GIL on large buffers, so the check runs beside the decoding of the previous window and
# touches the mapped pages that decoding reads next (tools/bench_stream.py). A 64 KiB
# block holds ~20 small tar samples; a per-sample Python CRC would cost more than
# decoding them. The CRC is CRC-32 (zlib's polynomial), computed by ISA-L (``isal``, a
# dependency: ~40 GB/s with carry-less multiply) and by zlib where isal cannot load
# (~3 GB/s): the same values either way, so any reader checks any sidecar. With zlib
# alone a small-sample tar epoch spent ~25% of its time in the check (each ~250 B sample
# is ~3 KiB of tar); with ISA-L the arithmetic is cheap and what remains is reading every
# byte of a read once more (decoding a ~300 B sample touches ~300 B of its ~3 KiB): ~3-10%
# of an epoch's CPU time (more where shards are mapped than copied, as a copy has just
# brought the bytes into the cache), hidden behind decoding only where a core is free.
# Neither the page faults (the same count checked or not: decoding touches every page of
# small tar samples too) nor the ~400 GIL hand-overs of a 25 MB read's per-block calls
# showed in paired measurements (one joined CRC per read measured the same, and left
# damage to several blocks of a read 2^-32 likely to pass rather than 2^-32 per block).
# Two more tries measured no gain (``tools/bench_compare.py`` on ``tools/bench_stream.py
# --only small --repeat 5``, copies / mapped checked over unchecked): one CRC per read
# checked against its blocks' CRCs joined with crc32_combine (0.83-0.93x / 0.91-0.99x
# against main's 0.88-0.94x / 0.94-0.95x in four runs on a loaded machine); copied local
# reads checked in decode, on the caller's side, since the prefetch thread's reads are the
# slower side there (0.90x -> 0.88x). A small-sample epoch from copied files stays about
# 0.9x of an unchecked one (target 0.95x); mapped, about 0.95x.
# Sidecars of version 1 have none of this: they load and stream unchecked, ``verify``
# names them, and ``shardstream index`` rewrites them.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

import numpy as np

from shardstream.errors import FormatError, UsageError
from shardstream.types import ByteRange

__all__ = ["BLOCK", "BlockHasher", "ShardChecks", "crc32"]

try:  # NOTE [ Checksummed reads ]: the same CRC-32 as zlib's, ~15x faster
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal has wheels for the usual platforms
    crc32 = zlib.crc32

BLOCK = 64 << 10  # bytes per CRC block, see NOTE [ Checksummed reads ]
_MIN_BLOCK, _MAX_BLOCK = 512, 1 << 30


@dataclass(frozen=True, slots=True, eq=False)
class ShardChecks:
    """A shard's size and sha256 and the CRC32 of each ``block`` bytes of it."""

    size: int
    sha256: str
    block: int
    crcs: np.ndarray  # uint32, one per block: ceil(size / block)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardChecks):
            return NotImplemented
        mine, theirs = (self.size, self.sha256, self.block), (other.size, other.sha256, other.block)
        return mine == theirs and bool(np.array_equal(self.crcs, other.crcs))

    __hash__ = None  # type: ignore[assignment]

    def other_shard(self, size: int, sha256: str) -> str | None:
        """Why these checks are not of a shard of ``size`` bytes with ``sha256`` (the
        manifest's entry), or None when they are."""
        if (self.size, self.sha256) == (size, sha256):
            return None
        return (
            f"sample index was written for another shard ({self.size} bytes, sha256 {self.sha256[:16]}...) "
            f"than the manifest's ({size} bytes, sha256 {sha256[:16]}...)"
        )

    def sections(self) -> list[bytes]:
        """The three sidecar sections that hold these checks."""
        head = np.array([self.size, self.block], dtype="<i8").tobytes()
        return [head, bytes.fromhex(self.sha256), np.ascontiguousarray(self.crcs, dtype="<u4").tobytes()]

    @staticmethod
    def empty_sections() -> list[bytes]:
        """What a sidecar holds in their place when its index has no checks."""
        return [b"", b"", b""]

    @classmethod
    def from_sections(cls, sections: list[memoryview], *, name: str) -> ShardChecks | None:
        """The checks in three sidecar sections (``None`` when all are empty), or ``FormatError``."""
        head, digest, crcs = sections
        if not len(head) and not len(digest) and not len(crcs):
            return None
        if len(head) != 16 or len(digest) != 32:
            raise FormatError("sample index checks have the wrong length", shard=name)
        size, block = np.frombuffer(head, dtype="<i8").tolist()
        if size < 0 or not _MIN_BLOCK <= block <= _MAX_BLOCK:
            raise FormatError(f"sample index checks: bad shard size {size} or block {block}", shard=name)
        if len(crcs) != 4 * (-(-size // block)):
            raise FormatError(
                f"sample index checks: {len(crcs) // 4} block CRCs for {size} bytes in blocks of {block}",
                shard=name,
            )
        return cls(size, bytes(digest).hex(), block, np.frombuffer(crcs, dtype="<u4"))

    def widen(self, rng: ByteRange) -> ByteRange:
        """``rng`` grown to the blocks that cover it (the last one ends at the shard's end)."""
        if rng.end > self.size:
            raise UsageError(f"bytes [{rng.start}, {rng.end}) are past the shard's {self.size} bytes")
        if not rng.length:
            return rng
        block = self.block
        return ByteRange(rng.start - rng.start % block, min(self.size, -(-rng.end // block) * block))

    def widen_all(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`widen` of every range ``[lo[i], hi[i])``, with its error for the first it refuses."""
        past = hi > self.size
        if bool(past.any()):
            i = int(np.argmax(past))
            self.widen(ByteRange(int(lo[i]), int(hi[i])))
        empty = hi <= lo
        block = self.block
        return (
            np.where(empty, lo, lo - lo % block),
            np.where(empty, hi, np.minimum(self.size, -(-hi // block) * block)),
        )

    def bad_blocks(self, data: bytes | memoryview, rng: ByteRange) -> list[int]:
        """Offsets of the blocks of ``rng`` whose bytes in ``data`` (those of ``rng``, from
        ``rng.start``) fail their CRC; ``rng`` must be one that :meth:`widen` gives."""
        if self.widen(rng) != rng:
            raise UsageError(f"bytes [{rng.start}, {rng.end}) do not start and end at check blocks")
        view = memoryview(data).cast("B")
        if len(view) < rng.length:
            raise FormatError(
                f"got {len(view)} bytes for the {rng.length} of [{rng.start}, {rng.end})", offset=rng.start
            )
        block, bad = self.block, []
        first = rng.start // block
        expected = self.crcs[first : -(-rng.end // block)].tolist()
        for number, want in enumerate(expected):
            lo = number * block
            if crc32(view[lo : lo + block if lo + block < rng.length else rng.length]) != want:
                bad.append(rng.start + lo)
        return bad


class BlockHasher:
    """sha256 and block CRCs of a byte stream fed in order, in pieces of any size."""

    __slots__ = ("_crc", "_crcs", "_fill", "_hash", "block", "size")

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self.size = 0
        self._hash = hashlib.sha256()
        self._crcs: list[int] = []
        self._crc = 0
        self._fill = 0  # bytes of the current block seen so far

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self.size += len(view)
        block, pos = self.block, 0
        while pos < len(view):
            take = min(block - self._fill, len(view) - pos)
            self._crc = crc32(view[pos : pos + take], self._crc)
            self._fill += take
            pos += take
            if self._fill == block:
                self._crcs.append(self._crc)
                self._crc = self._fill = 0

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def checks(self) -> ShardChecks:
        """The checks of what was fed."""
        crcs = self._crcs + ([self._crc] if self._fill else [])
        return ShardChecks(self.size, self.hexdigest(), self.block, np.array(crcs, dtype=np.uint32))
