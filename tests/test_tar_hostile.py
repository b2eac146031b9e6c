"""Hostile and unlucky tars (issue 10): forged keys, keys that leave the folder, archives
that cost memory or CPU out of proportion to their bytes, compressed files named ``.tar``,
and names too long to print.

The resource cases run ``pack`` in a child process under an address-space limit and a
timeout, so a regression fails the test instead of eating the machine.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import zlib

import fsspec
import pytest

from shardstream.catalog import index_dataset
from shardstream.errors import FormatError, PackError, ShardstreamError
from shardstream.formats import TarFormat
from shardstream.formats.tar import TarIndex
from shardstream.formats.tar.members import tar_members
from shardstream.pack import ShardWriter, pack
from shardstream.types import ByteRange
from tests.tar_bytes import BLOCK, gnu_long_name, header, member, padded, pax, pax_record, tar
from tests.test_pack import read_shards

FMT = TarFormat()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- fields starting with "_" (item 7) --------------------------------------------------


@pytest.mark.parametrize("field", [b"__key__", b"_private"])
def test_index_refuses_a_field_that_would_forge_the_key(field):
    data = tar(member(b"k.txt", b"text"), member(b"k." + field, b"forged"))
    with pytest.raises(FormatError, match="metadata") as error:
        FMT.build_index(io.BytesIO(data), name="forged.tar")
    assert (error.value.shard, error.value.offset) == ("forged.tar", 2 * BLOCK)


def test_pack_refuses_a_field_that_would_forge_the_key(tmp_path):
    (tmp_path / "forged.tar").write_bytes(tar(member(b"k.txt", b"text"), member(b"k.__key__", b"other")))
    with pytest.raises(PackError, match="metadata") as error:  # was a TypeError
        pack(tmp_path / "forged.tar", tmp_path / "out", workers=1)
    assert error.value.url.endswith("forged.tar")
    assert error.value.offset == 2 * BLOCK


def test_a_sample_index_with_a_metadata_field_is_refused():
    """What streaming loads: a sidecar written before the index refused such members."""
    old = TarIndex.from_lists(
        name="old.tar",
        keys=["k"],
        sample_start=[0],
        member_first=[0, 1],
        fields=["__key__"],
        member_field=[0],
        member_offset=[BLOCK],
        member_size=[6],
        archive_end=2 * BLOCK,
    )
    with pytest.raises(FormatError, match="metadata") as error:
        FMT.load_index(old.to_bytes(), name="old.tar")
    assert error.value.shard == "old.tar"


# --- keys that would leave the folder when a shard is extracted (item 10) ---------------

UNSAFE = ["../../x", "/etc/cron.d/x", "/etc", "a/../../x", "..", "a\\..\\x", "C:x", "C:/x", "k\0"]


@pytest.mark.parametrize(("fmt", "key"), [("tar", "../../x"), ("tar", "/etc/cron.d/x"), ("tar", "a\\b")])
def test_jsonl_with_an_unsafe_key_is_refused_naming_key_and_line(tmp_path, fmt, key):
    lines = [
        {"__key__": "a/b/c", "txt": "fine"},
        {"__key__": "a/b/d", "txt": "fine"},
        {"__key__": key, "txt": "x"},
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(PackError, match="relative path") as error:
        pack(tmp_path / "in.jsonl", tmp_path / "out", format=fmt, workers=1)
    assert repr(key) in error.value.message
    assert error.value.url.endswith("in.jsonl")
    assert error.value.line == 3


@pytest.mark.parametrize("fmt", ["tar"])
@pytest.mark.parametrize("shard_size", [None, "1MB"])
def test_shard_writer_refuses_unsafe_keys(tmp_path, fmt, shard_size):
    with ShardWriter(tmp_path / "ds", format=fmt, shard_size=shard_size) as writer:
        writer.write({"__key__": "a/b/c", "txt": "fine"})  # this field set now takes the fast paths
        for key in UNSAFE:
            with pytest.raises(PackError, match=r"relative path|NUL"):
                writer.write({"__key__": key, "txt": "x"})
        writer.write({"__key__": "./d/b..c/e", "txt": "fine too"})
    assert [s["__key__"] for s in read_shards(tmp_path / "ds")] == ["a/b/c", "./d/b..c/e"]


@pytest.mark.parametrize("shard_size", [None, "1MB"])
def test_parquet_keys_are_values_and_refuse_only_nul(tmp_path, shard_size):
    # Parquet keys never name files (NOTE [ Safe sample keys ]): IDs such as q:123 are fine
    keys = ["q:123", "C:x", "a\\b", "../x", "/abs"]
    with ShardWriter(tmp_path / "ds", format="parquet", shard_size=shard_size) as writer:
        for key in keys:
            writer.write({"__key__": key, "txt": "x"})
        with pytest.raises(PackError, match="NUL"):
            writer.write({"__key__": "k\0", "txt": "x"})
    assert [s["__key__"] for s in read_shards(tmp_path / "ds")] == keys
    with pytest.raises(PackError, match="Windows drive"), ShardWriter(tmp_path / "t", format="tar") as writer:
        writer.write({"__key__": "q:123", "txt": "x"})  # a tar member name stays a path


@pytest.mark.parametrize("shard_size", [None, "1MB"])
@pytest.mark.parametrize("field", ["x\\..\\..\\evil", "x\\y", "x\0y", "x/y"])
def test_tar_field_names_are_refused_where_a_member_name_would_be_a_path(tmp_path, shard_size, field):
    with ShardWriter(tmp_path / "ds", format="tar", shard_size=shard_size) as writer:
        writer.write({"__key__": "a", "txt": "fine"})
        with pytest.raises(PackError, match="field name") as error:
            writer.write({"__key__": "b", field: "x"})
        assert repr(field) in error.value.message
        with pytest.raises(PackError, match="field name"):
            writer.write({"__key__": "c", "txt": "y", field: "x"})
    assert [s["__key__"] for s in read_shards(tmp_path / "ds")] == ["a"]


@pytest.mark.parametrize("name", [b"../../evil.txt", b"/etc/cron.d/x.txt", b"a/../../x.txt", b"a\\b.txt"])
def test_a_tar_with_unsafe_member_names_is_refused_when_repacked(tmp_path, name):
    (tmp_path / "in.tar").write_bytes(tar(member(b"ok.txt", b"1"), member(name, b"2")))
    with pytest.raises(PackError, match="relative path") as error:
        pack(tmp_path / "in.tar", tmp_path / "out", workers=1)
    assert error.value.url.endswith("in.tar")
    assert error.value.offset == 2 * BLOCK


def test_nested_keys_pack_and_extract_inside_the_folder(tmp_path):
    keys = ["a/b/c", "./d/e", "f/g..h/i", "j"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"__key__": k, "txt": k}) + "\n" for k in keys))
    pack(tmp_path / "in.jsonl", tmp_path / "out", workers=1)
    assert [s["__key__"] for s in read_shards(tmp_path / "out")] == keys
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as archive:
        archive.extractall(tmp_path / "x", filter="data")  # the data filter refuses any name leaving x
    assert (tmp_path / "x" / "f" / "g..h" / "i.txt").read_text() == "f/g..h/i"


# --- compressed files named .tar ----------------------------------------------------------

COMPRESSED = {
    "gzip": gzip.compress,
    "bzip2": bz2.compress,
    "xz": lzma.compress,
    "zstd": lambda data: b"\x28\xb5\x2f\xfd" + zlib.compress(data),  # the magic is what is checked
}
PLAIN = tar(member(b"k1.txt", b"one"), member(b"k2.txt", b"two"))


@pytest.mark.parametrize("kind", sorted(COMPRESSED))
def test_index_names_a_compressed_tar(tmp_path, kind):
    with pytest.raises(FormatError, match=f"this is {kind} data, not an uncompressed tar") as error:
        FMT.build_index(io.BytesIO(COMPRESSED[kind](PLAIN)), name="c.tar")
    assert error.value.offset == 0
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "shard-0.tar").write_bytes(COMPRESSED[kind](PLAIN))
    with pytest.raises(ShardstreamError, match=f"{kind} data"):
        index_dataset(str(tmp_path / "ds"))


@pytest.mark.parametrize("kind", sorted(COMPRESSED))
def test_repack_names_a_compressed_tar_named_tar(tmp_path, kind):
    (tmp_path / "in.tar").write_bytes(COMPRESSED[kind](PLAIN))
    with pytest.raises(PackError, match=f"this is {kind} data") as error:
        pack(tmp_path / "in.tar", tmp_path / "out", workers=1)
    assert error.value.url.endswith("in.tar")


def test_decode_names_a_shard_that_became_compressed():
    index, _ = FMT.build_index(io.BytesIO(PLAIN), name="s.tar")
    data = gzip.compress(PLAIN).ljust(len(PLAIN), b"\0")
    with pytest.raises(FormatError, match="gzip data"):
        list(FMT.decode(data, ByteRange(0, len(data)), index, 0, 2, name="s.tar"))


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [
        (".tar.gz", gzip.compress),
        (".tgz", gzip.compress),
        (".tar.bz2", bz2.compress),
        (".tar.xz", lzma.compress),
    ],
)
def test_compressed_tars_named_so_are_repacked(tmp_path, suffix, compress):
    (tmp_path / f"in{suffix}").write_bytes(compress(PLAIN))
    pack(tmp_path / f"in{suffix}", tmp_path / "out", workers=1)
    assert read_shards(tmp_path / "out") == [
        {"__key__": "k1", "txt": b"one"},
        {"__key__": "k2", "txt": b"two"},
    ]


# --- long names in errors ------------------------------------------------------------------


def test_a_600_kb_member_name_is_cut_in_errors(tmp_path):
    name = b"n" * 600_000  # no extension: pack refuses it, naming it
    (tmp_path / "long.tar").write_bytes(tar(gnu_long_name(name), header(name[:100], 1) + padded(b"x")))
    with pytest.raises(PackError, match="no extension") as error:
        pack(tmp_path / "long.tar", tmp_path / "out", workers=1)
    assert len(str(error.value)) < 1000
    assert "... (600000 characters)" in str(error.value)

    twice = gnu_long_name(b"k" * 600_000 + b".txt") + header(b"k", 1) + padded(b"x")
    with pytest.raises(FormatError, match="twice") as error:
        FMT.build_index(io.BytesIO(tar(twice, twice)), name="long.tar")
    assert len(str(error.value)) < 1000

    with ShardWriter(tmp_path / "ds") as writer:
        writer.write({"__key__": "fine", "txt": "a"})
        with pytest.raises(PackError, match=r"'\.'") as error:
            writer.write({"__key__": "k" * 600_000 + ".x", "txt": "a"})
    assert len(str(error.value)) < 1000


def test_any_long_message_keeps_its_head_and_tail():
    error = PackError("head " + "n" * 1_000_000 + " tail", url="u")
    assert len(str(error)) < 5000
    assert error.message.startswith("head ")
    assert error.message.endswith(" tail")
    assert "characters cut" in error.message


# --- archives that cost memory or CPU out of proportion (item 11) --------------------------

_CHILD = r"""
import json, resource, sys
limit = 3 << 29
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from shardstream.errors import ShardstreamError
from shardstream.pack import pack
try:
    out = {"samples": pack(sys.argv[1], sys.argv[2], workers=1).num_samples}
