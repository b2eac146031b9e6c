"""tools/pretrain_example.py, as docs/tokens.md runs it: a token dataset packed with a BPE
trained here, a few steps in one process, then resumed from its checkpoint under torchrun
on 2 ranks and back on one: the steps go on where they stopped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shardstream.pack import pack
from tests.tokens_helpers import texts, train_tokenizer

pytestmark = pytest.mark.slow

EXAMPLE = ["tools/pretrain_example.py"]


def run(arguments, *, ranks=None):
    launcher = [sys.executable]
    if ranks is not None:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    done = subprocess.run(launcher + EXAMPLE + arguments, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return [line.split() for line in done.stdout.splitlines() if line.startswith("step ")]


def test_the_pretraining_example_trains_and_resumes_on_2_ranks_and_back(tmp_path):
    tokenizer = train_tokenizer(tmp_path)
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(200, seed=2)))
    url = str(tmp_path / "ds")
    pack(str(source), url, format="tokens", tokenizer=str(tokenizer), text_field="text", samples_per_shard=50)
    checkpoint = str(tmp_path / "ckpt.pt")
    common = [url, "--seq-len", "32", "--global-batch-size", "4", "--checkpoint", checkpoint]
    first = run([*common, "--steps", "3"])
    second = run([*common, "--steps", "5"], ranks=2)
    third = run([*common, "--steps", "7"])
    assert [int(line[1]) for line in first + second + third] == list(range(1, 8))
    assert all(float(line[3]) > 0 for line in first + second + third)
