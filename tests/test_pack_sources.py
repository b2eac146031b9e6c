"""Pack sources: each kind of input, its keys and fields, and its errors (file and line named)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds

from shardstream.errors import PackError, UsageError
from shardstream.formats import get_format
from shardstream.pack import Entry, Source, available_sources, open_source, pack, register_source
from tests.test_pack import read_shards


def test_folder_groups_files_by_key_recursively(tmp_path):
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "img001.jpg").write_bytes(b"JPG1")
    (src / "a" / "b" / "img001.seg.png").write_bytes(b"PNG1")
    (src / "a" / "b" / "img002.jpg").write_bytes(b"JPG2")
    (src / "top.txt").write_bytes(b"hello")
    (src / ".hidden.txt").write_bytes(b"skipped")
    (src / ".git").mkdir()
    (src / ".git" / "x.txt").write_bytes(b"skipped")

    (src / "a" / "b" / ("long" * 30 + ".txt")).write_bytes(b"a name that needs a PAX header" * 40)
    source = open_source(src)
    assert source.name == "folder"
    # walk order: a folder's files, then its subfolders
    assert [e.key for e in source.scan()] == ["top", "a/b/img001", "a/b/img002", "a/b/" + "long" * 30]
    assert source.count() == source.estimate() == 4
    for fmt in (get_format("tar"), get_format("parquet")):
        for entry in source.scan():  # planned from the listing = measured on the loaded sample
            assert source.size(entry, fmt) == fmt.sample_size(source.load(entry))
    (src / "a" / "b" / ("long" * 30 + ".txt")).unlink()

    pack(src, tmp_path / "out", workers=1)
    samples = read_shards(tmp_path / "out")
    assert samples == [
        {"__key__": "top", "txt": b"hello"},
        {"__key__": "a/b/img001", "jpg": b"JPG1", "seg.png": b"PNG1"},
        {"__key__": "a/b/img002", "jpg": b"JPG2"},
    ]


def test_folder_file_without_extension_is_named(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ok.txt").write_bytes(b"x")
    (tmp_path / "src" / "README").write_bytes(b"x")
    with pytest.raises(PackError, match="no extension") as info:
        pack(tmp_path / "src", tmp_path / "out", workers=1)
    assert info.value.url.endswith("README")


def test_folder_unreadable_file_is_named(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ok.txt").write_bytes(b"x")
    os.symlink(tmp_path / "gone.txt", tmp_path / "src" / "broken.txt")
    with pytest.raises(PackError, match="cannot read file") as info:
        pack(tmp_path / "src", tmp_path / "out", workers=1)
    assert info.value.url.endswith("broken.txt")
    assert not (tmp_path / "out" / ".shardstream" / "manifest.json").exists()


def test_jsonl_keys_values_and_blank_lines(tmp_path):
    lines = [
        {"__key__": "doc-a", "txt": "alpha", "cls": 3},
        {"txt": "beta", "score": 0.5, "ok": True, "meta": {"lang": "en", "tags": [1, 2]}, "none": None},
    ]
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps(lines[0]) + "\n\n" + json.dumps(lines[1]) + "\n")

    pack(path, tmp_path / "out", workers=1)
    samples = read_shards(tmp_path / "out")
    assert samples[0] == {"__key__": "doc-a", "txt": b"alpha", "cls": b"3"}
    # a sample without __key__ is named by its number; non-text values become JSON text
    assert samples[1] == {
        "__key__": "000000001",
        "txt": b"beta",
        "score": b"0.5",
        "ok": b"true",
        "meta": b'{"lang":"en","tags":[1,2]}',
    }


def test_jsonl_compressed(tmp_path):
    path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps({"txt": f"line {i}"}) + "\n" for i in range(5))
    source = open_source(path)
    assert source.name == "jsonl"
    assert [e.sample["txt"] for e in source.scan(1, 3)] == ["line 1", "line 2"]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('{"txt": "a"}\n{"txt": "b"}\n{"txt": oops}\n', 3, "invalid JSON"),
        ('{"txt": "a"}\n\n[1, 2]\n', 3, "JSON object"),
        ('{"__key__": 7, "txt": "a"}\n', 1, "__key__ must be a string"),
        ('{"__key__": "a.b", "txt": "a"}\n', 1, "not usable in a tar shard"),
        ('{"__key__": "a"}\n', 1, "no fields"),
    ],
)
def test_jsonl_bad_lines_name_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(PackError, match=message) as info:
        pack(path, tmp_path / "out", workers=1)
    assert info.value.url == str(path)
    assert info.value.line == line
    assert not (tmp_path / "out" / ".shardstream" / "manifest.json").exists()


def test_jsonl_that_cannot_be_read(tmp_path):
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(PackError, match="cannot") as info:
        pack(tmp_path / "dir.jsonl", tmp_path / "out", source_type="jsonl", workers=1)
    assert "dir.jsonl" in info.value.url


def test_csv_and_tsv(tmp_path):
    path = tmp_path / "table.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["__key__", "txt", "label"])
        writer.writerow(["r1", "hello, world", "1"])
        writer.writerow(["r2", "two\nlines", "0"])
    pack(path, tmp_path / "out", workers=1)
    assert read_shards(tmp_path / "out") == [
        {"__key__": "r1", "txt": b"hello, world", "label": b"1"},
        {"__key__": "r2", "txt": b"two\nlines", "label": b"0"},
    ]
    tsv = tmp_path / "table.tsv"
    tsv.write_text("txt\tlabel\nx\t1\ny\t2\n")
    assert [e.sample for e in open_source(tsv).scan()] == [
        {"txt": "x", "label": "1", "__key__": "000000000"},
        {"txt": "y", "label": "2", "__key__": "000000001"},
    ]


def test_csv_bad_row_names_its_line(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text("txt,label\na,1\nb,2,extra\n")
    with pytest.raises(PackError, match="3 cells, the header has 2") as info:
        pack(path, tmp_path / "out", workers=1)
    assert (info.value.url, info.value.line) == (str(path), 3)
    (tmp_path / "dup.csv").write_text("txt,txt\na,b\n")
    with pytest.raises(PackError, match="column 'txt' twice"):
        pack(tmp_path / "dup.csv", tmp_path / "out", workers=1)


def test_parquet_folder_as_spark_writes_it(tmp_path):
    folder = tmp_path / "spark"
    folder.mkdir()
    (folder / "_SUCCESS").write_bytes(b"")
    for part in range(2):
        table = pa.table({"text": [f"p{part}r{i}" for i in range(3)], "n": list(range(3))})
        pq.write_table(table, folder / f"part-0000{part}.snappy.parquet", row_group_size=2)
    source = open_source(folder)
    assert source.name == "parquet"
    assert source.count() == 6
    assert [e.key for e in source.scan(2, 5)] == ["000000002", "000000003", "000000004"]
    manifest = pack(folder, tmp_path / "out", format="parquet", workers=1)
    assert manifest.num_samples == 6
    rows = pq.read_table(tmp_path / "out" / "shard-000000.parquet").to_pylist()
    assert [r["text"] for r in rows] == ["p0r0", "p0r1", "p0r2", "p1r0", "p1r1", "p1r2"]


def test_tar_source_repacks_webdataset_tars(tmp_path):
    (tmp_path / "wds").mkdir()
    expected = []
    for shard in range(2):
        with wds.TarWriter(str(tmp_path / "wds" / f"data-{shard}.tar")) as sink:
            for i in range(4):
                sample = {"__key__": f"s{shard}_{i}", "txt": f"text {i}".encode(), "cls": str(i).encode()}
                sink.write(sample)
                expected.append(sample)
    pack(tmp_path / "wds", tmp_path / "out", samples_per_shard=3, workers=1)
    assert read_shards(tmp_path / "out") == expected


def test_tar_gz_source(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in [("k1.txt", b"one"), ("k1.json", b"{}"), ("k2.txt", b"two")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    (tmp_path / "in.tgz").write_bytes(buffer.getvalue())
    assert [e.sample for e in open_source(tmp_path / "in.tgz").scan()] == [
        {"__key__": "k1", "txt": b"one", "json": b"{}"},
        {"__key__": "k2", "txt": b"two"},
    ]


def test_tar_key_with_two_members_of_one_field(tmp_path):
    with tarfile.open(tmp_path / "dup.tar", "w") as archive:
        for data in (b"first", b"second"):
            info = tarfile.TarInfo("sample7.txt")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with pytest.raises(PackError, match="'sample7' has two members for field 'txt'") as info:
        pack(tmp_path / "dup.tar", tmp_path / "out", workers=1)
    assert info.value.url.endswith("dup.tar")


def test_empty_sources(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(PackError, match="no samples"):
        pack(tmp_path / "empty.jsonl", tmp_path / "out", workers=1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackError, match="no samples"):
        pack(tmp_path / "empty", tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_detection(tmp_path):
    (tmp_path / "data.xyz").write_text("?")
    with pytest.raises(UsageError, match="--source-type"):
        open_source(tmp_path / "data.xyz")
    with pytest.raises(UsageError, match="source not found"):
        open_source(tmp_path / "missing.jsonl")
    with pytest.raises(UsageError, match="unknown source type"):
        open_source(tmp_path / "data.xyz", source_type="nope")
    assert {"folder", "jsonl", "csv", "parquet", "tar"} <= set(available_sources())
    with pytest.raises(TypeError):
        available_sources()["x"] = Source  # type: ignore[index]


class LinesSource(Source):
    """A test source: one sample per line of a .lines file."""

    name = "test-lines"

    @classmethod
    def detect(cls, url, storage_options, is_dir):
        return str(url).endswith(".lines")

    def scan(self, start=0, stop=None):
        with open(self.url) as f:
            for i, line in enumerate(f.read().splitlines()[start:stop], start):
                yield Entry(f"line{i}", {"__key__": f"line{i}", "txt": line}, None, self.url, i + 1)


def test_a_new_source_is_one_class(tmp_path):
    (tmp_path / "x.lines").write_text("a\nb\nc\n")
    register_source(LinesSource)
    try:
        manifest = pack(tmp_path / "x.lines", tmp_path / "out", workers=1)
    finally:
        from shardstream.pack import sources

        sources._SOURCES.pop("test-lines")
    assert manifest.num_samples == 3
    assert [s["txt"] for s in read_shards(tmp_path / "out")] == [b"a", b"b", b"c"]
