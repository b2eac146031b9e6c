"""The read checks' CRC is zlib's CRC-32, whichever library computes it (NOTE [ Checksummed reads ])."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.formats import checks as _checks


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
