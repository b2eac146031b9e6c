"""Chaos: an epoch on 2 ranks x 2 workers through the fault proxy, crashed twice and resumed.

The first run loses a DataLoader worker (SIGKILL) and the second a whole rank, at steps
drawn from a seeded generator; each crash is resumed from the last checkpoint every rank
reached, as a training job restarted by its scheduler is. Every sample of the epoch must
come exactly once across the three runs, and the ranks must have taken equal steps.

A fleet of readers shares one cache directory under a cache_limit smaller than two
shards, through the fault proxy, while the test evicts entries and swaps others for
corrupt copies: every reader gets every sample of every epoch, exact, and none dies.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import threading
import time

import pytest

from tests.chaos_worker import fleet_payload
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


# -- a fleet of readers sharing one cache -----------------------------------------------------

FLEET = 3  # reader processes
FLEET_SHARDS = 6
FLEET_PER_SHARD = 40  # of ~3.7 KB each: ~150 KB shards, several check blocks each


class CacheChaos:
    """Evicts cache entries and swaps others for corrupt copies of the same size, as
    another process's eviction and a damaged disk would, until stopped. An entry is
    corrupted once: a reader heals an entry once (NOTE [ Healing the cache ]), and a
    disk that damages the same file again right after it was filled anew is not the
    damage that rule is for."""

    def __init__(self, cache: pathlib.Path, seed: int) -> None:
        self.cache, self.rng = cache, random.Random(seed)
        self.done = threading.Event()
        self.evicted = self.corrupted = 0
        self._damaged: set[str] = set()  # entries corrupted once
        self.thread = threading.Thread(target=self._run, name="cache-chaos")

    def __enter__(self) -> CacheChaos:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.done.wait(self.rng.uniform(0.01, 0.05)):
            entries = sorted(p for p in self.cache.glob("sscache-*") if "." not in p.name)
            if not entries:
                continue
            victim = self.rng.choice(entries)
            try:
                if self.rng.random() < 0.5:
                    victim.unlink()
                    self.evicted += 1
                    continue
                # a corrupt copy renamed over it: readers that mapped the entry keep its bytes
                if victim.name in self._damaged:
                    continue
                data = bytearray(victim.read_bytes())
                if len(data) < 1024:  # a sidecar's entry: leave it
                    continue
                self._damaged.add(victim.name)
                data[self.rng.randrange(512, len(data))] ^= 0x5A
                spare = victim.with_name(f".chaos-{victim.name}")
                spare.write_bytes(bytes(data))
                os.replace(spare, victim)
                self.corrupted += 1
            except FileNotFoundError:
                continue  # evicted by a reader meanwhile


def test_a_cache_fleet_under_eviction_and_corruption_reads_every_sample_exactly(s3, moto_server, tmp_path):
    import shardstream

    bucket = "chaos-fleet-fixed"  # fixed: the proxy's faults hang on request paths
    moto_server.create_bucket(bucket)
    url = f"s3://{bucket}/ds"
    keys = [f"f{shard:02d}-{i:03d}" for shard in range(FLEET_SHARDS) for i in range(FLEET_PER_SHARD)]
    with shardstream.ShardWriter(url, samples_per_shard=FLEET_PER_SHARD, storage_options=s3[1]) as writer:
        for key in keys:
            writer.write({"__key__": key, "bin": fleet_payload(key)})
    shard_bytes = shardstream.storage.Storage(url, s3[1]).read_manifest().shards[0].bytes
    cache = tmp_path / "cache"
    cache.mkdir()
    with FaultProxy(
        moto_server.endpoint, seed=9, error_rate=0.05, reset_rate=0.03, truncate_rate=0.03
    ) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
        outs = [tmp_path / f"reader-{n}" for n in range(FLEET)]
        limit = str(int(shard_bytes * 1.5))  # under two shards: every reader evicts the others' entries
        with CacheChaos(cache, seed=11) as chaos:
            readers = []
            for out in outs:
                out.mkdir()
                command = [
                    sys.executable,
                    str(WORKER),
                    "fleet",
                    url,
                    str(out),
                    str(cache),
                    "--cache-limit",
                    limit,
                ]
                readers.append(
                    subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
                )
            errors = [reader.communicate(timeout=240)[1] for reader in readers]
    codes = [reader.returncode for reader in readers]
    assert codes == [0] * FLEET, f"readers exited {codes}:\n" + "\n".join(e[-3000:] for e in errors)
    for out in outs:
        for epoch in range(3):
            assert_exactly_once(json.loads((out / f"epoch-{epoch}.json").read_text()), keys)
    assert chaos.evicted > 0
    assert chaos.corrupted > 0
    healed = sum(e.count("fetched again from storage") for e in errors)
    print(f"evicted {chaos.evicted}, corrupted {chaos.corrupted}, healed {healed}, faults {proxy.faults()}")
    shutil.rmtree(cache)
