"""The Parquet codec: plain pyarrow and DuckDB read our shards; we index and read theirs.

Also the schema rules of NOTE [ Parquet shard schema ], row-group sizing, compression,
determinism, and corrupt footers.
"""

from __future__ import annotations

import datetime
import io
import subprocess
import sys

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.errors import FormatError, PackError
from shardstream.formats import ParquetFormat
from shardstream.formats.parquet import ROW_GROUP_MAX_BYTES, ROW_GROUP_MAX_ROWS
from shardstream.types import ByteRange
from tests.test_formats import write_shard

FMT = ParquetFormat()


def rows(n: int, payload: int = 10) -> list[dict]:
    return [
        {
            "__key__": f"s{i:05d}",
            "image": bytes([i % 256]) * payload,
            "caption": f"caption {i}",
            "label": i % 10,
            "score": i / 4,
            "keep": i % 3 == 0,
            "tags": ["a", "b"][: i % 3],
            "meta": {"w": i, "src": "web"},
        }
        for i in range(n)
    ]


def decode_all(data: bytes, index) -> list[dict]:
    return list(FMT.decode(data, ByteRange(0, len(data)), index, 0, index.num_samples, name="p"))


def test_plain_pyarrow_reads_our_shard():
    samples = rows(1500)
    data, _ = write_shard(FMT, samples)
    table = pq.read_table(io.BytesIO(data))
    assert table.column_names == ["__key__", "image", "caption", "label", "score", "keep", "tags", "meta"]
    assert table.to_pylist() == samples


def test_duckdb_reads_our_shard(tmp_path):
    samples = rows(2100)
    data, _ = write_shard(FMT, samples)
    path = tmp_path / "shard.parquet"
    path.write_bytes(data)
    with duckdb.connect() as con:
        got = con.execute(
            "SELECT __key__, image, caption, label, score, keep, tags, meta.w FROM read_parquet(?) ORDER BY __key__",
            [str(path)],
        ).fetchall()
    assert got == [
        (s["__key__"], s["image"], s["caption"], s["label"], s["score"], s["keep"], s["tags"], s["meta"]["w"])
        for s in samples
    ]


_READER = """
import sys
sys.modules["shardstream"] = None  # any import of shardstream now fails: the readers must not need it
import duckdb, pyarrow.parquet as pq
table = pq.read_table(sys.argv[1])
with duckdb.connect() as con:
    count, total = con.execute("SELECT count(*), sum(label) FROM read_parquet(?)", [sys.argv[1]]).fetchone()
print(table.num_rows, table.column(0)[7], count, total)
"""


