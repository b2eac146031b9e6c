"""The README's main job (tools/demo.py), run as a user runs it: pack the standard
library to a loopback S3 server, inspect, verify, stream with torchrun (2 ranks x 2
workers) and check every sample exactly once."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_demo_packs_and_streams_exactly_once():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "demo.py"), "--epochs", "2"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "verify: " in done.stdout
    assert done.stdout.count(": exactly once") == 2
    assert "epochs 0 and 1 came in different orders" in done.stdout
    assert done.stdout.rstrip().endswith("demo: OK")


def test_local_s3_tool_serves_a_bucket():
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tools" / "local_s3.py"), "--bucket", "dev"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        exports = {}
        for line in server.stdout:
            if line.startswith("#"):
                break
            name, value = line.removeprefix("export ").strip().split("=", 1)
            exports[name] = value
        import s3fs

        fs = s3fs.S3FileSystem(
            endpoint_url=exports["AWS_ENDPOINT_URL"],
            key=exports["AWS_ACCESS_KEY_ID"],
            secret=exports["AWS_SECRET_ACCESS_KEY"],
            skip_instance_cache=True,
        )
        assert exports["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        assert "dev" in [path.rstrip("/") for path in fs.ls("")]
    finally:
        server.terminate()
        server.wait(timeout=30)
