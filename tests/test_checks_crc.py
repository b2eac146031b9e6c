"""The read checks' CRC is zlib's CRC-32, whichever library computes it (NOTE [ Checksummed reads ])."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.formats import checks as _checks
from shardstream.types import ByteRange


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=70_000), start=st.integers(0, 2**32 - 1))
def test_the_check_crc_is_zlibs_crc32(data, start):
    assert _checks.crc32(data) == zlib.crc32(data)
    assert _checks.crc32(data, start) == zlib.crc32(data, start)
    assert _checks.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


def test_block_hasher_crcs_equal_zlib_per_block():
    data = bytes(range(256)) * 1000  # 256,000 bytes: three full 64 KiB blocks and a short one
    hasher = _checks.BlockHasher()
    for piece in range(0, len(data), 10_007):
        hasher.update(data[piece : piece + 10_007])
    block = _checks.BLOCK
    want = [zlib.crc32(data[i : i + block]) for i in range(0, len(data), block)]
    checks = hasher.checks()
    assert checks.size == len(data)
    assert checks.crcs.tolist() == want
    assert len(want) == 4


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=20_000),
    block=st.sampled_from([512, 1000, 4096]),
    bounds=st.tuples(st.integers(0, 20_000), st.integers(0, 20_000)),
    flips=st.lists(st.integers(0, 20_000), max_size=3),
)
def test_a_reads_blocks_are_checked_at_once_and_named_one_by_one_where_they_fail(data, block, bounds, flips):
    """NOTE [ One CRC per read ]: the block CRCs of a read join into its CRC (short last
    block too), and where the bytes differ every damaged block is named, none other."""
    hasher = _checks.BlockHasher(block)
    hasher.update(data)
    checks = hasher.checks()
    lo, hi = sorted(min(b, len(data)) for b in bounds)
    rng = checks.widen(ByteRange(lo, max(hi, lo + 1) if lo < len(data) else hi))
    if not rng.length:
        assert checks.bad_blocks(b"", rng) == []
        return
    first, stop = rng.start // block, -(-rng.end // block)
    whole = rng.start + (stop - first - 1) * block  # the blocks before the last one
    assert _checks._joined(checks.crcs[first : stop - 1], block) == zlib.crc32(data[rng.start : whole])
    got = bytearray(data[rng.start : rng.end])
    damaged = set()
    for at in {flip % rng.length for flip in flips}:
        got[at] ^= 0x5A
        damaged.add(rng.start + at - at % block)
    assert checks.bad_blocks(bytes(got), rng) == sorted(damaged)


@pytest.mark.parametrize("count", [0, 1, 2, 64, 65, 257, 4097])
def test_many_block_crcs_join_into_the_crc_of_their_bytes(count):
    """The join in Python (a few blocks) and in numpy rounds of 16 (more), zeros in front
    filling the first round (NOTE [ One CRC per read ])."""
    block = 512
    data = np.random.default_rng(count).integers(0, 256, count * block, dtype=np.uint8).tobytes()
    crcs = np.array([zlib.crc32(data[i : i + block]) for i in range(0, len(data), block)], dtype=np.uint32)
    assert _checks._joined(crcs, block) == zlib.crc32(data)
    assert _checks._joined(crcs[1:], block) == zlib.crc32(data[block:])
