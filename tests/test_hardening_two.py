"""Hardening, round two (issue 39): no write outside the destination, clear refusals of
folders that are not what they seem."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from shardstream.catalog import index_dataset, verify_dataset
from shardstream.cli import main
from shardstream.errors import StorageError
from shardstream.pack import ShardWriter, pack
from shardstream.storage import Storage
from tests.test_pack_restart import snapshot


def corpus(path, tag: str = "doc", count: int = 30):
    path.write_text("".join(json.dumps({"txt": f"{tag} {i}", "cls": i % 3}) + "\n" for i in range(count)))
    return path


@pytest.fixture
def linked(tmp_path):
    """Datasets A and B, A's ``.shardstream`` a link to B's."""
    source = corpus(tmp_path / "c.jsonl")
    pack(source, tmp_path / "B", samples_per_shard=10)
    pack(source, tmp_path / "A", samples_per_shard=10)
    shutil.rmtree(tmp_path / "A" / ".shardstream")
    os.symlink(tmp_path / "B" / ".shardstream", tmp_path / "A" / ".shardstream")
    return tmp_path


# -- item 1: a linked metadata folder ---------------------------------------------------


def test_pack_overwrite_refuses_a_metadata_folder_linked_to_another_dataset(linked, capsys):
    other = corpus(linked / "other.jsonl", "other")
    before = snapshot(linked / "B")
    args = ["pack", str(other), str(linked / "A"), "--overwrite", "--samples-per-shard", "10", "--quiet"]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert f"{linked / 'A' / '.shardstream'} is a symbolic link to {linked / 'B' / '.shardstream'}" in err
    assert "outside the dataset folder" in err
    assert snapshot(linked / "B") == before  # B is whole: nothing of it replaced or deleted
    assert verify_dataset(str(linked / "B")).ok


def write_one(folder) -> None:
    with ShardWriter(folder, samples_per_shard=4, overwrite=True) as writer:
        writer.write({"__key__": "a", "txt": "x"})


@pytest.mark.parametrize("write", [index_dataset, write_one])
def test_index_and_a_shard_writer_refuse_the_link_too(linked, write):
    before = snapshot(linked / "B")
    with pytest.raises(StorageError, match=r"is a symbolic link to .* outside the dataset folder") as caught:
        write(str(linked / "A"))
    assert caught.value.url == str(linked / "A" / ".shardstream")
    assert snapshot(linked / "B") == before


def test_a_link_inside_the_folder_and_a_linked_root_still_pack(tmp_path):
    source = corpus(tmp_path / "c.jsonl")
    (tmp_path / "real" / "meta").mkdir(parents=True)
    os.symlink("meta", tmp_path / "real" / ".shardstream")  # leads inside the folder: allowed
    os.symlink(tmp_path / "real", tmp_path / "named")  # the root the user names may be a link
    assert pack(source, tmp_path / "named", samples_per_shard=10).num_samples == 30
    assert verify_dataset(str(tmp_path / "named")).ok
    assert "manifest.json" in os.listdir(tmp_path / "real" / "meta")


def test_storage_refuses_every_write_and_delete_through_an_outside_link(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_bytes(b"keep")
    (tmp_path / "ds").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "ds" / "sub")
    storage = Storage(str(tmp_path / "ds"))
    with pytest.raises(StorageError, match="symbolic link"):
        storage.write("sub/x.bin", b"x")
    with pytest.raises(StorageError, match="symbolic link"), storage.writer("sub/y.bin") as f:
        f.write(b"y")
    with pytest.raises(StorageError, match="symbolic link"):
        storage.delete("sub/keep.txt")
    with pytest.raises(StorageError, match="symbolic link"):
        storage.remove_temp_files(lambda name: True, "sub")
    assert sorted(os.listdir(tmp_path / "elsewhere")) == ["keep.txt"]
    assert storage.read("sub/keep.txt") == b"keep"  # reads follow the link as before


# -- item 12: a metadata folder that is a file ------------------------------------------


@pytest.mark.parametrize("command", ["index", "pack"])
def test_a_metadata_folder_that_is_a_file_is_named(tmp_path, capsys, command):
    source = corpus(tmp_path / "c.jsonl")
    pack(source, tmp_path / "A", samples_per_shard=10)
    shutil.rmtree(tmp_path / "A" / ".shardstream")
    (tmp_path / "A" / ".shardstream").write_text("not a folder")
    if command == "index":
        args = ["index", str(tmp_path / "A")]
    else:
        args = [
            "pack",
            str(source),
            str(tmp_path / "A"),
            "--overwrite",
            "--samples-per-shard",
            "10",
            "--quiet",
        ]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'A' / '.shardstream'} is a regular file, not a folder" in err
    assert "move the file away" in err
    assert (tmp_path / "A" / ".shardstream").read_text() == "not a folder"