except ShardstreamError as error:
    out = {"error": type(error).__name__, "message": error.message, "offset": error.offset}
print(json.dumps(out))
"""


def pack_bounded(source, dest) -> dict:
    """``pack`` in a child limited to 1.5 GiB of address space and 120 s."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(source), str(dest)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


EIGHT_GIB = (8 << 30) - 1  # the most 11 octal digits hold


def gnu_sparse() -> bytes:
    """5 KB: a GNU sparse member ('S') of 4 KiB of data at the end of 8 GiB of holes."""
    fields = {386: b"%011o\0" % (EIGHT_GIB + 1 - 4096) + b"%011o\0" % 4096, 483: b"%011o\0" % EIGHT_GIB}
    return tar(header(b"big.bin", 4096, b"S", fields) + b"A" * 4096)


def pax_sparse() -> bytes:
    """A PAX (GNU 1.0) sparse member: its data is a map of holes, then 4 KiB."""
    records = b"".join(
        pax_record(k, v)
        for k, v in [
            (b"GNU.sparse.major", b"1"),
            (b"GNU.sparse.minor", b"0"),
            (b"GNU.sparse.name", b"big.bin"),
            (b"GNU.sparse.realsize", b"%d" % (8 << 30)),
        ]
    )
    body = padded(b"1\n%d\n4096\n" % ((8 << 30) - 4096)) + b"A" * 4096
    return tar(pax(records) + member(b"GNUSparseFile.0/big.bin", body))


