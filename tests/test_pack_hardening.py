"""Hardening of pack's sources and command line (issue 10): special files in a folder,
deeply nested JSON, CSV decoding errors, huge numbers on the command line."""

from __future__ import annotations

import os
import socket

import pytest

from shardstream.errors import PackError
from shardstream.pack import pack
from tests.test_pack import read_shards


def _sample_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for key in ("a", "b", "c"):
        (src / f"{key}.txt").write_bytes(key.encode())
        (src / f"{key}.json").write_bytes(b"{}")
    return src


@pytest.mark.parametrize("workers", [1, 2])
def test_folder_refuses_a_fifo_beside_a_samples_files(tmp_path, workers):
    src = _sample_folder(tmp_path)
    os.mkfifo(src / "b.cls")  # never opened: opening it would block the pack
    with pytest.raises(PackError, match="FIFO") as info:
        pack(src, tmp_path / "out", workers=workers)
    assert info.value.url == f"{src}/b.cls"
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_folder_refuses_a_unix_socket_beside_a_samples_files(tmp_path, workers, monkeypatch):
    src = _sample_folder(tmp_path)
    monkeypatch.chdir(src)  # a relative name: a socket's path is limited to ~100 bytes
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("c.sock")
    with pytest.raises(PackError, match="socket") as info:
        pack(src, tmp_path / "out", workers=workers)
    assert info.value.url == f"{src}/c.sock"


@pytest.mark.parametrize("workers", [1, 2])
def test_folder_refuses_a_link_to_a_fifo_and_follows_a_link_to_a_file(tmp_path, workers):
    src = _sample_folder(tmp_path)
    (tmp_path / "outside.bin").write_bytes(b"linked bytes")
    os.symlink(tmp_path / "outside.bin", src / "a.bin")
    manifest = pack(src, tmp_path / "ok", workers=workers)
    assert manifest.num_samples == 3
    first = next(s for s in read_shards(tmp_path / "ok") if s["__key__"] == "a")
    assert first["bin"] == b"linked bytes"  # a link to a regular file packs the file's bytes

    os.mkfifo(tmp_path / "pipe")
    os.symlink(tmp_path / "pipe", src / "c.pipe")
    with pytest.raises(PackError, match="symbolic link to a FIFO") as info:
        pack(src, tmp_path / "out", workers=workers)
    assert info.value.url == f"{src}/c.pipe"


def test_folder_refuses_a_link_to_a_folder_saying_so(tmp_path):
    src = _sample_folder(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", src / "more")
    with pytest.raises(PackError, match="link to a folder") as info:
        pack(src, tmp_path / "out", workers=1)
    assert info.value.url == f"{src}/more"
