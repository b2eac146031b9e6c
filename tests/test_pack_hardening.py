"""Hardening of pack's sources and command line (issue 10): special files in a folder,
deeply nested JSON, CSV decoding errors, huge numbers on the command line."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess

import pytest

from shardstream.cli import main
from shardstream.errors import PackError, UsageError
from shardstream.pack import pack
from shardstream.pack.options import MAX_COUNT, PackOptions, parse_size
from tests.test_cli import console_script
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
    assert not (tmp_path / "out" / ".shardstream" / "manifest.json").exists()


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


@pytest.mark.parametrize("suffix", ["parquet", "tar"])
def test_a_folder_of_shards_refuses_a_fifo_among_them(tmp_path, suffix):
    src = tmp_path / "src"
    src.mkdir()
    first = tmp_path / "first"
    (tmp_path / "made").mkdir()
    pack(_sample_folder(tmp_path / "made"), first, format=suffix, workers=1)
    (src / f"a.{suffix}").write_bytes((first / f"shard-000000.{suffix}").read_bytes())
    os.mkfifo(src / f"b.{suffix}")  # would be left out of the dataset (or block the pack when opened)
    with pytest.raises(PackError, match="not a regular file") as info:
        pack(src, tmp_path / "out", workers=1)
    assert info.value.url == f"{src}/b.{suffix}"


def _jsonl_with_a_deep_line(path, depth):
    with open(path, "w") as f:
        f.write('{"txt": "a"}\n\n{"txt": "b"}\n')
        f.write('{"txt": "deep", "nest": ' + "[" * depth + "]" * depth + "}\n")
        f.write('{"txt": "c"}\n')


@pytest.mark.parametrize("depth", [100_000, 600])
@pytest.mark.parametrize(("fmt", "workers"), [("tar", 1), ("tar", 2), ("parquet", 1), ("parquet", 2)])
def test_jsonl_nested_too_deeply_names_file_and_line(tmp_path, depth, fmt, workers):
    _jsonl_with_a_deep_line(tmp_path / "deep.jsonl", depth)

    def run():
        pack(tmp_path / "deep.jsonl", tmp_path / "out", format=fmt, workers=workers, samples_per_shard=2)

    if (depth, fmt) == (600, "tar"):  # a few hundred levels fit a tar shard, as JSON text
        run()
        texts = sorted(sample["txt"] for sample in read_shards(tmp_path / "out"))
        assert texts == [b"a", b"b", b"c", b"deep"]
        return
    with pytest.raises(PackError, match="nested too deeply") as info:  # never a bare RecursionError
        run()
    assert (info.value.url, info.value.line) == (str(tmp_path / "deep.jsonl"), 4)


def _csv_with_a_bad_byte(path, line, lines=6000, compress=False):
    rows = [b"__key__,txt\n"] + [b"k%05d,v%d\n" % (i, i) for i in range(2, lines + 1)]
    rows[line - 1] = b"k%05d,caf\xe9\n" % line  # Latin-1, not UTF-8
    data = b"".join(rows)
    path.write_bytes(gzip.compress(data) if compress else data)


@pytest.mark.parametrize("line", [2, 4670, 5000, 6000])
@pytest.mark.parametrize("compress", [False, True])
def test_csv_decoding_error_names_its_line(tmp_path, line, compress):
    path = tmp_path / ("bad.csv.gz" if compress else "bad.csv")
    _csv_with_a_bad_byte(path, line, compress=compress)
    with pytest.raises(PackError, match="not UTF-8") as info:
        pack(path, tmp_path / "out", workers=1)
    assert (info.value.url, info.value.line) == (str(path), line)


def test_csv_truncated_character_at_the_end_names_the_last_line(tmp_path):
    path = tmp_path / "cut.csv"
    path.write_bytes(b"a,b\n" + b"1,2\n" * 3000 + b"3,\xc3")  # the first byte of a two-byte character
    with pytest.raises(PackError, match="not UTF-8") as info:
        pack(path, tmp_path / "out", workers=1)
    assert info.value.line == 3002


HUGE = "9" * 400


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--shard-size", HUGE),
        ("--shard-size", HUGE + "MB"),
        ("--shard-size", "9" * 5000),
        ("--shard-size", str(MAX_COUNT + 1)),
        ("--samples-per-shard", HUGE),
        ("--samples-per-shard", "9" * 5000),
        ("--samples-per-shard", str(MAX_COUNT + 1)),
        ("--workers", HUGE),
        ("--workers", "9" * 5000),
    ],
)
def test_huge_numbers_on_the_command_line_are_usage_errors(tmp_path, capsys, option, value):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    assert main(["pack", str(tmp_path / "x.csv"), str(tmp_path / "ds"), option, value]) == 2
    err = capsys.readouterr().err
    assert "too large" in err
    assert str(MAX_COUNT) in err
    assert "Error" not in err  # no OverflowError, no traceback
    assert "9" * 50 not in err  # the number is not echoed whole
    assert not (tmp_path / "ds").exists()


def test_the_console_script_refuses_a_400_digit_shard_size_with_status_2(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    run = subprocess.run(
        [console_script(), "pack", str(tmp_path / "x.csv"), str(tmp_path / "ds"), "--shard-size", HUGE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert "too large" in run.stderr
    assert "Traceback" not in run.stderr
    assert "OverflowError" not in run.stderr


def test_sizes_and_counts_are_exact_and_bounded_in_the_library():
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("0.5KiB") == 512
    assert parse_size(str(MAX_COUNT)) == MAX_COUNT
    for bad in (HUGE, 10**400, MAX_COUNT + 1, "9" * 5000):
        with pytest.raises(UsageError, match="too large"):
            parse_size(bad)
    for bad in (10**400, HUGE, MAX_COUNT + 1):
        with pytest.raises(UsageError, match="too large"):
            PackOptions.create(samples_per_shard=bad)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="too large"):
            PackOptions(shard_size=bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="positive integer"):
        PackOptions.create(samples_per_shard=2.5)  # type: ignore[arg-type]
    assert PackOptions.create(samples_per_shard="12").samples_per_shard == 12  # type: ignore[arg-type]
