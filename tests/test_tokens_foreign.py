"""``shardstream index`` on token corpora other tools wrote, streamed in place:
Megatron-LM indexed datasets (``X.bin`` + ``X.idx``, the public MMIDIDX layout) and
datatrove tokenized files (``X.ds`` + ``X.ds.index``). Both are written here from their
layouts (no megatron or datatrove package), indexed locally and on S3, and every document
read back exactly."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from shardstream.catalog import index_dataset, inspect_dataset, verify_dataset
from shardstream.cli import main
from shardstream.errors import FormatError, ShardstreamError
from shardstream.formats.tokens import TokensIndex
from shardstream.formats.tokens.foreign import datatrove_ends, megatron_ends
from shardstream.storage import Storage
from tests.tokens_helpers import read_documents

_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}


def megatron(docs: list[np.ndarray], dtype: str) -> tuple[bytes, bytes]:
    """``(.bin, .idx)`` of ``docs`` as Megatron-LM's MMIDIDXIndexWriter lays them out."""
    arrays = [np.asarray(d, dtype=np.dtype(dtype).newbyteorder("<")) for d in docs]
    sizes = np.array([len(a) for a in arrays], dtype="<i4")
    pointers = np.concatenate(([0], np.cumsum(sizes[:-1], dtype=np.int64))) * np.dtype(dtype).itemsize
    document_indices = np.arange(len(docs) + 1, dtype="<i8")
    head = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", _CODES[dtype])
    head += struct.pack("<Q", len(docs)) + struct.pack("<Q", len(document_indices))
    index = head + sizes.tobytes() + pointers.astype("<i8").tobytes() + document_indices.tobytes()
    return b"".join(a.tobytes() for a in arrays), index


def datatrove(docs: list[np.ndarray], token_size: int) -> tuple[bytes, bytes]:
    """``(.ds, .ds.index)`` of ``docs`` as datatrove's TokenizedFile writes them."""
    code = "I" if token_size == 4 else "H"
    data = b"".join(struct.pack(f"<{len(d)}{code}", *map(int, d)) for d in docs)
    ends = np.cumsum([len(d) for d in docs]).tolist()
    return data, struct.pack(f"<{len(ends)}Q", *ends)


def _docs(seed: int, count: int, top: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, top, int(n)) for n in rng.integers(0, 60, count)]


def _write(storage: Storage, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        storage.write(name, data)


def _corpus(kind: str) -> tuple[dict[str, bytes], list[tuple[str, np.ndarray]], str]:
    """Files of two shards of ``kind``, the documents they hold (key, tokens), their type."""
    files: dict[str, bytes] = {}
    expected = []
    for shard in range(2):
        docs = _docs(shard, 40 + shard, 50_000)
        if kind == "megatron":
            name, dtype = f"sub/corpus_{shard}_text_document.bin", "uint16"
            files[name], files[name[:-4] + ".idx"] = megatron(docs, dtype)
        elif kind == "megatron32":
            name, dtype = f"part{shard}.bin", "int32"
            files[name], files[name[:-4] + ".idx"] = megatron(docs, dtype)
        else:
            name, dtype = f"{shard:05d}_unshuffled.ds", "uint32" if kind == "datatrove32" else "uint16"
            files[name], files[name + ".index"] = datatrove(docs, 4 if dtype == "uint32" else 2)
            files[name + ".metadata"] = b"Unknown Tokenizer|2\n0\n0"
        expected += [(f"{name}:{i}", d) for i, d in enumerate(docs)]
    return files, expected, dtype


@pytest.mark.parametrize("kind", ["megatron", "megatron32", "datatrove", "datatrove32"])
def test_index_and_read_every_document_locally(tmp_path, kind):
    files, expected, dtype = _corpus(kind)
    storage = Storage(str(tmp_path / "c"))
    _write(storage, files)
    storage.close()
    manifest = index_dataset(str(tmp_path / "c"))
    assert manifest.format == "tokens"
    assert manifest.tokens.dtype == dtype
    assert manifest.tokens.tokenizer is None
    assert manifest.num_samples == len(expected)
    assert manifest.num_tokens == sum(len(d) for _, d in expected)
    assert all(s.path in files for s in manifest.shards)  # in place: no shard was rewritten
    got = read_documents(str(tmp_path / "c"))
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, expected, strict=True))
    report = verify_dataset(str(tmp_path / "c"))
    assert report.ok, report.problems
    assert inspect_dataset(str(tmp_path / "c")).num_samples == len(expected)
    assert main(["verify", str(tmp_path / "c"), "-q"]) == 0


