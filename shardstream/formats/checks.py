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
# reader's fetch (the prefetch thread) rather than in decode: the CRC releases the GIL on
# large buffers, so the check runs beside the decoding of the previous window and touches
# the pages that decoding reads next; a per-sample CRC in Python would cost more than
# decoding small samples. The CRC is CRC-32 (zlib's polynomial), computed by ISA-L
# (``isal``, a dependency, several times faster than zlib) and by zlib where isal cannot
# load: the same values either way, so any reader checks any sidecar. What is left of the
# cost is reading every byte of a read once more (memory bound), hidden behind decoding
# only where a core is free: NOTE [ One CRC per read ]. tools/bench_stream.py --only small
# measures it (docs/benchmarks.md, claim checks-cost).
#
# NOTE [ One CRC per read ]
# A read's whole blocks are checked by one CRC-32 of all of them, compared with their
# CRCs joined (zlib's crc32_combine: a fixed linear map per block length, applied by
# four tables of 256); only where that fails are the blocks checked one by one, to name
# them (damage to several blocks of one read passes with odds 2^-32, as one block's
# would). One call releases the GIL once for the whole read, so the check runs beside
# decoding; a call per block would hand the GIL over hundreds of times per long read,
# each time waiting for the decoding thread to give it back. A faster hash (xxh3) in
# place of the CRC gains nothing: the bytes come from memory either way, and xxhash
# holds the GIL.
# Sidecars of version 1 have none of this: they load and stream unchecked, ``verify``
# names them, and ``shardstream index`` rewrites them.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from shardstream.crc import crc32
from shardstream.errors import FormatError, UsageError
from shardstream.types import ByteRange

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

    def whole_crc(self) -> int:
        """The CRC-32 of the whole shard, joined from its block CRCs (what a cache fill
        checks its download against: NOTE [ Filling the cache ] in storage/cached.py)."""
        full = self.size // self.block
        crcs = self.crcs.tolist()
        joined = joined_crc(crcs[:full], self.block)
        if full == len(crcs):
            return joined
        tail = self.size - full * self.block  # the short last block: any length, so no tables
        zeros = bytes(tail)
        return crc32(zeros, joined) ^ crc32(zeros) ^ crcs[-1]

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
        ``rng.start``) fail their CRC; ``rng`` must be one that :meth:`widen` gives. Its
        whole blocks are checked at once (NOTE [ One CRC per read ]), one by one only
        where that fails, to name them."""
        if self.widen(rng) != rng:
            raise UsageError(f"bytes [{rng.start}, {rng.end}) do not start and end at check blocks")
        view = memoryview(data).cast("B")
        if len(view) < rng.length:
            raise FormatError(
                f"got {len(view)} bytes for the {rng.length} of [{rng.start}, {rng.end})", offset=rng.start
            )
        block = self.block
        first, whole = rng.start // block, rng.length // block
        expected = self.crcs[first : -(-rng.end // block)].tolist()
        if whole and crc32(view[: whole * block]) == joined_crc(expected[:whole], block):
            expected, skipped = expected[whole:], whole  # only a short last block is left
        else:
            skipped = 0
        bad = []
        for number, want in enumerate(expected, skipped):
            lo = number * block
            if crc32(view[lo : lo + block if lo + block < rng.length else rng.length]) != want:
                bad.append(rng.start + lo)
        return bad


def joined_crc(crcs: list[int], length: int) -> int:
    """The CRC-32 of pieces of ``length`` bytes laid end to end, from the CRC of each
    (zlib's ``crc32_combine``, for pieces of one length: NOTE [ One CRC per read ])."""
    if not crcs:
        return 0
    t0, t1, t2, t3 = _shift_tables(length)
    joined = crcs[0]
    for crc in crcs[1:]:
        joined = (
            t0[joined & 0xFF] ^ t1[(joined >> 8) & 0xFF] ^ t2[(joined >> 16) & 0xFF] ^ t3[joined >> 24] ^ crc
        )
    return joined


@functools.lru_cache(maxsize=8)
def _shift_tables(length: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """What ``length`` zero bytes do to a CRC-32, a linear map over GF(2), as four tables
    of 256 (one per byte of the CRC), as zlib's ``crc32_combine`` builds it from the
    operator for one zero bit."""
    bit = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit (the reflected polynomial)
    power = _square(_square(_square(bit)))  # one zero byte
    shift = [1 << n for n in range(32)]  # the identity: no zero bytes yet
    while length:
        if length & 1:
            shift = [_times(power, column) for column in shift]
        power = _square(power)
        length >>= 1
    return tuple([_times(shift, b << (8 * k)) for b in range(256)] for k in range(4))  # type: ignore[return-value]


def _times(matrix: list[int], vector: int) -> int:
    """``matrix`` (32 columns) times ``vector`` over GF(2)."""
    out, n = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[n]
        vector >>= 1
        n += 1
    return out


def _square(matrix: list[int]) -> list[int]:
    return [_times(matrix, column) for column in matrix]


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