def global_pax(members: int = 2000) -> bytes:
    """~3 MB: a global PAX header of 30k records, then many small members."""
    records = b"".join(pax_record(b"comment.%d" % i, b"v" * 8) for i in range(30_000))
    return tar(pax(records, b"g"), *(member(b"s%05d.txt" % i, b"x") for i in range(members)))


def pax_digits() -> bytes:
    """A 100 KB PAX header of digits (CVE-2024-6232: quadratic in Python's tarfile)."""
    return tar(pax(b"1" * 100_000), member(b"k.txt", b"x"))


@pytest.mark.parametrize(("build", "message"), [(gnu_sparse, "sparse"), (pax_sparse, "sparse")])
def test_sparse_members_are_refused(tmp_path, build, message):
    (tmp_path / "in.tar").write_bytes(build())
    assert len(build()) < 10_000
    with pytest.raises(FormatError, match=message):  # index skipped them, losing the member
        FMT.build_index(io.BytesIO(build()), name="in.tar")
    out = pack_bounded(tmp_path / "in.tar", tmp_path / "out")
    assert out["error"] == "PackError", out
    assert message in out["message"]
    assert out["offset"] == 0


def test_a_global_pax_header_costs_no_memory_per_member(tmp_path):
    (tmp_path / "in.tar").write_bytes(global_pax())
    assert pack_bounded(tmp_path / "in.tar", tmp_path / "out") == {"samples": 2000}