@pytest.mark.parametrize("kind", ["megatron", "datatrove"])
def test_index_and_read_on_s3(s3, kind):
    base, options = s3
    files, expected, _ = _corpus(kind)
    storage = Storage(f"{base}/corpus", options)
    _write(storage, files)
    storage.close()
    manifest = index_dataset(f"{base}/corpus", storage_options=options)
    assert manifest.num_samples == len(expected)
    got = read_documents(f"{base}/corpus", options)
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, expected, strict=True))
    assert verify_dataset(f"{base}/corpus", storage_options=options).ok


def test_a_changed_token_file_fails_verify(tmp_path):
    files, _, _ = _corpus("datatrove")
    storage = Storage(str(tmp_path / "c"))
    _write(storage, files)
    manifest = index_dataset(str(tmp_path / "c"))
    name = manifest.shards[0].path
    data = bytearray(files[name])
    data[10] ^= 1
    storage.write(name, bytes(data))
    storage.close()
    assert verify_dataset(str(tmp_path / "c")).bad_shards == [name]


def test_megatron_indexes_that_cannot_stream_are_refused():
    docs = _docs(0, 5, 1000)
    _data, index = megatron(docs, "uint16")
    dtype, ends = megatron_ends(index, name="x.bin")
    assert dtype == "uint16"
    assert ends.tolist() == np.cumsum([len(d) for d in docs]).tolist()
    with pytest.raises(FormatError, match="MMIDIDX"):
        megatron_ends(b"NOTMAGIC!" + index[9:], name="x.bin")
    with pytest.raises(FormatError, match="version 2"):
        megatron_ends(index[:9] + struct.pack("<Q", 2) + index[17:], name="x.bin")
    with pytest.raises(FormatError, match="not an integer type"):
        megatron_ends(index[:17] + b"\x07" + index[18:], name="x.bin")
    with pytest.raises(FormatError, match="need"):
        megatron_ends(index[:-1], name="x.bin")
    at = 9 + 8 + 1 + 8 + 8 + 4 * len(docs) + 8  # the second sequence's pointer
    moved = index[:at] + struct.pack("<q", 10**6) + index[at + 8 :]
    with pytest.raises(FormatError, match="back-to-back"):
        megatron_ends(moved, name="x.bin")


def test_datatrove_indexes_that_do_not_match_their_file_are_refused():
    data, index = datatrove(_docs(0, 5, 1000), 2)
    assert datatrove_ends(index, len(data), name="x.ds")[0] == "uint16"
    with pytest.raises(FormatError, match="neither 2 nor 4"):
        datatrove_ends(index, len(data) + 2, name="x.ds")
    with pytest.raises(FormatError, match="8-byte"):
        datatrove_ends(index[:-1], len(data), name="x.ds")
    with pytest.raises(FormatError, match="not increasing"):
        datatrove_ends(struct.pack("<2Q", 5, 3), 10, name="x.ds")


def test_a_token_file_shorter_than_its_index_is_refused(tmp_path):
    data, index = megatron(_docs(1, 6, 1000), "uint16")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.bin").write_bytes(data[:-2])
    (tmp_path / "c" / "a.idx").write_bytes(index)
    with pytest.raises(ShardstreamError, match="end at byte"):
        index_dataset(str(tmp_path / "c"))


def test_a_stray_bin_file_beside_tars_is_not_a_token_shard(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "weights.bin").write_bytes(b"\0" * 100)  # no .idx beside it
    files, _, _ = _corpus("megatron")
    for name, data in files.items():
        path = tmp_path / "c" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    manifest = index_dataset(str(tmp_path / "c"))
    assert "weights.bin" not in [s.path for s in manifest.shards]
    named = TokensIndex(name="sub/a.bin", dtype="uint16", ends=np.array([1, 3]))
    assert named.keys == ["sub/a.bin:0", "sub/a.bin:1"]
