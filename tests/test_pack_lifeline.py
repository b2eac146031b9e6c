"""A pack's worker processes: capped at what can be used, and gone when the pack is killed."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from shardstream.pack import pack, parallel
from shardstream.pack.lifeline import usable_cores
from tests.test_cli import console_script
from tests.test_pack import snapshot

_DEADLINE = 60.0  # seconds before a wait below gives up (a bound against hanging, not a timing check)


def _jsonl(path, count):
    path.write_text("".join(json.dumps({"txt": f"sample {i}"}) + "\n" for i in range(count)))


@pytest.fixture
def pool_sizes(monkeypatch):
    """The ``max_workers`` of every process pool a pack starts."""
    sizes = []
    real = parallel.ProcessPoolExecutor

    def recording(max_workers, **kwargs):
        sizes.append(max_workers)
        return real(max_workers, **kwargs)

    monkeypatch.setattr(parallel, "ProcessPoolExecutor", recording)
    return sizes


def test_a_hundred_thousand_workers_are_capped_with_a_note(tmp_path, pool_sizes, caplog):
    _jsonl(tmp_path / "c.jsonl", 300)
    with caplog.at_level(logging.WARNING, logger="shardstream.pack"):
        pack(tmp_path / "c.jsonl", tmp_path / "many", samples_per_shard=10, workers=100_000)
    assert pool_sizes == [2 * usable_cores()]
    assert "100,000 workers asked for" in caplog.text
    assert f"{2 * usable_cores()} used" in caplog.text
    pack(tmp_path / "c.jsonl", tmp_path / "one", samples_per_shard=10, workers=1)
    assert snapshot(tmp_path / "many") == snapshot(tmp_path / "one")


def test_workers_are_capped_at_the_samples_of_a_part(tmp_path, pool_sizes, caplog):
    _jsonl(tmp_path / "c.jsonl", 3)
    with caplog.at_level(logging.WARNING, logger="shardstream.pack"):
        pack(tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=1, workers=8, part="0/1")
    assert pool_sizes == [min(3, 2 * usable_cores())]
    assert "8 workers asked for" in caplog.text


def test_the_console_script_notes_capped_workers(tmp_path):
    _jsonl(tmp_path / "c.jsonl", 20)
    run = subprocess.run(
        [console_script(), "pack", str(tmp_path / "c.jsonl"), str(tmp_path / "ds"), "--workers", "100000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert f"100,000 workers asked for, {2 * usable_cores()} used" in run.stderr


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        stat = _stat(entry)
        if stat is not None and int(stat[1]) == pid and stat[0] != b"Z":
            found.add(int(entry))
    return found


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped by whoever adopted it, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = _stat(pid)
    return stat is not None and stat[0] != b"Z"


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + _DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_a_killed_pack_takes_its_workers_with_it(tmp_path):
    fifo = tmp_path / "corpus.jsonl"
    os.mkfifo(fifo)  # the pack waits on it for more samples: it is mid-pack for as long as we like
    dest = tmp_path / "ds"
    command = [console_script(), "pack", str(fifo), str(dest), "--workers", "2", "--samples-per-shard", "1"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    writer = -1
    workers: set[int] = set()
    try:

        def started() -> bool:
            nonlocal writer, workers
            if writer < 0:
                try:  # without waiting: it opens once the pack opens the FIFO to read it
                    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as error:
                    if error.errno != errno.ENXIO:
                        raise
            workers = _children(proc.pid)
            return writer >= 0 and len(workers) >= 2 and proc.poll() is None

        _wait_for(started, "the pack to start 2 workers and read its source")
        os.set_blocking(writer, True)
        os.write(writer, b"".join(b'{"txt": "sample %d"}\n' % i for i in range(8)))
        _wait_for(lambda: any(dest.glob("shard-*.tar")), "a worker to write a shard")
        workers = _children(proc.pid)
        assert len(workers) == 2

        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=_DEADLINE) == -signal.SIGKILL
        _wait_for(lambda: not any(map(_alive, workers)), f"workers {sorted(workers)} to exit")
    finally:
        if writer >= 0:
            os.close(writer)
        for pid in workers:  # were the test to fail: no process of it outlives it
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_ORPHAN = """
import os, sys, time
from shardstream.pack import lifeline
if sys.argv[1] == "poll":
    lifeline._death_signal = lambda: False  # as where there is no prctl: the watch thread
parent = os.getpid()
ready_r, ready_w = os.pipe()
child = os.fork()
if child == 0:
    lifeline.die_with_parent(parent)
    os.write(ready_w, b"x")
    time.sleep(120)
    os._exit(0)
os.read(ready_r, 1)
print(child, flush=True)
os._exit(0)  # the parent dies; its child must follow
"""


@pytest.mark.parametrize("how", ["prctl", "poll"])
def test_a_worker_ends_when_its_parent_dies(tmp_path, how):
    run = subprocess.run([sys.executable, "-c", _ORPHAN, how], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    orphan = int(run.stdout)
    try:
        _wait_for(lambda: not _alive(orphan), f"process {orphan} to exit")
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_a_worker_whose_parent_died_before_it_started_ends_at_once():
    code = "from shardstream.pack.lifeline import die_with_parent; die_with_parent(1); print('survived')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout) == (1, "")
