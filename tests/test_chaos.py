"""Chaos: an epoch on 2 ranks x 2 workers through the fault proxy, crashed twice and resumed.

The first run loses a DataLoader worker (SIGKILL) and the second a whole rank, at steps
drawn from a seeded generator; each crash is resumed from the last checkpoint every rank
reached, as a training job restarted by its scheduler is. Every sample of the epoch must
come exactly once across the three runs, and the ranks must have taken equal steps.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys
import time

import pytest

from tests.faultproxy import FaultProxy
from tests.resume_harness import assert_exactly_once, write_dataset

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "chaos_worker.py"
SIZES = [17, 9, 22, 14, 6, 20]  # 88 samples: 44 a rank, no padding
BATCH = 4
RANKS = 2

pytestmark = [pytest.mark.slow, pytest.mark.s3]


def torchrun(url: str, out: pathlib.Path, env: dict, *, kill: str | None, resume: pathlib.Path | None) -> int:
    out.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
        str(WORKER), url, str(out), "--workers", "2", "--batch-size", str(BATCH),
    ]  # fmt: skip
    if kill is not None:
        command += ["--kill", kill]
    if resume is not None:
        command += ["--resume", str(resume)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    _wait_for_orphans(out)
    if kill is None:
        assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.returncode


def _wait_for_orphans(out: pathlib.Path) -> None:
    """DataLoader workers of a killed rank notice it within seconds; none may stay."""
    deadline = time.monotonic() + 30
    while True:
        left = [pid for pid in _pids_naming(str(out)) if pid != os.getpid()]
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of a crashed run still running: {left}")
        time.sleep(0.2)


def _pids_naming(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry))
    return found


def checkpoint(out: pathlib.Path) -> tuple[list[int], list[list[str]], pathlib.Path | None]:
    """The steps each rank logged, the keys each took up to the last step every rank
    reached, and the state after that step (None if no step was taken)."""
    logs = []
    for rank in range(RANKS):
        path = out / f"rank-{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        logs.append([json.loads(line) for line in lines if line.endswith("}")])
    step = min(len(log) for log in logs)
    keys = [[k for record in log[:step] for k in record["keys"]] for log in logs]
    logged = [len(log) for log in logs]
    if step == 0:
        return logged, keys, None
    states = [log[step - 1]["state"] for log in logs]
    assert all(s == states[0] for s in states), "ranks disagree on the state after the same steps"
    state = out / "checkpoint.json"
    state.write_text(json.dumps(states[0]))
    return logged, keys, state


def test_epoch_crashed_twice_through_faults_is_exactly_once(s3, moto_server, tmp_path):
    rng = random.Random(20261201)
    bucket = "chaos-epoch-fixed"  # fixed: the proxy's faults hang on request paths
    moto_server.create_bucket(bucket)
    url = f"s3://{bucket}/ds"
    keys = write_dataset(url, SIZES, storage_options=s3[1])
    taken: list[list[str]] = [[] for _ in range(RANKS)]
    with FaultProxy(
        moto_server.endpoint, seed=5, error_rate=0.1, reset_rate=0.05, truncate_rate=0.05
    ) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
        kills = [
            f"worker:{rng.randrange(RANKS)}:{rng.randint(3, 5)}",
            f"rank:{rng.randrange(RANKS)}:{rng.randint(2, 5)}",
        ]
        state = None
        history: list[tuple[str | None, int, list[int]]] = []  # (kill, exit status, steps of each rank)
        for run, kill in enumerate([*kills, None]):
            out = tmp_path / f"run-{run}"
            returncode = torchrun(url, out, env, kill=kill, resume=state)
            logged, run_keys, run_state = checkpoint(out)
            history.append((kill, returncode, logged))
            if kill is not None:
                assert returncode != 0, f"run {run} was to crash but exited 0: {history}"
            else:
                assert len(set(logged)) == 1, f"ranks took different numbers of steps: {history}"
            for rank in range(RANKS):
                taken[rank] += run_keys[rank]
            state = run_state or state
    assert all(min(logged) > 0 for _, _, logged in history), f"a run crashed before its first step: {history}"
    assert proxy.stats["error"] + proxy.stats["reset"] + proxy.stats["truncate"] > 0
    assert len({len(t) for t in taken}) == 1, "ranks took different numbers of samples"
    assert_exactly_once([k for t in taken for k in t], keys)
