"""Process lifecycle: what each process makes for itself, and what runs at fork and at exit.

# NOTE [ Per-process state ]
# A DataLoader worker started by fork inherits every object of its parent, but not its
# threads, and a lock another thread held at the fork stays held in the child forever.
# So whatever holds threads, connections or locks is made lazily by the process that
# uses it and made anew in a fork child: an object's through ``PerProcess`` (or, where
# its fields must stay as they are, by comparing the pid it was made in with ``this_process()``),
# a module's through a hook run in the child right after the fork
# (``after_fork_in_child``). What the parent made is dropped, or kept unused where
# closing it would touch what the parent still owns (``abandon``). This module is the
# one place that registers with ``os.register_at_fork`` and the one that touches
# CPython's private APIs (``PRIVATE_APIS``): each is looked up where it is used, so a
# Python without it degrades as documented below, and tests/test_lifecycle.py fails on it.
#
# NOTE [ Exit hooks ]
# A thread waiting for something nobody will give (a fetch waiting for room in a read
# budget whose iterator was abandoned) would hang the interpreter at exit, which joins
# the threads of ``concurrent.futures`` before ``atexit`` runs. ``before_threads_join``
# registers a hook that runs before that join: ``threading``'s own exit hooks run newest
# first, and ``concurrent.futures.thread`` registers its hook when imported, which this
# module does first. Without ``threading._register_atexit`` (a Python that dropped it),
# the hook is not registered and such an exit waits as it would without shardstream.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook first: ours run before it)
import gc
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# The private CPython APIs this module uses, as ``module.name``: nowhere else may.
PRIVATE_APIS = ("threading._register_atexit", "weakref.finalize._registry")


def this_process() -> int:
    """This process's id: what per-process state is checked against (NOTE [ Per-process state ])."""
    return os.getpid()


class PerProcess(Generic[T]):
    """A value made by ``make()`` on first use in each process (NOTE [ Per-process
    state ]); a fork child makes its own, and the parent's goes to ``abandon`` (default:
    dropped) when the child first asks. Thread-safe: one ``make`` per process."""

    __slots__ = ("_abandon", "_guard", "_guard_pid", "_make", "_pid", "_value")

    def __init__(self, make: Callable[[], T], *, abandon: Callable[[T], None] | None = None) -> None:
        self._make, self._abandon = make, abandon
        self._value: T | None = None
        self._pid = -1
        self._guard = threading.Lock()
        self._guard_pid = os.getpid()

    def get(self) -> T:
        """This process's value, made now if it has none."""
        here = os.getpid()
        if self._pid == here:
            return self._value  # type: ignore[return-value]
        with self._lock(here):
            if self._pid != here:
                self._drop_parents(here)
                self._value = self._make()
                self._pid = here  # published last: a thread that sees it sees the value
        return self._value  # type: ignore[return-value]

    def peek(self) -> T | None:
        """This process's value, or None where it has made none."""
        if self._pid == -1:  # none made (no pid to ask for: this runs at exit too)
            return None
        return self._value if self._pid == os.getpid() else None

    def clear(self) -> T | None:
        """Forget the value: this process's is returned (the caller closes it), a parent's
        goes to ``abandon``; the next ``get`` makes a new one."""
        if self._pid == -1:
            return None
        here = os.getpid()
        with self._lock(here):
            if self._pid != here:
                self._drop_parents(here)
                return None
            value, self._value, self._pid = self._value, None, -1
        return value

    def _drop_parents(self, here: int) -> None:
        value, self._value = self._value, None
        if value is not None and self._pid not in (-1, here) and self._abandon is not None:
            self._abandon(value)
        self._pid = -1

    def _lock(self, here: int) -> threading.Lock:
        if self._guard_pid != here:  # a fork child: the parent's lock may be held forever
            self._guard, self._guard_pid = threading.Lock(), here
        return self._guard


# -- fork ------------------------------------------------------------------------------

_AFTER_FORK: list[Callable[[], None]] = []  # run in a fork child, in the order registered


def after_fork_in_child(hook: Callable[[], None]) -> None:
    """Run ``hook()`` in every process forked from this one, right after the fork."""
    _AFTER_FORK.append(hook)


def _run_after_fork() -> None:
    for hook in list(_AFTER_FORK):
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_run_after_fork)


_FROZEN_IN = -1  # the pid of the process that froze its inherited heap


def freeze_inherited_heap() -> None:
    """Move the objects this process holds now out of its garbage collector's reach,
    once per process (``gc.freeze``: in a forked worker, what it inherited)."""
    global _FROZEN_IN
    here = os.getpid()
    if here != _FROZEN_IN:
        _FROZEN_IN = here
        gc.freeze()


# -- private CPython APIs ----------------------------------------------------------------


def private_apis() -> dict[str, bool]:
    """Whether each of ``PRIVATE_APIS`` is there in this Python."""
    return {
        "threading._register_atexit": callable(getattr(threading, "_register_atexit", None)),
        "weakref.finalize._registry": isinstance(getattr(weakref.finalize, "_registry", None), dict),
    }


def before_threads_join(hook: Callable[[], None]) -> bool:
    """Run ``hook()`` at interpreter exit before the threads of ``concurrent.futures``
    are joined (NOTE [ Exit hooks ]); False where this Python cannot."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return False
    register(hook)
    return True


def live_finalizers() -> Iterator[tuple[weakref.finalize, Any]]:
    """``(finalizer, info)`` of every ``weakref.finalize`` still alive in this process
    (``info`` has ``func`` and ``args``); none where this Python hides them."""
    registry: dict[Any, Any] = getattr(weakref.finalize, "_registry", {})
    return iter(list(registry.items()))
