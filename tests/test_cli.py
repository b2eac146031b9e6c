"""The shardstream command: exit statuses, messages, output; in process and as a real program."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from shardstream.cli import main
from shardstream.progress import ProgressBar


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"txt": f"document {i}", "cls": i % 2}) + "\n" for i in range(40)))
    return path


def test_pack_inspect_verify_index(tmp_path, corpus, capsys):
    dest = tmp_path / "ds"
    assert main(["pack", str(corpus), str(dest), "--samples-per-shard", "15", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "40 samples" in out
    assert "into 3 shards" in out

    assert main(["inspect", str(dest)]) == 0
    out = capsys.readouterr().out
    assert "samples        40" in out
    assert "cls, txt" in out
    assert "sample keys    000000000, 000000001, 000000002, 000000003, 000000004 ...\n" in out
    assert main(["inspect", str(dest), "--keys", "40"]) == 0  # every key shown: no "..."
    assert capsys.readouterr().out.count("000000039\n") == 1

    assert main(["inspect", str(dest), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["num_shards"], summary["num_samples"], summary["fields"]) == (3, 40, ["cls", "txt"])

    assert main(["verify", str(dest)]) == 0
    assert "3 shards, 40 samples checked: OK" in capsys.readouterr().out

    (dest / ".shardstream" / "manifest.json").unlink()
    assert main(["index", str(dest), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["verify", str(dest), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_verify_lists_bad_shards_and_exits_1(tmp_path, corpus, capsys):
    dest = tmp_path / "ds"
    assert main(["pack", str(corpus), str(dest), "--samples-per-shard", "10", "--quiet"]) == 0
    (dest / "shard-000002.tar").write_bytes(b"garbage")
    assert main(["verify", str(dest)]) == 1
    out = capsys.readouterr().out
    assert "BAD shard-000002.tar" in out
    assert "1 of 4 shards bad" in out


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["pack", "{corpus}", "{dest}", "--part", "3/3"], 2, "need 0 <= I < N"),
        (["pack", "{corpus}", "{dest}", "--shard-size", "lots"], 2, "bad size 'lots'"),
        (["pack", "{tmp}/missing.jsonl", "{dest}"], 2, "source not found"),
        (["pack", "{corpus}", "{dest}", "--format", "zip"], 2, "invalid choice"),
        (["pack", "{corpus}", "{dest}", "--source-type", "xml"], 2, "csv, folder, jsonl, parquet, tar"),
        (["pack", "{corpus}", "{dest}", "--compression", "gzip"], 2, "tar shards are not compressed"),
        (["inspect", "{tmp}"], 1, "no .shardstream/manifest.json"),
        (["frobnicate"], 2, "invalid choice"),
    ],
)
def test_usage_and_data_errors(tmp_path, corpus, capsys, args, status, message):
    values = {"corpus": str(corpus), "dest": str(tmp_path / "ds"), "tmp": str(tmp_path)}
    assert main([a.format(**values) for a in args]) == status
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_bad_line_names_file_and_line_and_debug_shows_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"txt": "fine"}\n{"txt": \n')
    assert main(["pack", str(bad), str(tmp_path / "ds")]) == 1
    err = capsys.readouterr().err
    assert "invalid JSON" in err
    assert f"url={bad}" in err
    assert "line=2" in err
    assert "Traceback" not in err
    assert main(["pack", str(bad), str(tmp_path / "ds"), "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_existing_dataset_needs_overwrite(tmp_path, corpus, capsys):
    dest = str(tmp_path / "ds")
    assert main(["pack", str(corpus), dest, "--quiet"]) == 0
    other = tmp_path / "other.jsonl"
    other.write_text('{"txt": "something else"}\n')
    assert main(["pack", str(other), dest]) == 2
    assert "another dataset" in capsys.readouterr().err
    assert main(["pack", str(other), dest, "--overwrite", "--quiet"]) == 0
    assert json.loads((tmp_path / "ds" / ".shardstream" / "manifest.json").read_text())["num_samples"] == 1


def test_parts_then_index(tmp_path, corpus, capsys):
    dest = str(tmp_path / "ds")
    for part in range(3):
        assert main(["pack", str(corpus), dest, "--part", f"{part}/3", "--samples-per-shard", "5"]) == 0
    assert "shardstream index" in capsys.readouterr().out
    assert main(["index", dest]) == 0
    assert "40 samples" in capsys.readouterr().out
    assert main(["verify", dest, "--quiet"]) == 0


def test_progress_bar_draws_on_a_terminal_only():
    stream = io.StringIO()
    progress = ProgressBar("pack", total=100, stream=stream, enabled=True)
    progress.update(50, 5_000_000)
    progress.update(50, 5_000_000)
    progress.close()
    drawn = stream.getvalue()
    assert "\r" in drawn
    assert "100%" in drawn
    assert "100 samples" in drawn
    assert "MB" in drawn
    quiet = io.StringIO()
    progress = ProgressBar("pack", total=100, stream=quiet)  # StringIO is not a TTY
    progress.update(100, 10)
    progress.close()
    assert quiet.getvalue() == ""
    assert "100 samples" in progress.summary()


def console_script() -> str:
    found = shutil.which("shardstream", path=os.path.dirname(sys.executable))
    assert found, "install the package: pip install -e . --no-deps"
    return found


def test_console_script_packs_and_verifies(tmp_path, corpus):
    dest = tmp_path / "ds"
    run = subprocess.run(
        [console_script(), "pack", str(corpus), str(dest), "--samples-per-shard", "8", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "40 samples" in run.stdout
    # not a terminal: no progress bar; only pack's advice for these small members
    assert all(line.startswith("pack: tar members average") for line in run.stderr.splitlines())
    run = subprocess.run([console_script(), "verify", str(dest)], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stderr) == (0, "")
    assert "5 shards, 40 samples checked: OK" in run.stdout


def test_console_script_error_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n3\n")
    run = subprocess.run(
        [console_script(), "pack", str(bad), str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert "row has 1 cells, the header has 2" in run.stderr
    assert "line=3" in run.stderr
    assert "Traceback" not in run.stderr
