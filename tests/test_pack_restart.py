"""A pack killed with SIGKILL leaves no manifest; the same command then finishes the job,
reusing the whole shards already written, and the result is byte-identical to a clean run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


def console_script() -> str:
    found = shutil.which("shardstream", path=os.path.dirname(sys.executable))
    assert found, "install the package: pip install -e . --no-deps"
    return found


def snapshot(folder) -> dict[str, bytes]:
    """Every file of a folder (recursive, ``.shardstream/`` too) and its bytes."""
    found = {}
    for directory, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return dict(sorted(found.items()))


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def kill(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)  # the pack and its worker processes
    process.wait(timeout=60)


def test_killed_pack_leaves_no_manifest_and_a_rerun_finishes_it(tmp_path):
    lines = [json.dumps({"txt": f"document {i} " * (i % 17), "cls": i % 5}) + "\n" for i in range(200)]
    source = tmp_path / "corpus.jsonl"
    command = [console_script(), "pack", str(source), str(tmp_path / "ds"), "--samples-per-shard", "10"]
    command += ["--workers", "2"]
    # The source is a pipe the test feeds: the pack is killed while it waits for line 96,
    # after it wrote shards 0..8, so "mid-way" is exact, not a matter of timing.
    os.mkfifo(source)
    process = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        with open(source, "w") as feed:
            feed.writelines(lines[:95])
            feed.flush()
            shards = [tmp_path / "ds" / ".shardstream" / f"shard-{i:06d}.tar.idx" for i in range(9)]
            wait_for(lambda: all(p.exists() for p in shards), "shards 0..8")
            kill(process)
    finally:
        if process.poll() is None:
            kill(process)
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    assert not (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()
    assert not (tmp_path / "ds" / "shard-000009.tar").exists()
    inodes = {i: os.stat(tmp_path / "ds" / f"shard-{i:06d}.tar").st_ino for i in range(9)}

    source.unlink()
    source.write_text("".join(lines))
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert {i: os.stat(tmp_path / "ds" / f"shard-{i:06d}.tar").st_ino for i in range(9)} == inodes  # reused

    clean = subprocess.run(
        [*command[:3], str(tmp_path / "clean"), *command[4:]], capture_output=True, text=True, timeout=300
    )
    assert clean.returncode == 0, clean.stderr
    assert snapshot(tmp_path / "ds") == snapshot(tmp_path / "clean")


def test_killed_while_writing_shards(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        (src / f"k{i:04d}.bin").write_bytes(os.urandom(2048 + i))
    command = [console_script(), "pack", str(src), str(tmp_path / "ds"), "--samples-per-shard", "1"]
    command += ["--workers", "2"]
    process = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        ds = tmp_path / "ds"
        wait_for(lambda: ds.exists() and len(os.listdir(ds)) >= 40, "some shards")
        kill(process)  # at whatever point the writers are
    finally:
        if process.poll() is None:
            kill(process)
    assert process.returncode == -signal.SIGKILL
    assert not (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()

    assert subprocess.run(command, capture_output=True, timeout=300).returncode == 0
    clean = subprocess.run(
        [*command[:3], str(tmp_path / "clean"), *command[4:]], capture_output=True, timeout=300
    )
    assert clean.returncode == 0
    # no temp file is left over from the killed run either
    assert snapshot(tmp_path / "ds") == snapshot(tmp_path / "clean")
