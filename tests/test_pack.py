"""ShardWriter and pack: shard boundaries, determinism, restart, destination rules, parts."""

from __future__ import annotations

import io
import json
import os

import duckdb
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.catalog import index as catalog_index
from shardstream.catalog import index_dataset, verify_dataset
from shardstream.errors import PackError, UsageError
from shardstream.formats import get_format
from shardstream.formats.tar.header import exact_sample_size
from shardstream.pack import ShardWriter, pack
from shardstream.pack.sizing import sample_sizer
from shardstream.progress import ProgressBar
from shardstream.types import ByteRange


def snapshot(folder) -> dict[str, bytes]:
    """Every file of a folder (recursive) and its bytes, but the hidden ones outside
    ``.shardstream/`` (the records and claims of packs)."""
    found = {}
    for directory, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".") or d == ".shardstream"]
        for name in names:
            if not name.startswith("."):
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    found[os.path.relpath(path, folder)] = f.read()
    return found


def samples(n: int, *, size: int = 100) -> list[dict]:
    return [
        {"__key__": f"s{i:05d}", "txt": (f"sample {i} " * size)[: size + i % 7].encode(), "cls": i % 10}
        for i in range(n)
    ]


def make_folder(root, n: int, *, size: int = 300) -> None:
    for i in range(n):
        sub = root / f"d{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"k{i:04d}.txt").write_bytes(bytes([65 + i % 26]) * (size + i % 50))
        (sub / f"k{i:04d}.cls").write_bytes(str(i % 10).encode())


def read_shards(dest) -> list[dict]:
    manifest = json.loads((dest / ".shardstream" / "manifest.json").read_text())
    fmt = get_format(manifest["format"])
    out = []
    for shard in manifest["shards"]:
        data = (dest / shard["path"]).read_bytes()
        index = fmt.load_index((dest / shard["index"]).read_bytes(), name=shard["path"])
        out += fmt.decode(data, ByteRange(0, len(data)), index, 0, index.num_samples, name=shard["path"])
    return out


def test_writer_cuts_by_sample_count(tmp_path):
    with ShardWriter(tmp_path / "ds", samples_per_shard=4) as writer:
        for sample in samples(10):
            writer.write(sample)
    manifest = writer.manifest
    assert [s.samples for s in manifest.shards] == [4, 4, 2]
    assert [s.path for s in manifest.shards] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert manifest.fields == ("cls", "txt")
    assert manifest.writer.startswith("shardstream ")
    assert json.loads((tmp_path / "ds" / ".shardstream" / "manifest.json").read_text()) == manifest.to_dict()


def test_writer_cuts_by_size_and_every_shard_fits(tmp_path):
    fmt = get_format("tar")
    data = samples(40, size=700)
    shard_size = 5000
    with ShardWriter(tmp_path / "ds", shard_size=shard_size) as writer:
        for sample in data:
            writer.write(sample)
    shards = writer.manifest.shards
    assert len(shards) > 5
    position = 0
    for shard in shards:
        assert shard.bytes == os.path.getsize(tmp_path / "ds" / shard.path) <= shard_size
        position += shard.samples
        if position < len(data):  # the next sample did not fit
            assert shard.bytes + fmt.sample_size(data[position]) > shard_size


