"""The README's training loop (tools/train_example.py), run as a user runs it: stopped
mid-epoch, then resumed from its checkpoint, first on the same and then on another
number of workers; every epoch sees every sample exactly once."""

from __future__ import annotations

import collections
import pathlib
import subprocess
import sys

import shardstream

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUM_SAMPLES = 96  # divisible by every batch x rank layout below: no padding


def make_dataset(path: pathlib.Path) -> str:
    with shardstream.ShardWriter(str(path), format="tar", samples_per_shard=10) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s{i:04d}", "txt": f"sample {i} " * (i % 7 + 1)})
    return str(path)


def train(url: str, tmp: pathlib.Path, *extra: str) -> str:
    command = [
        sys.executable, str(ROOT / "tools" / "train_example.py"), url,
        "--checkpoint", str(tmp / "ckpt.pt"), "--keys-log", str(tmp / "keys"),
        "--batch-size", "8", "--save-every", "1000", *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return done.stdout


def seen_keys(tmp: pathlib.Path) -> dict[int, collections.Counter]:
    per_epoch: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in (tmp / "keys.rank0").read_text().splitlines():
        epoch, key = line.split()
        per_epoch[int(epoch)][key] += 1
    return per_epoch


def test_stop_and_resume_sees_every_sample_once(tmp_path):
    url = make_dataset(tmp_path / "data")
    first = train(url, tmp_path, "--workers", "2", "--stop-after-steps", "5")
    assert "stopping after 5 steps" in first
    second = train(url, tmp_path, "--workers", "2", "--stop-after-steps", "9")
    assert "resumed in epoch 0" in second
    third = train(url, tmp_path, "--workers", "3", "--epochs", "2")
    assert "resumed in epoch 1" in third
    assert "epoch 1 done" in third
    per_epoch = seen_keys(tmp_path)
    expected = collections.Counter(f"s{i:04d}" for i in range(NUM_SAMPLES))
    assert per_epoch[0] == expected
    assert per_epoch[1] == expected
