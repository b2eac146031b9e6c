"""Typed Parquet columns (NOTE [ Typed columns ]): fields given as bytes are stored by
extension, text as strings, integers as int64, JSON as its text, the rest as binary with
the extension in the field's metadata; other readers see text and integers, shardstream
decodes the same samples as from tar and gives the same bytes with ``decode=False``; a
value its column cannot hold is refused, naming the sample; Parquet shards with binary
columns (packed before, or by another tool) keep streaming."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardstream
from shardstream.catalog import index_dataset
from shardstream.errors import PackError
from shardstream.formats.parquet.typed import EXTENSION_KEY
from shardstream.pack import ShardWriter, pack

SAMPLES = 9


def npy(i: int) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(i, dtype=np.int32))
    return buffer.getvalue()


def make_corpus(folder) -> None:
    folder.mkdir()
    for i in range(SAMPLES):
        (folder / f"s{i}.txt").write_text(f"text {i} \u00e9\n")
        (folder / f"s{i}.cls").write_text(f"{i * 7 - 20}\n")
        (folder / f"s{i}.json").write_text(json.dumps({"i": i, "tags": ["a"] * i}))
        (folder / f"s{i}.npy").write_bytes(npy(i))


@pytest.fixture
def packed(tmp_path):
    make_corpus(tmp_path / "corpus")
    for format in ("tar", "parquet"):
        pack(str(tmp_path / "corpus"), str(tmp_path / format), format=format, samples_per_shard=4, workers=1)
    return tmp_path


def streamed(url: str, **kwargs) -> list[dict]:
    return list(shardstream.StreamingDataset(url, shuffle=False, **kwargs))


def comparable(samples: list[dict]) -> list[dict]:
    return [{k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in s.items()} for s in samples]


def test_fields_are_stored_by_extension_with_it_in_the_metadata(packed):
    schema = pq.read_schema(packed / "parquet" / "shard-000000.parquet")
    assert {name: str(schema.field(name).type) for name in schema.names} == {
        "__key__": "string",
        "txt": "string",
        "cls": "int64",
        "json": "string",
        "npy": "binary",
    }
    for name in ("txt", "cls", "json", "npy"):
        assert schema.field(name).metadata == {EXTENSION_KEY: name.encode()}
    assert shardstream.StreamingDataset(str(packed / "parquet")).manifest.schema["cls"] == "int64"


def test_other_readers_see_text_and_integers(packed):
    import datasets
    import duckdb

    table = pq.read_table(packed / "parquet" / "shard-000000.parquet")
    assert table.column("txt").to_pylist()[:2] == ["text 0 \u00e9\n", "text 1 \u00e9\n"]
    assert table.column("cls").to_pylist()[:2] == [-20, -13]
    rows = duckdb.sql(
        f"SELECT cls, json_extract(json, '$.i')::INT, txt FROM read_parquet('{packed}/parquet/*.parquet') ORDER BY cls"
    ).fetchall()
    assert rows == [(i * 7 - 20, i, f"text {i} \u00e9\n") for i in range(SAMPLES)]
    datasets.disable_progress_bars()
    loaded = datasets.load_dataset(str(packed / "parquet"), split="train", cache_dir=str(packed / "hf"))
    assert (loaded.features["txt"].dtype, loaded.features["cls"].dtype) == ("string", "int64")
    assert loaded[3]["cls"] == 1


def test_shardstream_decodes_the_same_samples_as_from_tar(packed):
    tar, parquet = str(packed / "tar"), str(packed / "parquet")
    assert comparable(streamed(parquet)) == comparable(streamed(tar))
    assert comparable([shardstream.MapDataset(parquet)[i] for i in range(SAMPLES)]) == comparable(
        streamed(tar)
    )
    upper = {"txt": lambda data: bytes(data).upper()}  # a user's decoder gets the same bytes
    assert [s["txt"] for s in streamed(parquet, decoders=upper)] == [
        s["txt"] for s in streamed(tar, decoders=upper)
    ]


def test_decode_false_gives_the_bytes_as_tar_does(packed):
    raw_tar, raw_parquet = (
        streamed(str(packed / "tar"), decode=False),
        streamed(str(packed / "parquet"), decode=False),
    )
    for a, b in zip(raw_tar, raw_parquet, strict=True):
        assert {k: type(v) for k, v in b.items()} == {
            "__key__": str,
            **dict.fromkeys(("txt", "cls", "json", "npy"), bytes),
        }
        assert (a["txt"], a["json"], a["npy"]) == (b["txt"], b["json"], b["npy"])
        assert a["cls"] == b["cls"] + b"\n"  # an integer's digits, without its file's newline


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("cls", b"n/a\n", "not an integer"),
        ("cls", b"9" * 20, "not an integer"),
        ("seg.txt", b"\xff\xfe", "not UTF-8 text"),
        ("json", b"\xff", "not UTF-8 text"),
    ],
)
def test_a_value_its_column_cannot_hold_is_refused_naming_the_sample(tmp_path, field, value, why):
    make_corpus(tmp_path / "corpus")
    (tmp_path / "corpus" / f"s5.{field}").write_bytes(value)
    if field == "seg.txt":
        for i in range(SAMPLES):
            if i != 5:
                (tmp_path / "corpus" / f"s{i}.seg.txt").write_text("fine")
    with pytest.raises(PackError, match=f"sample 's5': field '{field}' is .*{why}") as refused:
        pack(str(tmp_path / "corpus"), str(tmp_path / "ds"), format="parquet", workers=1)
    assert str(refused.value.url).startswith(str(tmp_path / "corpus" / "s5."))
    assert not (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()
    pack(str(tmp_path / "corpus"), str(tmp_path / "tar"), workers=1)  # tar stores any bytes


def test_parquet_shards_with_binary_columns_keep_streaming(tmp_path):
    dest = tmp_path / "ds"
    dest.mkdir()
    keys = [f"k{i}" for i in range(5)]
    table = pa.table(
        {
            "__key__": keys,
            "txt": pa.array([f"text {i}".encode() for i in range(5)], pa.binary()),
            "cls": pa.array([b"%d\n" % i for i in range(5)], pa.binary()),
            "json": pa.array([b'{"i": %d}' % i for i in range(5)], pa.binary()),
        }
    )
    pq.write_table(table, dest / "shard-000000.parquet")  # as shardstream wrote them before
    index_dataset(str(dest))
    assert [(s["txt"], s["cls"], s["json"]) for s in streamed(str(dest))] == [
        (f"text {i}", i, {"i": i}) for i in range(5)
    ]
    assert [s["cls"] for s in streamed(str(dest), decode=False)] == [b"%d\n" % i for i in range(5)]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=30),
            st.integers(-(2**63), 2**63 - 1),
            st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_typed_columns_decode_as_tar_for_any_values(tmp_path_factory, values):
    root = tmp_path_factory.mktemp("typed")
    for format in ("tar", "parquet"):
        with ShardWriter(str(root / format), format=format, samples_per_shard=7) as writer:
            for i, (text, number, doc) in enumerate(values):
                writer.write(
                    {
                        "__key__": f"k{i:03d}",
                        "txt": text.encode(),
                        "cls": b"%d" % number,
                        "json": json.dumps(doc).encode(),
                    }
                )
    assert streamed(str(root / "parquet")) == streamed(str(root / "tar"))
    assert streamed(str(root / "parquet"), decode=False) == streamed(str(root / "tar"), decode=False)


def test_row_groups_of_typed_columns_are_read_alone_and_checked(tmp_path):
    count = 2500  # three row groups (ROW_GROUP_MAX_ROWS) in one shard
    for format in ("tar", "parquet"):
        with ShardWriter(str(tmp_path / format), format=format, samples_per_shard=count) as writer:
            for i in range(count):
                writer.write(
                    {"__key__": f"k{i:05d}", "txt": b"t%d" % i, "cls": b"%d\n" % (i % 5), "json": b"[%d]" % i}
                )
    indices = [2499, 0, 1024, 1023, 2048, 17]
    tar, parquet = (
        shardstream.MapDataset(str(tmp_path / "tar")),
        shardstream.MapDataset(str(tmp_path / "parquet")),
    )
    assert (
        parquet.get_many(indices)
        == tar.get_many(indices)
        == [{"__key__": f"k{i:05d}", "txt": f"t{i}", "cls": i % 5, "json": [i]} for i in indices]
    )
    window = streamed(str(tmp_path / "parquet"), decode=False)[1020:1030]
    assert [(s["txt"], s["cls"]) for s in window] == [
        (b"t%d" % i, b"%d" % (i % 5)) for i in range(1020, 1030)
    ]


@pytest.mark.parametrize("count", [10, 600])  # turned back into bytes in Python, and by Arrow casts
def test_a_field_a_sample_lacks_reads_back_as_none(tmp_path, count):
    with ShardWriter(str(tmp_path / "ds"), format="parquet", samples_per_shard=count) as writer:
        for i in range(count):
            sample = {"__key__": f"k{i:04d}"}
            if i % 3 != 1:
                sample["txt"] = b"t%d" % i
            if i % 3 != 2:
                sample["cls"] = b"%d" % i
            writer.write(sample)
    raw = streamed(str(tmp_path / "ds"), decode=False)
    assert [(s["txt"], s["cls"]) for s in raw] == [
        (None if i % 3 == 1 else b"t%d" % i, None if i % 3 == 2 else b"%d" % i) for i in range(count)
    ]
