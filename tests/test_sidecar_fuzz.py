"""Fuzz the sample-index sidecars of both formats (issue 10, "Keep it so").

Arbitrary bytes, and real sidecars (tar and Parquet, with checks) mutated, truncated or
extended, with and without their CRC fixed up afterwards (so that the mutation reaches the
parser's own checks): loading gives a ``FormatError`` or a valid index, never another
exception, a hang or unbounded memory; a valid tar index decodes its shard or raises
``FormatError``.
"""

from __future__ import annotations

import io
import struct
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import FormatError
from shardstream.formats import get_format
from shardstream.formats._sidecar import MAGIC
from shardstream.formats.checks import BlockHasher
from shardstream.types import ByteRange

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
KINDS = {"tar": b"tar\0", "parquet": b"pq\0\0"}


def real_tar() -> tuple[bytes, bytes]:
    fmt = get_format("tar")
    buffer = io.BytesIO()
    encoder = fmt.encoder(buffer, name="t.tar")
    for i in range(12):
        encoder.write({"__key__": f"k{i:02d}", "txt": b"x" * (i * 37), "cls": b"%d" % i})
    index = encoder.close()
    data = buffer.getvalue()
    hasher = BlockHasher(block=1024)  # small blocks: several CRCs in a small shard
    hasher.update(data)
    index.bind_checks(hasher.checks())
    return data, index.to_bytes()


def real_parquet() -> tuple[bytes, bytes]:
    buffer = io.BytesIO()
    table = pa.table({"__key__": [f"k{i}" for i in range(40)], "n": list(range(40))})
    pq.write_table(table, buffer, row_group_size=10)
    data = buffer.getvalue()
    index, _ = get_format("parquet").build_index(io.BytesIO(data), name="p.parquet")
    hasher = BlockHasher(block=512)
    hasher.update(data)
    index.bind_checks(hasher.checks())
    return data, index.to_bytes()


REAL = {"tar": real_tar(), "parquet": real_parquet()}


def reseal(data: bytes) -> bytes:
    """``data`` with the sidecar header's CRC made right again (if it has a header)."""
    if len(data) < 24:
        return data
    crc = zlib.crc32(data[20:], zlib.crc32(data[12:16]))
    return data[:16] + struct.pack("<I", crc) + data[20:]


def check_loads(fmt_name: str, blob: bytes) -> None:
    fmt = get_format(fmt_name)
    try:
        index = fmt.load_index(blob, name="fuzz")
    except FormatError:
        return
    n = index.num_samples
    assert n >= 0
    starts = range(0, n + 1, max(1, n // 8))
    for start, stop in [(a, n) for a in starts] + [(a, min(n, a + 1)) for a in starts]:
        rng = index.byte_range(start, stop)
        assert 0 <= rng.start <= rng.end
        if index.checks is not None:
            wide = index.read_range(start, stop)
            assert wide.start <= rng.start
            assert rng.end <= wide.end <= index.checks.size
    index.key_slice(0, min(n, 3))  # type: ignore[attr-defined]
    if fmt_name == "tar":
        data = REAL["tar"][0]
        try:
            samples = list(fmt.decode(data, ByteRange(0, len(data)), index, 0, min(n, 20), name="fuzz"))
        except FormatError:
            return
        assert len(samples) == min(n, 20)


@pytest.mark.parametrize("fmt_name", ["tar", "parquet"])
@FUZZ
@given(blob=st.binary(max_size=2048))
def test_arbitrary_bytes_are_a_format_error_or_an_index(fmt_name, blob):
    check_loads(fmt_name, blob)
    # the same bytes behind a right header: they reach the section parser
    head = MAGIC + KINDS[fmt_name] + struct.pack("<HHIQ", 2, len(blob) // 64, 0, len(blob))
    check_loads(fmt_name, reseal(head + blob))


@pytest.mark.parametrize("fmt_name", ["tar", "parquet"])
@FUZZ
@given(data=st.data())
def test_mutated_real_sidecars_are_a_format_error_or_a_valid_index(fmt_name, data):
    blob = bytearray(REAL[fmt_name][1])
    place, byte = st.integers(0, len(blob) - 1), st.integers(0, 255)
    for position, value in data.draw(st.lists(st.tuples(place, byte), min_size=1, max_size=6)):
        blob[position] = value
    cut = data.draw(st.one_of(st.none(), place))
    if cut is not None:
        del blob[cut:]
    blob += data.draw(st.binary(max_size=64))
    check_loads(fmt_name, bytes(blob))
    check_loads(fmt_name, reseal(bytes(blob)))  # past the CRC: the parser's own checks


@pytest.mark.parametrize("fmt_name", ["tar", "parquet"])
@FUZZ
@given(
    section=st.integers(min_value=0, max_value=15), word=st.integers(min_value=-(2**63), max_value=2**63 - 1)
)
def test_a_counts_word_set_to_any_value_is_a_format_error_or_a_valid_index(fmt_name, section, word):
    """The first section holds the counts (samples, fields, members, archive end; or row
    groups, file size, ...): each set to anything, from 0 to 2**63, CRC fixed."""
    blob = bytearray(REAL[fmt_name][1])
    nsections = struct.unpack_from("<H", blob, 14)[0]
    payload = 32 + 8 * nsections
    slot = payload + 8 * (section % 4)
    blob[slot : slot + 8] = struct.pack("<q", word)
    check_loads(fmt_name, reseal(bytes(blob)))


def test_the_real_sidecars_load():
    for fmt_name, (_, blob) in REAL.items():
        index = get_format(fmt_name).load_index(blob, name="x")
        assert index.checks is not None
        assert index.num_samples == (12 if fmt_name == "tar" else 40)