def test_read_without_shardstream_installed(tmp_path):
    samples = rows(40)
    data, _ = write_shard(FMT, samples)
    path = tmp_path / "shard.parquet"
    path.write_bytes(data)
    # -I: isolated mode, so neither the repository nor PYTHONPATH is on the path
    done = subprocess.run(
        [sys.executable, "-I", "-c", _READER, str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["40", "s00007", "40", str(sum(s["label"] for s in samples))]


def test_schema_types_and_index_metadata():
    samples = rows(5)
    samples[0]["when"] = datetime.datetime(2024, 1, 2, 3, 4, 5)
    samples[1]["mixed"] = 1
    samples[2]["mixed"] = 2.5
    samples[3]["empty"] = None
    data, index = write_shard(FMT, samples)
    assert index.key_column == "__key__"
    assert index.schema == {
        "__key__": "string",
        "image": "binary",
        "caption": "string",
        "label": "int64",
        "score": "double",
        "keep": "bool",
        "tags": "list<element: string>",  # pyarrow writes compliant nested type names
        "meta": "struct<w: int64, src: string>",
        "when": "timestamp[us]",
        "mixed": "double",
        "empty": "null",
    }
    assert index.fields == tuple(index.schema)[1:]
    got = decode_all(data, index)
    assert got[0]["when"] == datetime.datetime(2024, 1, 2, 3, 4, 5)
    assert [g["mixed"] for g in got] == [None, 1.0, 2.5, None, None]
    assert got[4] == {**samples[4], "when": None, "mixed": None, "empty": None}


def test_row_groups_are_bounded_by_rows_and_bytes():
    _, index = write_shard(FMT, rows(2500))
    assert [g.num_rows for g in map(index.metadata.row_group, range(index.num_row_groups))] == [
        ROW_GROUP_MAX_ROWS,
        ROW_GROUP_MAX_ROWS,
        2500 - 2 * ROW_GROUP_MAX_ROWS,
    ]
    big = 300_000
    _, index = write_shard(FMT, rows(10, payload=big))
    per_group = -(-ROW_GROUP_MAX_BYTES // big)
    assert [index.metadata.row_group(i).num_rows for i in range(index.num_row_groups)] == [per_group] * (
        10 // per_group
    ) + [10 % per_group]
    one = index.byte_range(5, 6)
    assert one.length < 2 * ROW_GROUP_MAX_BYTES  # one sample is read without the whole file


@pytest.mark.parametrize(
    ("compression", "codec"),
    [(None, "ZSTD"), ("snappy", "SNAPPY"), ("gzip", "GZIP"), ("none", "UNCOMPRESSED")],
)
def test_compression(compression, codec):
    samples = rows(50)
    buffer = io.BytesIO()
    encoder = FMT.encoder(buffer, name="c", compression=compression)
    for sample in samples:
        encoder.write(sample)
    index = encoder.close()
    assert index.metadata.row_group(0).column(1).compression == codec
    assert decode_all(buffer.getvalue(), index) == samples


def test_bytes_are_deterministic_and_carry_no_time():
    first, index = write_shard(FMT, rows(100))
    second, _ = write_shard(FMT, rows(100))
    assert first == second
    assert index.metadata.created_by.startswith("parquet-cpp-arrow version")
    assert set(index.metadata.metadata or {}) == {b"ARROW:schema"}


def flushed_encoder(buffer: io.BytesIO):
    """An encoder whose schema is fixed: its first row group is already written."""
    encoder = FMT.encoder(buffer, name="shard-p")
    for sample in rows(ROW_GROUP_MAX_ROWS):
        encoder.write(sample)
    assert buffer.tell() > 0
    return encoder


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra": 1}, "'extra'"),
        ({"image": "text, not bytes"}, "'image'"),
        ({"label": 1.5}, "'label'"),
        ({"label": True}, "'label'"),
        ({"tags": [1]}, "'tags'"),
        ({"meta": {"w": 1, "other": 2}}, "'meta'"),
        ({"caption": {"a": 1}}, "'caption'"),
    ],
)
def test_a_later_row_that_does_not_fit_is_rejected(change, message):
    buffer = io.BytesIO()
    encoder = flushed_encoder(buffer)
    bad = {**rows(1)[0], "__key__": "bad-row", **change}
    with pytest.raises(PackError, match=message) as error:
        encoder.write(bad)
    assert "'bad-row'" in str(error.value)
    assert error.value.shard == "shard-p"
    encoder.write({"__key__": "fits", "caption": "x", "label": None})  # missing columns are null
    index = encoder.close()
    got = decode_all(buffer.getvalue(), index)
    assert len(got) == ROW_GROUP_MAX_ROWS + 1
    assert got[-1]["__key__"] == "fits"
    assert got[-1]["image"] is None


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        ({"x": b"bytes"}, {"x": "str"}, "holds a string"),
        ({"x": 1}, {"x": True}, "holds a bool"),
        ({"x": [1]}, {"x": {"a": 1}}, "holds a struct"),
        ({"x": 1}, {"x": {1, 2}}, "cannot store"),
        ({"x": 1}, {3: 1}, "must be str"),
    ],
)
def test_conflicts_in_the_first_rows_are_rejected_at_write(first, second, message):
    encoder = FMT.encoder(io.BytesIO(), name="s")
    encoder.write({"__key__": "a", **first})
    with pytest.raises(PackError, match=message) as error:
        encoder.write({"__key__": "b", **second})
    assert "'b'" in str(error.value)
    assert encoder.num_samples == 1


