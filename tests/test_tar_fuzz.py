"""Fuzz tests of the tar scanner (issue 10): arbitrary bytes, and real tars with bytes flipped,
cut or inserted, give a ``ShardstreamError`` or a valid index, never another exception, a
hang or unbounded memory.

Bounded for CI: a few hundred examples each, with no per-example deadline (timing is never
asserted in tests). The inputs are a few KB, so an allocation that follows a size field
instead of the file's bytes fails loudly (a ``MemoryError``), and a loop that does not
advance hangs the run (pytest's timeout).
"""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import ShardstreamError
from shardstream.formats import TarFormat
from shardstream.formats.tar.members import tar_members
from shardstream.formats.tar.scan import scan_tar
from shardstream.types import ByteRange
from tests.tar_bytes import gnu_long_name, member, pax, pax_record, tar
from tests.test_formats import write_shard
from tests.test_formats_tar import SAMPLES

FMT = TarFormat()
FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def tarfile_tar(fmt: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for name, data in [("a/k1.txt", b"one"), ("a/k1.json", b"{}"), ("l" * 120 + ".txt", b"long")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("a/")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)
    return buffer.getvalue()


REAL = [
    write_shard(FMT, SAMPLES[:3])[0],  # ours, with a PAX path
    tarfile_tar(tarfile.GNU_FORMAT),  # GNU long names
    tarfile_tar(tarfile.PAX_FORMAT),
    tar(
        pax(pax_record(b"comment", b"x" * 40), b"g"),
        gnu_long_name(b"k" * 150 + b".txt"),
        member(b"k.txt", b"v"),
    ),
]


class _Stream(io.RawIOBase):
    """Non-seekable, short reads: as a pipe or an HTTP body."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self._inner.read(min(len(buffer), 333))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def index_or_error(data: bytes, *, stream: bool = False):
    """The index of ``data``, or the ShardstreamError it raises (any other exception fails)."""
    fileobj = io.BufferedReader(_Stream(data)) if stream else io.BytesIO(data)
    try:
        return scan_tar(fileobj, "fuzz.tar")
    except ShardstreamError as error:
        raised = error
    assert raised.shard == "fuzz.tar"
    assert raised.offset is None or 0 <= raised.offset <= len(data)
    assert len(str(raised)) < 5000
    return raised


def check(data: bytes) -> None:
    """Both ways of reading agree, and a valid index points only at the file's bytes."""
    index = index_or_error(data)
    streamed = index_or_error(data, stream=True)
    if isinstance(index, ShardstreamError):
        assert isinstance(streamed, ShardstreamError)
        return
    assert not isinstance(streamed, ShardstreamError)
    assert streamed.to_bytes() == index.to_bytes()
    assert FMT.load_index(index.to_bytes(), name="fuzz.tar") == index
    samples = list(FMT.decode(data, ByteRange(0, len(data)), index, 0, index.num_samples, name="fuzz.tar"))
    assert [s["__key__"] for s in samples] == index.keys
    members = list(tar_members(io.BytesIO(data), "fuzz.tar"))
    for m in members:
        assert m.data == data[m.data_offset : m.data_offset + m.size]


@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes(data):
    check(data)


@FUZZ
@given(
    st.binary(max_size=3 * 512).map(
        lambda head: head.ljust(512 * ((len(head) + 511) // 512), b"\0") + bytes(1024)
    )
)
def test_arbitrary_blocks_then_an_end_marker(data):
    check(data)


@FUZZ
@given(
    st.sampled_from(range(len(REAL))),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_real_tars_with_bytes_changed(which, changes):
    data = bytearray(REAL[which])
    for position, value in changes:
        data[position % len(data)] = value
    check(bytes(data))


@FUZZ
@given(
    st.sampled_from(range(len(REAL))),
    st.integers(0, 1 << 16),
    st.integers(0, 1 << 16),
    st.binary(max_size=600),
)
def test_real_tars_cut_and_spliced(which, cut, at, inserted):
    data = REAL[which]
    cut, at = cut % (len(data) + 1), at % (len(data) + 1)
    check(data[:cut])
    check(data[:at] + inserted + data[at:])


_NAMES = st.sampled_from(
    [b"k.txt", b"k.json", b"a/b.txt", b"k.__key__", b"./x.y.z", b"noext", b"d/", b""]
) | st.binary(max_size=300)
_PAX_VALUES = st.binary(max_size=200) | st.text("0123456789", max_size=6000).map(str.encode)
_PAX_KEYS = st.sampled_from([b"path", b"size", b"mtime", b"GNU.sparse.major", b"comment", b"linkpath"])
_PAX = st.lists(st.tuples(_PAX_KEYS, _PAX_VALUES), max_size=4).map(
    lambda records: b"".join(pax_record(k, v) for k, v in records)
)
_PIECES = st.one_of(
    st.tuples(_NAMES, st.binary(max_size=700)).map(lambda m: member(m[0], m[1])),
    st.tuples(_NAMES, st.sampled_from([b"1", b"2", b"5", b"S", b"K", b"V", b"7", b"\0"])).map(
        lambda m: member(m[0], b"data", m[1])
    ),
    _PAX.map(pax),
    _PAX.map(lambda records: pax(records, b"g")),
    _NAMES.map(gnu_long_name),
)


@FUZZ
@given(st.lists(_PIECES, max_size=6), st.booleans())
def test_tars_built_from_odd_headers(pieces, ended):
    """Headers a tar writer could emit, in any order: PAX records of any value, long names,
    links, sparse and unknown types."""
    data = b"".join(pieces)
    check(tar(data) if ended else data)


@pytest.mark.parametrize("data", REAL)
def test_the_seeds_are_valid_tars(data):
    index = index_or_error(data)
    assert not isinstance(index, ShardstreamError)
    assert index.num_samples > 0
