"""Shared fixtures: S3 servers on 127.0.0.1 and a leak check for every test.

S3 tests talk real HTTP to moto's server, started once per session on a free port
(port 0) and reset between tests; ``seaweedfs`` (see shardstream/testing.py) is a real
S3 server in Go for end-to-end checks.
"""

from __future__ import annotations

import multiprocessing.util
import os
import tempfile
import threading
import urllib.request
import uuid

import pytest

from shardstream.testing import MotoServer, SeaweedFS

# Each test session gets a private temp dir, so the leak check below sees only what this
# session made (other sessions on the machine make shardstream-* temp files too), and
# subprocesses (the CLI, torchrun) inherit it through TMPDIR.
os.environ.setdefault("SHARDSTREAM_MACHINE_TMP", tempfile.gettempdir())
# multiprocessing removes its own temp dir at exit, after pytest_unconfigure: make it now,
# outside the session dir, so that removing the session dir does not pull it away.
multiprocessing.util.get_temp_dir()
_SESSION_TMP = tempfile.mkdtemp(prefix="sstest-")
os.environ["TMPDIR"] = _SESSION_TMP
tempfile.tempdir = _SESSION_TMP


def pytest_unconfigure(config):
    import shutil

    shutil.rmtree(_SESSION_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def moto_server():
    """A moto S3 server on 127.0.0.1 for the whole session; yields its endpoint URL."""
    server = MotoServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(moto_server, monkeypatch):
    """A fresh, empty bucket on the moto server.

    Yields ``(base_url, storage_options)`` with ``base_url`` like ``s3://bucket-1a2b``;
    ``AWS_*`` variables point at the server, so subprocesses (torchrun, the CLI) reach it
    with no options.
    """
    urllib.request.urlopen(
        urllib.request.Request(moto_server.endpoint + "/moto-api/reset", method="POST")
    ).read()
    for name, value in moto_server.env().items():
        monkeypatch.setenv(name, value)
    bucket = "bucket-" + uuid.uuid4().hex[:8]
    moto_server.create_bucket(bucket)
    return f"s3://{bucket}", moto_server.storage_options()


@pytest.fixture
def seaweedfs():
    """A SeaweedFS S3 server (``weed mini``) for one test; yields the server.

    Only one runs per machine at a time (fixed internal ports; see shardstream/testing.py),
    so starting it may wait for another test to finish with it. One per test, not per
    session: under pytest-xdist (the test command's ``-n 2``) a session-wide server would
    make the other worker's SeaweedFS tests wait out this worker's whole session, and a
    start and stop take a few seconds. Tests make
    their own bucket with ``seaweedfs.create_bucket`` and pass
    ``seaweedfs.storage_options()``.
    """
    server = SeaweedFS()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _child_pids() -> set[int]:
    pids = set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != b"Z":
            pids.add(int(entry))
    return pids


# The node's folder of manifest and first-sidecar copies is kept on purpose, as a cache is
# (NOTE [ One manifest read per job ] in dataset/startup.py): the ranks of a node share it
# across datasets and runs, and it goes with the session's temp dir. What it holds is
# checked by tests/test_start_storm*.py and test_start_sidecars_node.py.
_NODE_FOLDER = "shardstream-start-"


def _temp_entries() -> set[str]:
    return {
        e
        for e in os.listdir(tempfile.gettempdir())
        if e.startswith("shardstream") and not e.startswith(_NODE_FOLDER)
    }


def _multiprocessing_helpers() -> set[int]:
    """multiprocessing's resource tracker and forkserver: one per session, started on first use.

    The first ``spawn`` or ``forkserver`` start (a DataLoader worker, a test's child)
    starts them; they serve every later start and exit with the session, so they are
    not leaks of the test that happened to start them first.
    """
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    pids = {
        getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
        getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
    }
    return {pid for pid in pids if pid}


@pytest.fixture(autouse=True)
def _fresh_link_answers(monkeypatch):
    """Each test starts with no small GET's answer on record (NOTE [ A link's latency before
    its reads ] in storage/cuts.py): another test's, on a loaded machine, must not make
    this one's first long reads skip their probe."""
    from shardstream.storage import s3read

    monkeypatch.setattr(s3read, "_ANSWERS", {})


@pytest.fixture(autouse=True)
def _no_leaks(request):
    """Fail a test that leaves a thread, a child process or a shardstream temp file behind."""
    threads_before = set(threading.enumerate())
    children_before = _child_pids()
    temps_before = _temp_entries()
    yield
    deadline_threads = [
        t for t in threading.enumerate() if t not in threads_before and t.is_alive() and not t.daemon
    ]
    for t in deadline_threads:
        t.join(timeout=5)
    leaked_threads = [t.name for t in deadline_threads if t.is_alive()]
    leaked_children = _child_pids() - children_before - _multiprocessing_helpers()
    leaked_temps = _temp_entries() - temps_before
    problems = []
    if leaked_threads:
        problems.append(f"threads {leaked_threads}")
    if leaked_children:
        problems.append(f"child processes {sorted(leaked_children)}")
    if leaked_temps:
        problems.append(f"temp files {sorted(leaked_temps)}")
    if problems:
        pytest.fail("test leaked " + ", ".join(problems), pytrace=False)