def test_nested_conflict_in_the_first_rows_is_reported_at_flush():
    encoder = FMT.encoder(io.BytesIO(), name="s")
    encoder.write({"__key__": "a", "x": [1, 2]})
    encoder.write({"__key__": "b", "x": ["one"]})
    for _ in range(2):  # the rows stay buffered: closing again says the same, nothing half-written
        with pytest.raises(PackError, match="'x'"):
            encoder.close()


def test_keys_must_be_strings():
    encoder = FMT.encoder(io.BytesIO(), name="s")
    for sample in ({"x": 1}, {"__key__": 3, "x": 1}, ["not", "a", "dict"]):
        with pytest.raises(PackError):
            encoder.write(sample)  # type: ignore[arg-type]


# --- Parquet written by other tools -------------------------------------------------------


def foreign_table(n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int32()),
            "text": [f"row {i} " * (i % 7) for i in range(n)],
            "lang": [["en", "fr", "de"][i % 3] for i in range(n)],  # dictionary-encoded: dictionary pages
            "vec": [[float(i), float(-i)] for i in range(n)],
        }
    )


@pytest.mark.parametrize(
    "options",
    [
        {"row_group_size": 97, "compression": "snappy"},
        {"row_group_size": 250, "compression": "gzip", "data_page_version": "2.0", "use_dictionary": False},
        {"row_group_size": 1000, "version": "1.0", "write_statistics": False},
    ],
)
def test_index_and_read_parquet_written_by_others(options):
    table = foreign_table(1000)
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    data = buffer.getvalue()
    index, fields = FMT.build_index(io.BytesIO(data), name="part-00000.parquet")
    assert fields == ("id", "text", "lang", "vec")
    assert index.key_column is None
    assert index.num_samples == 1000
    assert index.keys[:2] == ["part-00000.parquet:0", "part-00000.parquet:1"]
    expected = [{"__key__": f"part-00000.parquet:{i}", **row} for i, row in enumerate(table.to_pylist())]
    for start, stop in [(0, 1), (0, 1000), (96, 98), (500, 777), (999, 1000)]:
        rng = index.byte_range(start, stop)
        got = list(FMT.decode(data[rng.start : rng.end], rng, index, start, stop, name="part-00000.parquet"))
        assert got == expected[start:stop]
    assert FMT.load_index(index.to_bytes(), name="part-00000.parquet") == index


def test_a_non_string_key_column_is_not_a_key():
    buffer = io.BytesIO()
    pq.write_table(pa.table({"__key__": [10, 11], "x": [1, 2]}), buffer)
    index, fields = FMT.build_index(io.BytesIO(buffer.getvalue()), name="k")
    assert index.key_column is None
    assert fields == ("x",)
    assert decode_all(buffer.getvalue(), index) == [{"__key__": "k:0", "x": 1}, {"__key__": "k:1", "x": 2}]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:-1], "PAR1"),
        (lambda d: b"", "not a Parquet file"),
        (lambda d: b"PAR1" + bytes(100) + b"PAR1", "corrupt Parquet footer"),
        (lambda d: d[:-8] + (2**31).to_bytes(4, "little") + b"PAR1", "footer length"),
        (lambda d: d[: -8 - 200] + b"\xff" * 200 + d[-8:], "footer"),
    ],
)
def test_corrupt_footer_is_a_format_error(mutate, message):
    data, _ = write_shard(FMT, rows(30))
    with pytest.raises(FormatError, match=message) as error:
        FMT.build_index(io.BytesIO(mutate(data)), name="bad.parquet")
    assert error.value.shard == "bad.parquet"


def test_wrong_bytes_for_the_index_is_a_format_error():
    data, index = write_shard(FMT, rows(30))
    with pytest.raises(FormatError) as error:
        list(FMT.decode(bytes(len(data)), ByteRange(0, len(data)), index, 0, 30, name="z.parquet"))
    assert error.value.shard == "z.parquet"
