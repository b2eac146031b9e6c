"""The read checks' CRC is zlib's CRC-32, whichever library computes it (NOTE [ Checksummed reads ])."""

from __future__ import annotations

import zlib

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
def test_every_damaged_block_of_a_read_is_named_and_none_other(data, block, bounds, flips):
    """What ``on_error="skip"`` leaves out: the blocks whose bytes differ (the shard's
    short last block too), each by its offset, and no other."""
    hasher = _checks.BlockHasher(block)
    hasher.update(data)
    checks = hasher.checks()
    lo, hi = sorted(min(b, len(data)) for b in bounds)
    rng = checks.widen(ByteRange(lo, max(hi, lo + 1) if lo < len(data) else hi))
    if not rng.length:  # the reader checks no empty read
        return
    assert checks.bad_blocks(data[rng.start : rng.end], rng) == []
    got = bytearray(data[rng.start : rng.end])
    damaged = set()
    for at in {flip % rng.length for flip in flips}:
        got[at] ^= 0x5A
        damaged.add(rng.start + at - at % block)
    assert checks.bad_blocks(bytes(got), rng) == sorted(damaged)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=20_000), block=st.sampled_from([512, 1000, 4096]))
def test_block_crcs_join_into_the_crc_of_their_bytes(data, block):
    """NOTE [ One CRC per read ]: a read's whole blocks are checked by one CRC against
    their CRCs joined, and a cache fill by the shard's CRC joined from all of them."""
    hasher = _checks.BlockHasher(block)
    hasher.update(data)
    checks = hasher.checks()
    full = len(data) // block
    assert _checks.joined_crc(checks.crcs[:full].tolist(), block) == zlib.crc32(data[: full * block])
    assert checks.whole_crc() == zlib.crc32(data)
