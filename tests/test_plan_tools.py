"""The plan's benchmark tools run (small sizes) and report what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def run_tool(name: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / name), "--quick"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return out.stdout


def test_bench_plan_quick():
    text = run_tool("bench_plan.py")
    assert "first 1000 samples at N=1e+07" in text
    assert "torch DistributedSampler" in text
    assert "M samples/s" in text
    assert "order=global (global batch" in text
    assert "run length per request: order=local" in text


def test_shuffle_quality_quick_runs_real_webdataset():
    text = run_tool("shuffle_quality.py")
    rows = {line[:42].strip(): line[42:] for line in text.splitlines()}
    assert "perfect global shuffle" in rows
    assert "shardstream, window 4 shards" in rows
    assert "shardstream global order, window 4 shards" in rows
    assert "webdataset shardshuffle + shuffle(1000)" in rows
    assert "(1.00x)" in rows["perfect global shuffle"]


def test_bench_compare_pairs_a_target_line_whatever_its_verdict():
    """A round that met a target and one that missed it print the same figure: the
    comparison keeps the line (it used to drop it, as if the benchmark no longer printed it)."""
    from tools import bench_compare

    met = bench_compare.figures("  cache / uncached = 0.97x; target >= 0.95x: met\n")
    missed = bench_compare.figures("  cache / uncached = 0.93x; target >= 0.95x: MISSED\n")
    assert met.keys() == missed.keys()
    assert [met[key] for key in met] == [0.97, 0.95]
    assert [missed[key] for key in missed] == [0.93, 0.95]


def test_bench_memory_runs_an_epoch_with_each_revision_and_prints_the_target():
    # HEAD in a temp git worktree against the working tree: each child imports its own tree
    command = [sys.executable, str(ROOT / "tools" / "bench_memory.py"), "HEAD", "--head", "."]
    out = subprocess.run(
        [*command, "--rounds", "1", "--samples", "3"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert "RSS growth in one epoch of 3 x 1 MB on loopback moto" in out
    assert "  base HEAD: +" in out
    assert "  head .: +" in out
    assert "memory: head grows" in out
    assert "target <= +64 MB" in out
    assert "rate: head / base = " in out


def test_bench_stream_order_topology_refuses_ranks_that_do_not_divide_its_batches():
    import argparse

    from tools import bench_stream

    assert bench_stream.order_topology("8x4") == (8, 4)
    assert bench_stream.order_topology("1X0") == (1, 0)
    for wrong in ("8", "x4", "8x", "-2x2", "0x2", "3x2", "32x8"):  # 32 ranks: not 8's
        with pytest.raises(argparse.ArgumentTypeError):
            bench_stream.order_topology(wrong)


def test_bench_stream_refuses_an_order_window_of_no_shards(monkeypatch, capsys):
    from tools import bench_stream

    monkeypatch.setattr(sys, "argv", ["bench_stream.py", "--only", "order", "--order-window", "0"])
    with pytest.raises(SystemExit) as exited:
        bench_stream.main()
    assert exited.value.code == 2
    assert "--order-window must be at least 1 shard" in capsys.readouterr().err
