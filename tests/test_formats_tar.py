"""The tar codec: header layout, webdataset/tarfile/GNU tar interop, validation, corrupt tars.

Property tests (hypothesis) are in ``test_formats_tar_properties.py``.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

import pytest
import webdataset as wds

from shardstream.errors import FormatError, PackError
from shardstream.formats import TarFormat
from shardstream.formats._sidecar import pack_strings, unpack_strings
from shardstream.formats.tar.header import BLOCK
from shardstream.types import ByteRange
from tests.test_formats import write_shard

FMT = TarFormat()


def decode_all(data: bytes, index) -> list[dict]:
    return list(FMT.decode(data, ByteRange(0, len(data)), index, 0, index.num_samples, name="t"))


def tar_members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as archive:
        return [(m.name, archive.extractfile(m).read()) for m in archive if m.isfile()]


def expected_members(samples) -> list[tuple[str, bytes]]:
    members = []
    for sample in samples:
        for field in sorted(f for f in sample if not f.startswith("_")):
            value = sample[field]
            members.append(
                (f"{sample['__key__']}.{field}", value if isinstance(value, bytes) else str(value).encode())
            )
    return members


SAMPLES = [
    {"__key__": "a/b/img001", "seg.png": b"\x89PNG" * 100, "jpg": b"\xff\xd8" * 3000, "cls": b"3"},
    {"__key__": "a/b/img002", "seg.png": b"", "jpg": b"j", "cls": b"4"},
    {"__key__": "x" * 96, "txt": b"a ustar name of exactly 100 bytes"},
    {"__key__": "p" * 150 + "/" + "n" * 90, "txt": b"prefix/name split"},
    {"__key__": "q" * 200 + "/" + "r" * 200, "txt": b"needs a PAX path"},
    {"__key__": "ünïcødé/ключ", "txt": "текст".encode()},
]


def test_header_layout_is_compact_and_deterministic():
    data, index = write_shard(FMT, SAMPLES[:2])
    # one 512-byte header per member, data padded to blocks, two zero blocks at the end
    sizes = [400, 6000, 1, 0, 1, 1]
    assert len(data) == sum(BLOCK + -(-s // BLOCK) * BLOCK for s in sizes) + 2 * BLOCK
    assert data.endswith(bytes(1024))
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            assert (member.mode, member.uid, member.gid, member.mtime) == (0o444, 0, 0, 0)
            assert (member.uname, member.gname) == ("", "")
            assert member.type == tarfile.REGTYPE
            assert not member.pax_headers
    # three headers; cls: 1 byte padded to a block; jpg: 6000 padded to 6144; seg.png: 400, unpadded
    assert index.byte_range(0, 1) == ByteRange(0, 3 * BLOCK + BLOCK + 6144 + 400)


def test_pax_only_when_a_name_does_not_fit():
    data, index = write_shard(FMT, SAMPLES)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        pax = {m.name: dict(m.pax_headers) for m in archive.getmembers()}
    assert {name for name, headers in pax.items() if headers} == {"q" * 200 + "/" + "r" * 200 + ".txt"}
    assert tar_members(data) == expected_members(SAMPLES)
    assert decode_all(data, index) == SAMPLES


def test_webdataset_reads_our_tar_byte_for_byte(tmp_path):
    samples = [
        {"__key__": f"shard/{i:04d}", "txt": b"t" * i, "cls": str(i).encode(), "seg.png": bytes([i])}
        for i in range(40)
    ]
    samples += SAMPLES
    data, _ = write_shard(FMT, samples)
    path = tmp_path / "ours.tar"
    path.write_bytes(data)
    dataset = wds.WebDataset(str(path), shardshuffle=False, empty_check=False)
    got = [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in dataset]
    assert got == samples


def test_gnu_tar_lists_and_extracts_our_tar(tmp_path):
    data, _ = write_shard(FMT, SAMPLES)
    (tmp_path / "ours.tar").write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    listing = subprocess.run(["tar", "-tf", "ours.tar"], cwd=tmp_path, check=True, capture_output=True)
    assert listing.stderr == b""
    assert listing.stdout.decode().splitlines() == [name for name, _ in expected_members(SAMPLES)]
    subprocess.run(["tar", "-xf", "../ours.tar"], cwd=out, check=True, capture_output=True)
    for name, payload in expected_members(SAMPLES):
        assert (out / name).read_bytes() == payload


def test_values_are_converted_like_webdataset():
    buffer = io.BytesIO()
    encoder = FMT.encoder(buffer, name="t")
    encoder.write(
        {
            "__key__": "k1",
            "cls": 7,
            "txt": "héllo",
            "raw": bytearray(b"ab"),
            "mv": memoryview(b"cd"),
            "__url__": "ignored",
        }
    )
    index = encoder.close()
    assert decode_all(buffer.getvalue(), index) == [
        {"__key__": "k1", "cls": b"7", "mv": b"cd", "raw": b"ab", "txt": "héllo".encode()}
    ]


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"__key__": "", "txt": b"x"}, "non-empty"),
        ({"__key__": 5, "txt": b"x"}, "str"),
        ({"txt": b"x"}, "None"),
        ({"__key__": "a.b", "txt": b"x"}, "'.'"),
        ({"__key__": "dir/", "txt": b"x"}, "last path part"),
        ({"__key__": "nul\0", "txt": b"x"}, "NUL"),
        ({"__key__": "k", "txt": 1.5}, "'txt'"),
        ({"__key__": "k", "txt": True}, "'txt'"),
        ({"__key__": "k", "txt": None}, "'txt'"),
        ({"__key__": "k", "a/b": b"x"}, "'a/b'"),
        ({"__key__": "k", "": b"x"}, "non-empty"),
        ({"__key__": "k"}, "no fields"),
        ({"__key__": "k", 3: b"x"}, "str"),
        ({"__key__": "__meta__/k", "txt": b"x"}, "metadata"),
        ({"__key__": "\udcff", "txt": b"x"}, "Unicode"),
        ([("__key__", "k")], "dict"),
    ],
)
def test_invalid_samples_are_rejected_and_nothing_is_written(sample, message):
    buffer = io.BytesIO()
    encoder = FMT.encoder(buffer, name="shard-9")
    encoder.write({"__key__": "first", "txt": b"ok"})
    before = buffer.getvalue()
    with pytest.raises(PackError, match=message) as error:
        encoder.write(sample)
    assert error.value.shard == "shard-9"
    assert buffer.getvalue() == before
    assert encoder.num_samples == 1
    encoder.write({"__key__": "last", "txt": b"ok"})
    index = encoder.close()
    assert [s["__key__"] for s in decode_all(buffer.getvalue(), index)] == ["first", "last"]


def test_repeated_key_is_rejected_because_webdataset_would_merge_the_samples():
    encoder = FMT.encoder(io.BytesIO(), name="t")
    encoder.write({"__key__": "same", "txt": b"1"})
    with pytest.raises(PackError, match="repeats"):
        encoder.write({"__key__": "same", "json": b"2"})
    encoder.write({"__key__": "other", "txt": b"3"})
    encoder.write({"__key__": "same", "txt": b"4"})  # not consecutive: two samples for webdataset too


def test_sample_size_counts_pax_headers():
    for sample in SAMPLES:
        data, _ = write_shard(FMT, [sample])
        assert FMT.sample_size(sample) == len(data) - 2 * BLOCK


# --- tars written by other tools ------------------------------------------------------


def test_webdataset_tarwriter_and_shardwriter_pax(tmp_path):
    samples = [{"__key__": f"deep/{'d' * 120}/s{i:03d}", "txt": f"text {i}", "cls": i} for i in range(25)]
    samples.append({"__key__": "ünï", "txt": "x", "cls": 1})
    path = tmp_path / "wds.tar"
    with wds.TarWriter(str(path), format="PAX_FORMAT") as writer:
        for sample in samples:
            writer.write(sample)
    expected = [
        {"__key__": s["__key__"], "cls": str(s["cls"]).encode(), "txt": s["txt"].encode()} for s in samples
    ]
    with path.open("rb") as f:
        index, fields = FMT.build_index(f, name="wds.tar")
    assert fields == ("cls", "txt")
    data = path.read_bytes()
    assert decode_all(data, index) == expected
    rng = index.byte_range(3, 17)
    assert list(FMT.decode(data[rng.start : rng.end], rng, index, 3, 17, name="w")) == expected[3:17]

    pattern = str(tmp_path / "shard-%03d.tar")
    with wds.ShardWriter(pattern, maxcount=10, verbose=0, format="PAX_FORMAT") as writer:
        for sample in samples:
            writer.write(sample)
    got = []
    for i in range(3):
        shard = (tmp_path / f"shard-{i:03d}.tar").read_bytes()
        index, _ = FMT.build_index(io.BytesIO(shard), name=f"shard-{i}")
        got += decode_all(shard, index)
    assert got == expected


def test_gnu_tar_with_long_names_and_directories(tmp_path):
    if shutil.which("tar") is None:  # pragma: no cover - GNU tar is part of the test image
        pytest.fail("GNU tar is needed for this test")
    root = tmp_path / "corpus"
    files = {
        "a/b/img001.jpg": b"jpeg-1",
        "a/b/img001.seg.png": b"png-1",
        "a/b/img002.jpg": b"jpeg-2" * 1000,
        "a/b/img002.seg.png": b"",
        ("l" * 120) + "/" + ("m" * 110) + ".txt": b"gnu long name",
        "notes/README": b"no extension: not a sample",
        "z.txt": b"last",
    }
    for name, payload in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(payload)
    for fmt_flag in ("--format=gnu", "--format=posix"):
        out = tmp_path / f"gnu{fmt_flag[9:]}.tar"
        subprocess.run(["tar", fmt_flag, "--sort=name", "-cf", str(out), "-C", str(root), "."], check=True)
        data = out.read_bytes()
        index, fields = FMT.build_index(io.BytesIO(data), name=out.name)
        assert fields == ("jpg", "seg.png", "txt")
        got = decode_all(data, index)
        assert got == [
            {"__key__": "./a/b/img001", "jpg": b"jpeg-1", "seg.png": b"png-1"},
            {"__key__": "./a/b/img002", "jpg": b"jpeg-2" * 1000, "seg.png": b""},
            {"__key__": "./" + "l" * 120 + "/" + "m" * 110, "txt": b"gnu long name"},
            {"__key__": "./z", "txt": b"last"},
        ]
        rng = index.byte_range(2, 3)
        assert list(FMT.decode(data[rng.start : rng.end], rng, index, 2, 3, name="g")) == got[2:3]
        wds_keys = [s["__key__"] for s in wds.WebDataset(str(out), shardshuffle=False, empty_check=False)]
        assert wds_keys == [s["__key__"] for s in got]


def raw_header(name: bytes, size: int, typeflag: bytes = b"0") -> bytes:
    info = tarfile.TarInfo(name.decode())
    info.size, info.type = size, typeflag
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def test_duplicate_field_in_a_sample_is_a_format_error():
    data = (
        raw_header(b"k.txt", 1)
        + b"a".ljust(BLOCK, b"\0")
        + raw_header(b"k.txt", 1)
        + b"b".ljust(BLOCK, b"\0")
    )
    with pytest.raises(FormatError, match="twice") as error:
        FMT.build_index(io.BytesIO(data + bytes(1024)), name="dup.tar")
    assert error.value.offset == 2 * BLOCK
    assert error.value.shard == "dup.tar"


def test_metadata_and_dotless_members_are_skipped_like_webdataset():
    members = [(b"__meta__", b"m"), (b"__info__/x.json", b"i"), (b"README", b"r"), (b"k.txt", b"t")]
    data = b"".join(raw_header(n, len(p)) + p.ljust(BLOCK, b"\0") for n, p in members) + bytes(1024)
    index, fields = FMT.build_index(io.BytesIO(data), name="m.tar")
    assert fields == ("txt",)
    assert decode_all(data, index) == [{"__key__": "k", "txt": b"t"}]


def test_zero_sample_tar_and_a_lone_end_block():
    index, fields = FMT.build_index(io.BytesIO(bytes(BLOCK)), name="e")
    assert (index.num_samples, fields) == (0, ())


class _Stream(io.RawIOBase):
    """A non-seekable stream, as from a pipe or an HTTP body."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self._inner.read(min(len(buffer), 700))  # short reads, as sockets give
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_build_index_from_a_non_seekable_stream():
    data, index = write_shard(FMT, SAMPLES)
    built, _ = FMT.build_index(io.BufferedReader(_Stream(data)), name="t")
    assert built == index
    with pytest.raises(FormatError, match="truncated"):
        FMT.build_index(io.BufferedReader(_Stream(data[: len(data) - 1500])), name="t")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:100], "truncated header"),
        (lambda d: d[: len(d) - 1024], "no end-of-archive"),
        (lambda d: d[: BLOCK + 10], "past the end"),
        (lambda d: b"\x01" + d[1:], "checksum"),
        (lambda d: b"garbage!" * 64 + d, "not a tar header"),
        (lambda d: d[:124] + b"9" * 11 + d[135:], "non-numeric"),
    ],
)
def test_corrupt_tars_name_the_shard_and_offset(mutate, message):
    data, _ = write_shard(FMT, SAMPLES[:2])
    with pytest.raises(FormatError, match=message) as error:
        FMT.build_index(io.BytesIO(mutate(data)), name="bad.tar")
    assert error.value.shard == "bad.tar"
    assert error.value.offset is not None


@pytest.mark.parametrize(
    "strings",
    [
        ["k0", "é", "", "k\udcff"],
        [f"{i:06d}" for i in range(50)],
        ["ab", "cd", "é"],
        ["a\0", "b\0"],
        [""] * 3,
    ],
)
def test_a_sidecar_string_table_is_decoded_on_first_use(strings):
    """NOTE [ Keys on first use ]: loading a sidecar checks its string tables and keeps
    them as stored; their strings (surrogates too) are decoded once, when first asked."""
    blob, ends = pack_strings(strings)
    table = unpack_strings(memoryview(blob), memoryview(ends), len(strings), name="t.tar", what="keys")
    assert len(table) == len(strings)
    assert table.sections() == (blob, ends)
    assert table.strings() == strings
    assert table.strings() is table.strings()
