"""The "tokens" shard format: flat arrays of token ids, a sample per document, document
ends in the sidecar; its manifest record; pack (of documents already tokenized), verify,
inspect and index of such datasets."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.catalog import index_dataset, inspect_dataset, verify_dataset
from shardstream.cli import main
from shardstream.errors import FormatError, ManifestError, PackError, UsageError
from shardstream.formats import available_formats, get_format
from shardstream.formats.tokens import (
    TokensIndex,
    doc_ends,
    read_tokens,
    token_dtype_for,
    tokens_from_bytes,
)
from shardstream.manifest import MANIFEST_NAME, Manifest, ShardInfo, TokensInfo
from shardstream.pack import pack
from shardstream.types import ByteRange
from tests.tokens_helpers import read_documents

FMT = get_format("tokens")


def _encode(docs, dtype="uint16", keys=None):
    buffer = io.BytesIO()
    encoder = FMT.encoder(buffer, name="s.tokens")
    for i, doc in enumerate(docs):
        encoder.write({"__key__": keys[i] if keys else f"{i:09d}", "tokens": np.asarray(doc, dtype=dtype)})
    return buffer.getvalue(), encoder.close()


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), max_size=40),
    dtype=st.sampled_from(["uint16", "uint32"]),
    data=st.data(),
)
def test_every_document_round_trips(lengths, dtype, data):
    rng = np.random.default_rng(len(lengths))
    top = 65535 if dtype == "uint16" else 2**32 - 1
    docs = [rng.integers(0, top, n, endpoint=True).astype(dtype) for n in lengths]
    shard, index = _encode(docs, dtype)
    assert len(shard) == sum(lengths) * np.dtype(dtype).itemsize
    index = FMT.load_index(index.to_bytes(), name="s.tokens")
    assert index.token_dtype == (dtype if lengths else "uint16")  # an empty shard's type is the default
    assert index.num_tokens == sum(lengths)
    assert np.array_equal(doc_ends(index), np.cumsum(lengths, dtype=np.int64))
    n = len(docs)
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    rng_ = index.byte_range(start, stop)
    part = shard[rng_.start : rng_.end]
    got = list(FMT.decode(part, rng_, index, start, stop, name="s"))
    assert [g["__key__"] for g in got] == [f"{i:09d}" for i in range(start, stop)]
    for g, want in zip(got, docs[start:stop], strict=True):
        assert g["tokens"].dtype == np.dtype(dtype)
        assert np.array_equal(g["tokens"], want)
    flat = read_tokens(part, rng_, index, start, stop, name="s")
    assert np.array_equal(flat, np.concatenate([np.zeros(0, dtype), *docs[start:stop]]))
    starts = np.array(data.draw(st.lists(st.integers(0, n), max_size=4)), dtype=np.int64)
    stops = np.array([data.draw(st.integers(int(a), n)) for a in starts], dtype=np.int64)
    whole = ByteRange(0, len(shard))
    runs = FMT.decode_runs(memoryview(shard), whole, index, starts, stops, name="s")
    want = [i for a, b in zip(starts.tolist(), stops.tolist(), strict=True) for i in range(a, b)]
    samples = runs if isinstance(runs, list) else runs.samples()
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in want]
    assert all(np.array_equal(s["tokens"], docs[i]) for s, i in zip(samples, want, strict=True))


def test_sidecar_keys_numbered_named_and_table():
    _, numbered = _encode([[1], [2, 3]], keys=["000000041", "000000042"])
    _, table = _encode([[1], [2, 3]], keys=["a", "b/c"])
    assert len(numbered.to_bytes()) < len(table.to_bytes())
    named = TokensIndex(name="x/y.bin", dtype="int32", ends=np.array([2, 5]))
    for index in (numbered, table, named):
        again = FMT.load_index(index.to_bytes(), name=index.name)
        assert again == index
        assert again.keys == index.keys
        assert pickle.loads(pickle.dumps(index)) == index
    assert named.keys == ["x/y.bin:0", "x/y.bin:1"]
    assert table.keys == ["a", "b/c"]


def test_corrupt_sidecars_and_bad_documents_are_refused():
    shard, index = _encode([[1, 2], [3]])
    blob = bytearray(index.to_bytes())
    blob[-3] ^= 0xFF
    with pytest.raises(FormatError, match="checksum"):
        FMT.load_index(bytes(blob), name="s.tokens")
    with pytest.raises(FormatError, match="decreasing"):
        TokensIndex(name="s", dtype="uint16", ends=np.array([3, 2]))
    with pytest.raises(FormatError, match="token type"):
        TokensIndex(name="s", dtype="float32", ends=np.array([3]))
    with pytest.raises(FormatError, match="need bytes"):
        list(FMT.decode(shard[:2], ByteRange(0, 2), index, 0, 2, name="s.tokens"))
    encoder = FMT.encoder(io.BytesIO(), name="s.tokens")
    encoder.write({"__key__": "a", "tokens": np.array([1, 2], np.uint16)})
    with pytest.raises(PackError, match="does not fit"):
        encoder.write({"__key__": "b", "tokens": [70000]})
    with pytest.raises(PackError, match="no 'tokens'"):
        encoder.write({"__key__": "c", "text": "hello"})
    with pytest.raises(PackError, match="flat sequence of ints"):
        encoder.write({"__key__": "d", "tokens": [1.5]})
    with pytest.raises(UsageError, match="not compressed"):
        FMT.encoder(io.BytesIO(), name="s", compression="zstd")
    with pytest.raises(FormatError, match="whole number"):
        tokens_from_bytes(b"abc", "uint16")


def test_token_dtype_for_a_vocabulary():
    assert token_dtype_for(50257) == "uint16"
    assert token_dtype_for(65536) == "uint16"
    assert token_dtype_for(65537) == "uint32"
    assert token_dtype_for(200_000) == "uint32"


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 1000, int(n)).tolist() for n in rng.integers(0, 30, 50)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"tokens": d}) + "\n" for d in docs))
    return path, docs


def test_pack_verify_inspect_and_index(tmp_path, corpus):
    path, docs = corpus
    dest = tmp_path / "ds"
    manifest = pack(path, dest, format="tokens", samples_per_shard=12, workers=1)
    assert manifest.format == "tokens"
    assert manifest.fields == ("tokens",)
    assert manifest.tokens == TokensInfo(dtype="uint32")
    assert [s.tokens for s in manifest.shards] == [
        sum(map(len, docs[i : i + 12])) for i in range(0, len(docs), 12)
    ]
    assert manifest.num_tokens == sum(map(len, docs))
    assert all(s.path.endswith(".tokens") and s.bytes == 4 * s.tokens for s in manifest.shards)
    got = read_documents(str(dest))
    assert [key for key, _ in got] == [f"{i:09d}" for i in range(len(docs))]
    assert all(np.array_equal(t, d) for (_, t), d in zip(got, docs, strict=True))
    report = verify_dataset(str(dest))
    assert report.ok, report.problems
    assert not report.unchecked
    summary = inspect_dataset(str(dest))
    assert summary.format == "tokens"
    assert summary.num_samples == len(docs)
    assert summary.tokens == {**manifest.tokens.to_dict(), "num_tokens": manifest.num_tokens}
    assert main(["inspect", str(dest)]) == 0
    assert main(["verify", str(dest)]) == 0
    # the sidecars hold the document ends: index rebuilds the manifest from them
    (dest / MANIFEST_NAME).unlink()
    again = index_dataset(str(dest))
    assert again.shards == manifest.shards
    assert again.tokens == manifest.tokens
    # a flipped token is found by verify
    shard = dest / manifest.shards[1].path
    data = bytearray(shard.read_bytes())
    data[5] ^= 1
    shard.write_bytes(bytes(data))
    assert verify_dataset(str(dest)).bad_shards == [manifest.shards[1].path]


def test_index_refuses_a_token_shard_without_its_sidecar(tmp_path, corpus):
    path, _ = corpus
    dest = tmp_path / "ds"
    manifest = pack(path, dest, format="tokens", samples_per_shard=25, workers=1)
    (dest / MANIFEST_NAME).unlink()
    (dest / manifest.shards[0].index).unlink()
    with pytest.raises(UsageError, match="cannot be read"):
        index_dataset(str(dest))


def _manifest(**tokens):
    shard = ShardInfo("shard-000000.tokens", 2, 10, "0" * 64, ".shardstream/shard-000000.tokens.idx", 5, 5)
    return Manifest(format="tokens", shards=(shard,), fields=("tokens",), tokens=TokensInfo(**tokens))


def test_manifest_tokens_record_round_trips_and_is_checked():
    manifest = _manifest(dtype="uint16", vocab_size=300, eos_id=0, bos_id=None, tokenizer="sha256:ab")
    text = manifest.to_json()
    assert Manifest.from_json(text) == manifest
    data = json.loads(text)
    assert data["num_tokens"] == 5
    assert data["shards"][0]["tokens"] == 5
    for broken, match in (
        ({**data, "num_tokens": 6}, "num_tokens=6"),
        ({**data, "tokens": {**data["tokens"], "dtype": "float16"}}, "token type"),
        ({**data, "tokens": {**data["tokens"], "vocab_size": -1}}, "vocab_size"),
        ({**data, "tokens": [1]}, "JSON object"),
    ):
        with pytest.raises(ManifestError, match=match):
            Manifest.from_json(json.dumps(broken))


def test_manifests_without_tokens_keep_their_bytes():
    shard = ShardInfo("shard-000000.tar", 2, 10, "0" * 64, ".shardstream/shard-000000.tar.idx", 5)
    manifest = Manifest(format="tar", shards=(shard,), fields=("txt",))
    text = manifest.to_json()
    assert "tokens" not in text
    assert Manifest.from_json(text).to_json() == text
    assert "tokens" in available_formats()


def test_shard_writer_writes_token_shards(tmp_path):
    from shardstream.pack import ShardWriter

    docs = [np.arange(i * 7, dtype=np.uint16) for i in range(9)]
    with ShardWriter(str(tmp_path / "ds"), format="tokens", samples_per_shard=4) as writer:
        for i, doc in enumerate(docs):
            writer.write({"__key__": f"doc-{i}", "tokens": doc})
    got = read_documents(str(tmp_path / "ds"))
    assert [k for k, _ in got] == [f"doc-{i}" for i in range(9)]
    assert all(np.array_equal(t, d) for (_, t), d in zip(got, docs, strict=True))
    manifest = Manifest.from_json((tmp_path / "ds" / MANIFEST_NAME).read_text())
    assert manifest.tokens == TokensInfo(dtype="uint16")
    assert manifest.num_tokens == sum(map(len, docs))
    assert verify_dataset(str(tmp_path / "ds")).ok
