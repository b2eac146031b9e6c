"""The README's training loop (tools/train_example.py), run as a user runs it: stopped
mid-epoch, then resumed from its checkpoint on another number of workers, and on another
number of ranks in both directions (one process, then torchrun with 2 ranks, then one
process again); every epoch sees every sample exactly once."""

from __future__ import annotations

import collections
import pathlib
import subprocess
import sys

import pytest

import shardstream

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUM_SAMPLES = 96  # divisible by every batch x rank layout below: no padding


def make_dataset(path: pathlib.Path) -> str:
    with shardstream.ShardWriter(str(path), format="tar", samples_per_shard=10) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s{i:04d}", "txt": f"sample {i} " * (i % 7 + 1)})
    return str(path)


def train(url: str, tmp: pathlib.Path, *extra: str, ranks: int = 0) -> str:
    """One run of the example: ``ranks=0`` a plain process, else torchrun with ``ranks``."""
    launch = [sys.executable]
    if ranks:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    command = [
        *launch, str(ROOT / "tools" / "train_example.py"), url,
        "--checkpoint", str(tmp / "ckpt.pt"), "--keys-log", str(tmp / "keys"),
        "--batch-size", "8", "--save-every", "1000", *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def seen_keys(tmp: pathlib.Path) -> dict[int, collections.Counter]:
    """What every rank trained on, by epoch (all ranks' logs together)."""
    per_epoch: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for log in sorted(tmp.glob("keys.rank*")):
        for line in log.read_text().splitlines():
            epoch, key = line.split()
            per_epoch[int(epoch)][key] += 1
    return per_epoch


def test_stop_and_resume_sees_every_sample_once(tmp_path):
    url = make_dataset(tmp_path / "data")
    first = train(url, tmp_path, "--workers", "2", "--stop-after-steps", "5")
    assert "stopping after 5 steps" in first
    second = train(url, tmp_path, "--workers", "2", "--stop-after-steps", "9")
    assert "resumed in epoch 0" in second
    third = train(url, tmp_path, "--workers", "1", "--epochs", "2")
    assert "resumed in epoch 1" in third
    assert "epoch 1 done" in third
    per_epoch = seen_keys(tmp_path)
    expected = collections.Counter(f"s{i:04d}" for i in range(NUM_SAMPLES))
    assert per_epoch[0] == expected
    assert per_epoch[1] == expected


@pytest.mark.slow
def test_resume_from_one_process_on_two_ranks_and_back(tmp_path):
    """A checkpoint of one process resumes under torchrun (DDP wraps the model there, and
    its keys gain ``module.``), and one of torchrun resumes in one process."""
    url = make_dataset(tmp_path / "data")
    first = train(url, tmp_path, "--workers", "1", "--stop-after-steps", "5")
    assert "stopping after 5 steps" in first
    second = train(url, tmp_path, "--workers", "1", "--stop-after-steps", "2", ranks=2)
    assert "rank 0: resumed in epoch 0" in second
    assert "rank 1: resumed in epoch 0" in second
    third = train(url, tmp_path, "--workers", "1", "--epochs", "1")
    assert "resumed in epoch 0" in third
    assert "epoch 0 done" in third
    per_epoch = seen_keys(tmp_path)
    assert (tmp_path / "keys.rank1").exists()
    assert per_epoch[0] == collections.Counter(f"s{i:04d}" for i in range(NUM_SAMPLES))


def test_a_checkpoint_saved_under_ddp_loads_in_one_process():
    sys.path.insert(0, str(ROOT / "tools"))
    import torch
    from train_example import unwrapped

    bare = torch.nn.Linear(4, 1)
    wrapped = {f"module.{name}": value for name, value in bare.state_dict().items()}
    assert unwrapped(wrapped).keys() == bare.state_dict().keys()
    assert unwrapped(bare.state_dict()).keys() == bare.state_dict().keys()
