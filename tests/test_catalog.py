"""index, inspect and verify: shards written by other tools, packed datasets, damaged ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds

from shardstream.catalog import index_dataset, inspect_dataset, verify_dataset
from shardstream.errors import ManifestError, UsageError
from shardstream.formats import get_format
from shardstream.manifest import Manifest
from shardstream.pack import ShardWriter, pack
from shardstream.types import ByteRange


def read_back(folder) -> list[dict]:
    manifest = Manifest.from_json((folder / ".shardstream" / "manifest.json").read_text())
    fmt = get_format(manifest.format)
    out = []
    for shard in manifest.shards:
        data = (folder / shard.path).read_bytes()
        index = fmt.load_index((folder / shard.index).read_bytes(), name=shard.path)
        out += fmt.decode(data, ByteRange(0, len(data)), index, 0, index.num_samples, name=shard.path)
    return out


def write_wds(folder, splits: int = 2, per_split: int = 5) -> list[dict]:
    """Tars written by webdataset.ShardWriter (PAX headers), in nested folders."""
    expected = []
    for split in range(splits):
        sub = folder / f"split{split}"
        sub.mkdir(parents=True)
        with wds.ShardWriter(str(sub / "train-%04d.tar"), maxcount=3, verbose=0) as sink:
            for i in range(per_split):
                sample = {
                    "__key__": f"{split}_{i:03d}",
                    "txt": f"caption {i}".encode(),
                    "jpg": bytes(range(i + 1)),
                }
                sink.write(sample)
                expected.append(sample)
    return expected


def test_index_webdataset_tars_reads_each_once_and_decodes(tmp_path):
    expected = write_wds(tmp_path / "wds")
    manifest = index_dataset(str(tmp_path / "wds"))
    assert [s.path for s in manifest.shards] == [
        "split0/train-0000.tar",
        "split0/train-0001.tar",
        "split1/train-0000.tar",
        "split1/train-0001.tar",
    ]
    assert manifest.fields == ("jpg", "txt")
    assert (tmp_path / "wds" / ".shardstream" / "split0" / "train-0000.tar.idx").exists()
    assert read_back(tmp_path / "wds") == expected
    report = verify_dataset(str(tmp_path / "wds"))
    assert report.ok, report.problems
    assert report.num_samples == 10


def test_index_gnu_tar(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    for i in range(3):
        (files / f"doc{i}.txt").write_bytes(b"text %d" % i)
        (files / f"doc{i}.json").write_bytes(b'{"i": %d}' % i)
    (tmp_path / "ds").mkdir()
    names = sorted(os.listdir(files))
    subprocess.run(["tar", "-cf", str(tmp_path / "ds" / "gnu.tar"), *names], cwd=files, check=True)
    manifest = index_dataset(str(tmp_path / "ds"))
    assert manifest.num_samples == 3
    assert read_back(tmp_path / "ds")[1] == {"__key__": "doc1", "json": b'{"i": 1}', "txt": b"text 1"}


def test_index_foreign_parquet(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "_SUCCESS").write_bytes(b"")
    for part in range(2):
        table = pa.table({"text": [f"p{part}-{i}" for i in range(4)], "n": pa.array(range(4), pa.int32())})
        pq.write_table(table, tmp_path / "ds" / f"part-{part:05d}.parquet", row_group_size=3)
    manifest = index_dataset(str(tmp_path / "ds"))
    assert manifest.format == "parquet"
    assert manifest.key_column is None
    assert manifest.schema == {"n": "int32", "text": "string"}
    rows = read_back(tmp_path / "ds")
    assert rows[5] == {"__key__": "part-00001.parquet:1", "text": "p1-1", "n": 1}
    assert verify_dataset(str(tmp_path / "ds")).ok


@pytest.mark.parametrize("format", ["tar", "parquet"])
def test_index_of_a_packed_dataset_is_the_packed_manifest(tmp_path, format):
    with ShardWriter(tmp_path / "ds", format=format, samples_per_shard=7) as writer:
        for i in range(30):
            writer.write({"__key__": f"k{i:03d}", "txt": f"text {i}", "cls": i % 3})
    packed = (tmp_path / "ds" / ".shardstream" / "manifest.json").read_bytes()
    meta = tmp_path / "ds" / ".shardstream"
    sidecars = {p: (meta / p).read_bytes() for p in os.listdir(meta) if p.endswith(".idx")}
    assert len(sidecars) == 5
    (tmp_path / "ds" / ".shardstream" / "manifest.json").unlink()
    index_dataset(str(tmp_path / "ds"))
    assert (tmp_path / "ds" / ".shardstream" / "manifest.json").read_bytes() == packed
    assert {p: (meta / p).read_bytes() for p in sidecars} == sidecars


def test_index_refuses_what_it_cannot_index(tmp_path):
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "a.tar.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(UsageError, match="compressed tar shards are not supported"):
        index_dataset(str(tmp_path / "gz"))
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.tar").write_bytes(bytes(1024))
    (tmp_path / "mixed" / "b.parquet").write_bytes(b"PAR1")
    with pytest.raises(UsageError, match="holds tar and parquet shards"):
        index_dataset(str(tmp_path / "mixed"))
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="no shards"):
        index_dataset(str(tmp_path / "none"))


def test_inspect(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"txt": "x" * (i * 40)}) + "\n" for i in range(25)))
    pack(tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=10, workers=1)
    summary = inspect_dataset(str(tmp_path / "ds"), sample_keys=3)
    assert (summary.format, summary.num_shards, summary.num_samples) == ("tar", 3, 25)
    assert summary.fields == ("txt",)
    assert summary.sample_keys == ("000000000", "000000001", "000000002")
    assert summary.shard_samples["min"] == 5
    assert summary.shard_samples["max"] == 10
    sizes = sorted(os.path.getsize(tmp_path / "ds" / f"shard-00000{i}.tar") for i in range(3))
    assert (summary.shard_bytes["min"], summary.shard_bytes["max"]) == (sizes[0], sizes[-1])
    assert json.loads(json.dumps(summary.to_dict()))["num_bytes"] == sum(sizes)
    # a folder of raw files is not told to index them (there are no shards): to pack them
    with pytest.raises(ManifestError, match=r"no shards .* but 2 other entries .*shardstream pack"):
        inspect_dataset(str(tmp_path))


def test_verify_notes_shards_the_manifest_does_not_list(tmp_path):
    with ShardWriter(tmp_path / "ds", samples_per_shard=4) as writer:
        for i in range(8):
            writer.write({"__key__": f"k{i:03d}", "txt": f"sample {i}"})
    shutil.copy(tmp_path / "ds" / "shard-000000.tar", tmp_path / "ds" / "stray.tar")
    shutil.copy(tmp_path / "ds" / "shard-000000.tar", tmp_path / "ds" / ".hidden.tar")  # as index skips it
    report = verify_dataset(str(tmp_path / "ds"))
    assert report.ok  # a note, not a problem
    assert report.unlisted == ("stray.tar",)


def test_verify_reports_each_bad_shard(tmp_path):
    with ShardWriter(tmp_path / "ds", samples_per_shard=4) as writer:
        for i in range(24):
            writer.write({"__key__": f"k{i:03d}", "txt": f"sample number {i}" * 20})
    ds = tmp_path / "ds"
    assert verify_dataset(str(ds)).ok
    # shard 0: one flipped byte in a sample's data
    data = bytearray((ds / "shard-000000.tar").read_bytes())
    data[600] ^= 0xFF
    (ds / "shard-000000.tar").write_bytes(bytes(data))
    # shard 1: truncated
    (ds / "shard-000001.tar").write_bytes((ds / "shard-000001.tar").read_bytes()[:1500])
    # shard 2: gone
    (ds / "shard-000002.tar").unlink()
    # shard 3: its sidecar is another shard's
    shutil.copy(ds / ".shardstream" / "shard-000004.tar.idx", ds / ".shardstream" / "shard-000003.tar.idx")
    # shard 4: sidecar gone
    (ds / ".shardstream" / "shard-000004.tar.idx").unlink()
    report = verify_dataset(str(ds))
    assert not report.ok
    assert report.bad_shards == [f"shard-00000{i}.tar" for i in range(5)]
    problems = {p.shard: p.problem for p in report.problems}
    assert "sha256" in problems["shard-000000.tar"]
    assert any("is corrupt" in p.problem for p in report.problems if p.shard == "shard-000001.tar")
    assert "cannot be read" in problems["shard-000002.tar"]
    assert "does not match" in problems["shard-000003.tar"]
    assert "sample index" in problems["shard-000004.tar"]