def test_a_pax_header_of_digits_is_refused_in_linear_time(tmp_path):
    (tmp_path / "in.tar").write_bytes(pax_digits())
    out = pack_bounded(tmp_path / "in.tar", tmp_path / "out")
    assert out["error"] == "PackError", out
    assert "malformed PAX" in out["message"]
    assert out["offset"] == BLOCK


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            tar(header(b"k.txt", 8 << 30) + b"x" * BLOCK),
            "past the end|needs 8589934592 bytes",
        ),  # a size field claiming 8 GiB
        (tar(pax(pax_record(b"size", b"9" * 5000)), member(b"k.txt", b"x")), "not a number"),
        (tar(header(b"././@PaxHeader", 2 << 20, b"x")), "implausible"),
    ],
)
def test_impossible_sizes_are_refused_before_any_allocation(data, message):
    with pytest.raises(FormatError, match=message):
        FMT.build_index(io.BytesIO(data), name="h.tar")
    with pytest.raises(FormatError, match=message):
        list(tar_members(io.BytesIO(data), "h.tar"))


def test_repack_from_s3_reads_with_the_bounded_scanner(s3, tmp_path):
    base, options = s3
    fs = fsspec.filesystem("s3", **options)
    fs.pipe(f"{base}/in/a.tar", PLAIN)
    fs.pipe(f"{base}/in/b.tar", gnu_sparse())
    pack(f"{base}/in/a.tar", tmp_path / "out", workers=1, storage_options=options)
    assert [s["__key__"] for s in read_shards(tmp_path / "out")] == ["k1", "k2"]
    with pytest.raises(PackError, match="sparse") as error:
        pack(f"{base}/in/b.tar", tmp_path / "out2", workers=1, storage_options=options)
    assert error.value.url.endswith("b.tar")


@pytest.mark.parametrize("key", ["BZhello", "PK\x03\x04zip", '\x04"M\x18lz4'])
def test_a_shard_whose_first_key_starts_like_compressed_data_streams(tmp_path, key):
    # the first bytes of a tar are its first member's name: a valid header is not compressed data
    with ShardWriter(tmp_path / "ds", format="tar") as writer:
        writer.write({"__key__": key, "txt": "first"})
        writer.write({"__key__": "b", "txt": "second"})
    assert [(s["__key__"], s["txt"]) for s in read_shards(tmp_path / "ds")] == [
        (key, b"first"),
        ("b", b"second"),
    ]


def test_a_gzipped_member_claiming_8_gib_is_refused_on_its_header(tmp_path):
    """A .tar.gz is read as a stream: the size check must come before the member's data is read."""
    data = tar(header(b"k.txt", 8 << 30) + bytes(4 << 20))  # 4 MiB of its 8 GiB: it needs none
    (tmp_path / "in.tar.gz").write_bytes(gzip.compress(data))
    with pytest.raises(PackError, match=r"member 'k\.txt' of 8589934592 bytes: .*not supported") as error:
        pack(tmp_path / "in.tar.gz", tmp_path / "out", workers=1)
    assert error.value.offset == 0
    with pytest.raises(FormatError, match="not supported"):
        list(tar_members(io.BytesIO(data), "h.tar", sized=False, max_size=1 << 20))