def test_writer_output_reads_in_webdataset_and_sidecars_match(tmp_path):
    data = samples(12)
    with ShardWriter(tmp_path / "ds", samples_per_shard=5) as writer:
        for sample in data:
            writer.write(sample)
    urls = [str(tmp_path / "ds" / s.path) for s in writer.manifest.shards]
    got = [
        {k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
        for s in wds.WebDataset(urls, shardshuffle=False)
    ]
    expected = [{"__key__": s["__key__"], "txt": s["txt"], "cls": str(s["cls"]).encode()} for s in data]
    assert got == expected
    fmt = get_format("tar")
    for shard in writer.manifest.shards:
        with open(tmp_path / "ds" / shard.path, "rb") as f:
            rebuilt, _ = fmt.build_index(f, name=shard.path)
        stored = fmt.load_index((tmp_path / "ds" / shard.index).read_bytes(), name=shard.path)
        assert stored.to_bytes(with_checks=False) == rebuilt.to_bytes()  # the index, checks aside
        assert stored.checks is not None
        assert (stored.checks.size, stored.checks.sha256) == (shard.bytes, shard.sha256)


def test_writer_failure_leaves_no_manifest_and_a_rerun_reuses_whole_shards(tmp_path):
    data = samples(20)

    def crash_after(n: int) -> None:
        with ShardWriter(tmp_path / "ds", samples_per_shard=6) as writer:
            for sample in data[:n]:
                writer.write(sample)
            raise RuntimeError("the generating program crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        crash_after(15)
    assert not (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()
    assert sorted(os.listdir(tmp_path / "ds")) == [
        ".shardstream",
        ".shardstream-pack.json",  # the record of the unfinished pack: the rerun may take these over
        "shard-000000.tar",
        "shard-000001.tar",
    ]
    assert sorted(os.listdir(tmp_path / "ds" / ".shardstream")) == [
        "shard-000000.tar.idx",
        "shard-000001.tar.idx",
    ]
    inode = os.stat(tmp_path / "ds" / "shard-000001.tar").st_ino
    with ShardWriter(tmp_path / "ds", samples_per_shard=6) as writer:
        for sample in data:
            writer.write(sample)
    assert os.stat(tmp_path / "ds" / "shard-000001.tar").st_ino == inode  # kept, not rewritten
    with ShardWriter(tmp_path / "clean", samples_per_shard=6) as clean:
        for sample in data:
            clean.write(sample)
    assert snapshot(tmp_path / "ds") == snapshot(tmp_path / "clean")


def test_writer_rejects_what_cannot_be_written(tmp_path):
    writer = ShardWriter(tmp_path / "ds", shard_size=4000)
    writer.write({"__key__": "small", "txt": b"x"})
    with pytest.raises(PackError, match="'big' takes 3584 bytes") as info:
        writer.write({"__key__": "big", "txt": b"x" * 3000})
    assert "shard_size" in str(info.value)
    with pytest.raises(PackError, match="repeats the previous sample's key"):
        writer.write({"__key__": "small", "txt": b"y"})
    manifest = writer.close()
    assert manifest.num_samples == 1
    with pytest.raises(PackError, match="closed"):
        writer.write({"__key__": "late", "txt": b"x"})
    with pytest.raises(PackError, match="no samples"), ShardWriter(tmp_path / "empty"):
        pass


def test_pack_is_byte_identical_for_any_number_of_workers(tmp_path):
    make_folder(tmp_path / "src", 120)
    runs = {}
    for workers in (1, 2, 3):
        dest = tmp_path / f"w{workers}"
        manifest = pack(tmp_path / "src", dest, shard_size="8KB", workers=workers)
        runs[workers] = snapshot(dest)
    assert len(manifest.shards) > 6
    assert runs[1] == runs[2] == runs[3]


def test_pack_equals_shard_writer_on_the_same_samples(tmp_path):
    data = [{"__key__": f"k{i:03d}", "txt": f"text {i}" * (i % 13), "cls": i % 4} for i in range(60)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(s) + "\n" for s in data))
    pack(tmp_path / "c.jsonl", tmp_path / "packed", shard_size="6KB", workers=2)
    with ShardWriter(tmp_path / "written", shard_size="6KB") as writer:
        for sample in data:
            writer.write(sample)
    assert snapshot(tmp_path / "packed") == snapshot(tmp_path / "written")


def test_parquet_shards_read_in_pyarrow_and_duckdb(tmp_path):
    (tmp_path / "t.csv").write_text("txt,label\n" + "".join(f"row {i},{i % 3}\n" for i in range(50)))
    manifest = pack(tmp_path / "t.csv", tmp_path / "ds", format="parquet", samples_per_shard=20, workers=1)
    assert [s.samples for s in manifest.shards] == [20, 20, 10]
    assert manifest.key_column == "__key__"
    assert manifest.fields == ("label", "txt")
    assert manifest.schema == {"__key__": "string", "label": "string", "txt": "string"}
    table = pq.read_table(tmp_path / "ds" / "shard-000001.parquet")
    assert table.column("txt").to_pylist()[:2] == ["row 20", "row 21"]
    count = duckdb.sql(f"select count(*) from read_parquet('{tmp_path / 'ds'}/*.parquet')").fetchall()
    assert count == [(50,)]
    assert [s["__key__"] for s in read_shards(tmp_path / "ds")][:2] == ["000000000", "000000001"]
    assert verify_dataset(str(tmp_path / "ds")).ok


def test_destination_with_another_dataset_is_refused_unless_overwrite(tmp_path):
    make_folder(tmp_path / "a", 30)
    make_folder(tmp_path / "b", 10, size=50)
    pack(tmp_path / "a", tmp_path / "ds", samples_per_shard=5, workers=1)
    before = snapshot(tmp_path / "ds")
    # the same pack again is fine and changes nothing
    pack(tmp_path / "a", tmp_path / "ds", samples_per_shard=5, workers=1)
    assert snapshot(tmp_path / "ds") == before
    for options in ({"samples_per_shard": 5}, {"samples_per_shard": 7}, {"format": "parquet"}):
        with pytest.raises(UsageError, match="another dataset"):
            pack(tmp_path / "b", tmp_path / "ds", workers=1, **options)
        assert snapshot(tmp_path / "ds") == before
    manifest = pack(tmp_path / "b", tmp_path / "ds", samples_per_shard=5, workers=1, overwrite=True)
    assert sorted(snapshot(tmp_path / "ds")) == sorted(
        [".shardstream/manifest.json"] + [p for s in manifest.shards for p in (s.path, s.index)]
    )
    assert len(manifest.shards) == 2


def test_parts_then_index_make_one_dataset(tmp_path, monkeypatch):
    lines = "".join(json.dumps({"txt": f"document {i}"}) + "\n" for i in range(23))
    (tmp_path / "c.jsonl").write_text(lines)
    whole = pack(tmp_path / "c.jsonl", tmp_path / "whole", samples_per_shard=4, workers=1)
    for part in (2, 0):
        pack(tmp_path / "c.jsonl", tmp_path / "parts", samples_per_shard=4, part=f"{part}/3", workers=1)
    assert not (tmp_path / "parts" / ".shardstream" / "manifest.json").exists()
    with pytest.raises(UsageError, match="part 1 of 3 is not finished"):
        index_dataset(str(tmp_path / "parts"))
    pack(tmp_path / "c.jsonl", tmp_path / "parts", samples_per_shard=4, part=(1, 3), workers=1)
    with monkeypatch.context() as patch:  # the parts' records are used: no shard is read again
        patch.setattr(catalog_index, "_index_one", lambda *args: pytest.fail(f"shard read again: {args[2]}"))
        joined = index_dataset(str(tmp_path / "parts"))
    assert [s.path for s in joined.shards][:3] == [
        "part-00000-shard-000000.tar",
        "part-00000-shard-000001.tar",
        "part-00001-shard-000000.tar",
    ]
    assert joined.num_samples == whole.num_samples == 23
    assert [s["__key__"] for s in read_shards(tmp_path / "parts")] == [f"{i:09d}" for i in range(23)]
    assert index_dataset(str(tmp_path / "parts"), rehash=True).to_json() == joined.to_json()
    assert verify_dataset(str(tmp_path / "parts")).ok


_names = st.text(st.characters(codec="utf-8", exclude_characters="./\0"), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(
    key=st.lists(_names, min_size=1, max_size=4).map("/".join),
    fields=st.dictionaries(
        st.text(st.characters(codec="utf-8", exclude_characters="/\0_"), min_size=1, max_size=40),
        st.one_of(st.binary(max_size=1500), st.text(max_size=300), st.integers(-(10**30), 10**30)),
        min_size=1,
        max_size=4,
    ),
)
def test_fast_tar_sizes_are_the_bytes_written(key, fields):
    """The sizes that cut shards are the bytes the encoder writes, and the slow rule's."""
    fmt = get_format("tar")
    sample = {"__key__": key, **fields}
    try:
        expected = exact_sample_size(sample, None)
    except PackError:
        return  # an invalid sample: the encoder rejects it when written
    buffer = io.BytesIO()
    encoder = fmt.encoder(buffer, name="sizes.tar")
    encoder.write(sample)
    encoder.close()
    written = len(buffer.getvalue()) - 1024  # less the two zero blocks that end a tar
    assert written == expected
    assert fmt.sample_size(sample) == expected
    assert sample_sizer(fmt)(sample) == expected


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_counts_every_sample_and_byte(tmp_path, workers):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"txt": f"t{i}" * 30}) + "\n" for i in range(3000)))
    stream = io.StringIO()
    progress = ProgressBar("pack", stream=stream, enabled=True)
    manifest = pack(
        tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=1200, workers=workers, progress=progress
    )
    assert (progress.samples, progress.nbytes) == (3000, manifest.num_bytes)
    assert stream.getvalue().startswith("\rpack: ")  # drawn (at most every 0.2 s)


def test_pack_to_memory_storage_stays_in_one_process(tmp_path):
    make_folder(tmp_path / "src", 20)
    url = f"memory://shardstream-test-{os.getpid()}/ds"
    manifest = pack(tmp_path / "src", url, samples_per_shard=3, workers=2)
    assert len(manifest.shards) == 7
    assert verify_dataset(url).ok
