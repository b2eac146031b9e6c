"""A dataset folder as other tools read it (NOTE [ The dataset folder as others read it ]):
Hugging Face ``datasets`` loads it as it is, local (streaming and not) and on S3, for tar
and Parquet; DuckDB reads its Parquet shards and ``webdataset`` its tars by a brace URL;
and a dataset of the legacy layout (sidecars beside the shards, manifest at the top)
still streams, verifies and indexes, and ``index`` moves it to this layout."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import shardstream
from shardstream import folder
from shardstream.catalog import index_dataset, verify_dataset
from shardstream.pack import pack

SAMPLES = 12


@pytest.fixture
def hf(tmp_path):
    """``datasets.load_dataset`` with its cache under ``tmp_path``."""
    import datasets

    datasets.disable_progress_bars()

    def load(*args, **kwargs):
        return datasets.load_dataset(*args, split="train", cache_dir=str(tmp_path / "hf-cache"), **kwargs)

    return load


def make_corpus(folder) -> None:
    folder.mkdir()
    for i in range(SAMPLES):
        (folder / f"s{i:03d}.txt").write_text(f"text {i}\n")
        (folder / f"s{i:03d}.cls").write_text(f"{i % 3}\n")
        (folder / f"s{i:03d}.json").write_text(json.dumps({"i": i}))


@pytest.fixture(params=["tar", "parquet"])
def packed(request, tmp_path):
    make_corpus(tmp_path / "corpus")
    dest = tmp_path / request.param
    pack(str(tmp_path / "corpus"), str(dest), format=request.param, samples_per_shard=5, workers=1)
    return request.param, dest


def streamed(url: str, **kwargs) -> list[dict]:
    return list(shardstream.StreamingDataset(url, shuffle=False, **kwargs))


def as_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


@pytest.mark.parametrize("streaming", [False, True])
def test_hugging_face_loads_the_folder_as_it_is(packed, hf, streaming):
    format, dest = packed
    rows = list(hf(str(dest), streaming=streaming))
    assert [r["__key__"] for r in rows] == [f"s{i:03d}" for i in range(SAMPLES)]
    assert [as_text(r["txt"]) for r in rows] == [f"text {i}\n" for i in range(SAMPLES)]
    assert sorted(os.listdir(dest)) == [".shardstream", *(f"shard-{i:06d}.{format}" for i in range(3))]


@pytest.mark.s3
def test_hugging_face_reads_the_dataset_on_s3(s3, tmp_path, hf):
    base, options = s3
    make_corpus(tmp_path / "corpus")
    for format, builder, streaming in (
        ("parquet", "parquet", True),
        ("parquet", "parquet", False),
        ("tar", "webdataset", False),
    ):
        url = f"{base}/{format}"
        pack(
            str(tmp_path / "corpus"),
            url,
            format=format,
            samples_per_shard=5,
            storage_options=options,
            workers=1,
        )
        # every file of the folder, as Hugging Face resolves a folder (hidden ones skipped); it
        # adds to the storage options it is given, hence a copy
        rows = list(hf(builder, data_files=f"{url}/**", storage_options=dict(options), streaming=streaming))
        assert sorted(r["__key__"] for r in rows) == [f"s{i:03d}" for i in range(SAMPLES)], (
            format,
            streaming,
        )


def test_duckdb_reads_the_parquet_shards(tmp_path):
    import duckdb

    make_corpus(tmp_path / "corpus")
    pack(str(tmp_path / "corpus"), str(tmp_path / "ds"), format="parquet", samples_per_shard=5, workers=1)
    for pattern in ("*.parquet", "**/*.parquet"):
        rows = duckdb.sql(
            f"SELECT __key__ FROM read_parquet('{tmp_path}/ds/{pattern}') ORDER BY __key__"
        ).fetchall()
        assert [key for (key,) in rows] == [f"s{i:03d}" for i in range(SAMPLES)]


def test_webdataset_reads_the_tar_shards_by_a_brace_url(tmp_path):
    import webdataset as wds

    make_corpus(tmp_path / "corpus")
    pack(str(tmp_path / "corpus"), str(tmp_path / "ds"), samples_per_shard=5, workers=1)
    urls = f"{tmp_path}/ds/shard-{{000000..000002}}.tar"
    keys = [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]
    assert keys == [f"s{i:03d}" for i in range(SAMPLES)]


def to_legacy(dest) -> None:
    """Lay a dataset out as shardstream wrote it before ``.shardstream/``."""
    meta = dest / folder.META_FOLDER
    doc = json.loads((meta / "manifest.json").read_text())
    for shard in doc["shards"]:
        (meta / f"{shard['path']}.idx").rename(dest / f"{shard['path']}.idx")
        shard["index"] = f"{shard['path']}.idx"
    (dest / "manifest.json").write_text(json.dumps(doc))
    shutil.rmtree(meta)


def test_a_dataset_of_the_legacy_layout_streams_verifies_and_index_moves_it(packed, hf):
    format, dest = packed
    expected = streamed(str(dest))
    to_legacy(dest)
    assert streamed(str(dest)) == expected
    assert [shardstream.MapDataset(str(dest))[i] for i in range(SAMPLES)] == expected
    assert verify_dataset(str(dest)).ok
    index_dataset(str(dest))
    assert sorted(os.listdir(dest)) == [".shardstream", *(f"shard-{i:06d}.{format}" for i in range(3))]
    assert streamed(str(dest)) == expected
    assert verify_dataset(str(dest)).ok
    assert len(list(hf(str(dest)))) == SAMPLES


def test_a_pack_over_a_dataset_of_the_legacy_layout_moves_it(tmp_path):
    make_corpus(tmp_path / "corpus")
    dest = tmp_path / "ds"
    pack(str(tmp_path / "corpus"), str(dest), samples_per_shard=5, workers=1)
    expected = streamed(str(dest))
    to_legacy(dest)
    pack(str(tmp_path / "corpus"), str(dest), samples_per_shard=5, workers=1)  # the same dataset
    assert sorted(os.listdir(dest)) == [".shardstream", *(f"shard-{i:06d}.tar" for i in range(3))]
    assert streamed(str(dest)) == expected


def test_index_joins_parts_of_the_legacy_layout_and_moves_them(tmp_path):
    make_corpus(tmp_path / "corpus")
    dest = tmp_path / "ds"
    for part in range(2):
        pack(str(tmp_path / "corpus"), str(dest), samples_per_shard=4, part=(part, 2), workers=1)
    meta = dest / folder.META_FOLDER
    for part in range(2):  # the records and sidecars where the legacy layout has them
        name = folder.legacy_part_record_name(part, 2)
        doc = json.loads((meta / name).read_text())
        for shard in doc["shards"]:
            (meta / f"{shard['path']}.idx").rename(dest / f"{shard['path']}.idx")
            shard["index"] = f"{shard['path']}.idx"
        (dest / name).write_text(json.dumps(doc))
        (meta / name).unlink()
    manifest = index_dataset(str(dest))
    assert [s.index for s in manifest.shards] == [folder.sidecar_name(s.path) for s in manifest.shards]
    assert not [name for name in os.listdir(dest) if not name.endswith(".tar") and name != ".shardstream"]
    assert sorted(s["__key__"] for s in streamed(str(dest))) == [f"s{i:03d}" for i in range(SAMPLES)]
    index_dataset(str(dest))  # the moved records join the parts again
    assert verify_dataset(str(dest)).ok
