"""tools/bench_pack.py runs end to end (--quick sizes); it reports, it asserts no timing."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parent.parent / "tools" / "bench_pack.py"


@pytest.mark.slow
def test_bench_pack_quick_smoke_run():
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-litdata"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for line in (
        "shardstream.ShardWriter",
        "ratio shardstream / webdataset.ShardWriter:",
        "overhead per sample, shardstream / webdataset.ShardWriter:",
        "litdata.optimize         skipped (--no-litdata)",
        "speedup --workers 2 over --workers 1:",
        "target 1 MB samples within 1.25x of tar:",
    ):
        assert line in out, out
