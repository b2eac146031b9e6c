"""Pack, index and verify over real HTTP S3: moto's server (fixture ``s3``) and SeaweedFS."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import webdataset as wds

from shardstream.catalog import index_dataset, inspect_dataset, verify_dataset
from shardstream.cli import main
from shardstream.pack import ShardWriter, pack
from shardstream.storage import Storage
from tests.test_pack_restart import snapshot

pytestmark = pytest.mark.s3


def make_folder(root, n: int) -> None:
    for i in range(n):
        sub = root / f"part{i % 2}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"item{i:03d}.txt").write_bytes(f"text of item {i} ".encode() * (1 + i % 9))
        (sub / f"item{i:03d}.cls").write_bytes(str(i % 4).encode())


def stored(url: str, options: dict) -> dict[str, bytes]:
    storage = Storage(url, options)
    try:
        return {path: storage.read(path) for path in storage.list_files()}
    finally:
        storage.close()


def test_pack_to_s3_with_workers_is_the_local_pack(s3, tmp_path):
    base, options = s3
    make_folder(tmp_path / "src", 60)
    url = f"{base}/corpus"
    manifest = pack(tmp_path / "src", url, shard_size="16KB", workers=2, storage_options=options)
    assert len(manifest.shards) > 4
    pack(tmp_path / "src", tmp_path / "local", shard_size="16KB", workers=1)
    assert stored(url, options) == snapshot(tmp_path / "local")

    report = verify_dataset(url, storage_options=options)
    assert report.ok, report.problems
    summary = inspect_dataset(url, storage_options=options)
    assert (summary.num_samples, summary.fields) == (60, ("cls", "txt"))


def test_pack_from_an_s3_folder_with_workers_is_the_local_pack(s3, tmp_path):
    base, options = s3
    make_folder(tmp_path / "src", 50)
    (tmp_path / "src" / "part1" / "deeper").mkdir()
    (tmp_path / "src" / "part1" / "deeper" / "last.txt").write_bytes(b"in a subfolder")
    storage = Storage(f"{base}/source-folder", options)
    for path in sorted(tmp_path.glob("src/**/*.*")):
        storage.write(path.relative_to(tmp_path / "src").as_posix(), path.read_bytes())
    storage.close()
    pack(tmp_path / "src", tmp_path / "local", shard_size="8KB", workers=1)
    for workers in (1, 2):  # the worker processes read the files from S3 themselves
        dest = tmp_path / f"from-s3-{workers}"
        pack(f"{base}/source-folder/", dest, shard_size="8KB", workers=workers, storage_options=options)
        assert snapshot(dest) == snapshot(tmp_path / "local")


def test_interrupted_writer_on_s3_then_rerun(s3):
    base, options = s3
    url = f"{base}/generated"
    data = [{"__key__": f"g{i:04d}", "txt": f"generated {i}" * 5, "cls": i % 3} for i in range(50)]

    def write(count: int) -> None:
        with ShardWriter(url, samples_per_shard=8, storage_options=options) as writer:
            for sample in data[:count]:
                writer.write(sample)
            if count < len(data):
                raise KeyboardInterrupt  # the program was stopped

    with pytest.raises(KeyboardInterrupt):
        write(30)
    files = stored(url, options)
    assert ".shardstream/manifest.json" not in files
    sidecars = [f".shardstream/shard-00000{i}.tar.idx" for i in range(3)]
    shards = [f"shard-00000{i}.tar" for i in range(3)]
    assert sorted(files) == [
        ".shardstream-pack.json",
        *sidecars,
        *shards,
    ]  # with the unfinished pack's record
    write(len(data))
    write_clean = f"{base}/clean"
    with ShardWriter(write_clean, samples_per_shard=8, storage_options=options) as writer:
        for sample in data:
            writer.write(sample)
    assert stored(url, options) == stored(write_clean, options)
    assert verify_dataset(url, storage_options=options).ok


def test_cli_to_s3_in_process_and_as_a_program(s3, tmp_path, capsys):
    base, options = s3
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"txt": f"line {i}"}) + "\n" for i in range(30)))
    url = f"{base}/cli"
    args = ["pack", str(corpus), url, "--format", "parquet", "--samples-per-shard", "10"]
    assert main([*args, "--endpoint-url", options["endpoint_url"], "--workers", "1"]) == 0
    assert "30 samples" in capsys.readouterr().out
    # the program finds the server through AWS_ENDPOINT_URL and the AWS_* keys (set by the fixture)
    script = shutil.which("shardstream", path=os.path.dirname(sys.executable))
    run = subprocess.run([script, "verify", url], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "3 shards, 30 samples checked: OK" in run.stdout
    run = subprocess.run([script, "inspect", url, "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(run.stdout)["schema"] == {"__key__": "string", "txt": "string"}
    # two worker processes (forked after the first S3 calls) write the same bytes
    run = subprocess.run(
        [script, *args[:2], f"{base}/cli2", *args[3:], "--workers", "2"], capture_output=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert stored(f"{base}/cli2", options) == stored(url, options)


def test_index_webdataset_tars_on_s3(s3, tmp_path):
    base, options = s3
    expected = []
    for shard in range(2):
        path = tmp_path / f"train-{shard}.tar"
        with wds.TarWriter(str(path)) as sink:
            for i in range(6):
                sample = {"__key__": f"{shard}-{i}", "txt": f"caption {i}".encode()}
                sink.write(sample)
                expected.append(sample)
    storage = Storage(f"{base}/wds", options)
    for shard in range(2):
        storage.write(f"train-{shard}.tar", (tmp_path / f"train-{shard}.tar").read_bytes())
    storage.close()
    manifest = index_dataset(f"{base}/wds", storage_options=options)
    assert (len(manifest.shards), manifest.num_samples) == (2, 12)
    assert verify_dataset(f"{base}/wds", storage_options=options).ok
    keys = inspect_dataset(f"{base}/wds", storage_options=options, sample_keys=12).sample_keys
    assert list(keys) == [s["__key__"] for s in expected]


@pytest.mark.slow
def test_pack_and_verify_on_seaweedfs(seaweedfs, tmp_path):
    bucket = "pack-" + uuid.uuid4().hex[:8]
    seaweedfs.create_bucket(bucket)
    options = seaweedfs.storage_options()
    make_folder(tmp_path / "src", 40)
    url = f"s3://{bucket}/corpus"
    manifest = pack(tmp_path / "src", url, samples_per_shard=7, workers=2, storage_options=options)
    assert [s.samples for s in manifest.shards] == [7, 7, 7, 7, 7, 5]
    report = verify_dataset(url, storage_options=options)
    assert report.ok, report.problems
    assert report.num_samples == 40
    # the same pack again reuses every shard and leaves the dataset as it was
    before = stored(url, options)
    pack(tmp_path / "src", url, samples_per_shard=7, workers=1, storage_options=options)
    assert stored(url, options) == before
