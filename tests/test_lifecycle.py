"""shardstream.lifecycle: per-process state, fork hooks, exit hooks, and the one place that
uses CPython's private APIs (NOTE [ Per-process state ], NOTE [ Exit hooks ])."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap
import threading

import pytest

from shardstream import lifecycle
from shardstream.lifecycle import PerProcess

PACKAGE = pathlib.Path(lifecycle.__file__).parent
fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def test_the_private_apis_it_relies_on_are_there():
    # Fails on a Python that dropped one: then an exit can hang on an abandoned fetch
    # (threading._register_atexit) or s3fs's finalizers stall a fork child
    # (weakref.finalize._registry); find another way before supporting that Python.
    assert lifecycle.private_apis() == dict.fromkeys(lifecycle.PRIVATE_APIS, True)


def test_no_other_module_touches_those_private_apis_nor_registers_fork_hooks():
    names = {api.rsplit(".", 1)[1] for api in lifecycle.PRIVATE_APIS} | {"register_at_fork"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if where == "lifecycle.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            named = node.attr if isinstance(node, ast.Attribute) else getattr(node, "value", None)
            if named in names:
                found.append(f"{where}:{node.lineno} {named}")
    assert not found, found


def test_a_value_is_made_once_per_process(monkeypatch):
    made = []
    value = PerProcess(lambda: made.append(1) or object())
    assert value.peek() is None
    first = value.get()
    assert value.get() is first
    assert value.peek() is first
    assert len(made) == 1
    child = os.getpid() + 1
    monkeypatch.setattr(os, "getpid", lambda: child)  # as a fork child sees it
    assert value.peek() is None
    assert value.get() is not first
    assert len(made) == 2


def test_a_parents_value_is_abandoned_never_returned_to_close(monkeypatch):
    abandoned = []
    value = PerProcess(object, abandon=abandoned.append)
    parents = value.get()
    child = os.getpid() + 1
    monkeypatch.setattr(os, "getpid", lambda: child)
    assert value.clear() is None  # the caller closes only what its process made
    assert abandoned == [parents]
    mine = value.get()
    assert value.clear() is mine
    assert value.peek() is None


def test_threads_make_one_value():
    made = []
    barrier = threading.Barrier(8)
    value = PerProcess(lambda: made.append(1) or object())

    def get():
        barrier.wait()
        return value.get()

    threads = [threading.Thread(target=get) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1


@fork_only
def test_fork_hooks_run_in_the_child_and_per_process_values_are_remade(monkeypatch):
    monkeypatch.setattr(
        lifecycle, "_AFTER_FORK", [*lifecycle._AFTER_FORK]
    )  # this test's hook is dropped after it
    ran = []
    lifecycle.after_fork_in_child(lambda: ran.append(os.getpid()))
    value = PerProcess(threading.Lock)
    lock = value.get()
    lock.acquire()  # held at the fork, as another thread's would be
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child reports through the pipe)
        ok = ran == [os.getpid()] and value.get() is not lock and value.get().acquire(timeout=1)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(child, 0)
        lock.release()
    assert ran == []  # not in the parent


def test_an_exit_hook_runs_before_the_threads_are_joined():
    # A pool thread waits for an event only the hook sets: without the hook the exit hangs.
    script = textwrap.dedent(
        """
        import threading
        from concurrent.futures import ThreadPoolExecutor
        from shardstream import lifecycle
        stop = threading.Event()
        assert lifecycle.before_threads_join(stop.set)
        ThreadPoolExecutor(1).submit(stop.wait)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_the_inherited_heap_is_frozen_once_per_process(monkeypatch):
    import gc

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))
    monkeypatch.setattr(lifecycle, "_FROZEN_IN", -1)
    lifecycle.freeze_inherited_heap()
    lifecycle.freeze_inherited_heap()
    assert frozen == [1]
