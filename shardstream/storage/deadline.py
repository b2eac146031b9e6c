"""A read's deadline, enforced on response bodies too (NOTE [ Deadlines on bodies ]).

# NOTE [ Deadlines on bodies ]
# A client's read timeout bounds each receive on a socket, not a body: an endpoint that
# sends one byte a second never lets a receive time out, and http.client fills a buffer
# receive by receive, so one ``readinto`` of a MiB waited for days and a read promising
# to fail within ``RetryPolicy.timeout`` hung. So ``call_with_retry`` runs each try in a
# scope (``enter``/``leave``) holding the read's deadline (its start plus ``RetryPolicy.budget``: the
# timeout, or longer for a long range where a ``min_rate`` is set), and the S3 reader
# reads every body ``reading`` that scope with a way to cut the body off (urllib3's
# ``shutdown`` of its socket, which wakes a blocked receive). One watchdog thread per
# process cuts what is still being read at its deadline; the read then fails as a
# ``BodyDeadline`` (a ``TimeoutError``, so its message names the bounds) and no new try
# starts. A scope costs a thread-local write per try; only a try that reads a body
# registers with the watchdog, which exits when it has had nothing to watch for a while
# and is made again (in a fork child too) when needed.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator

from shardstream.lifecycle import PerProcess

__all__ = ["BodyDeadline", "enter", "leave", "reading"]

_clock = time.monotonic
_IDLE_EXIT = 5.0  # seconds the watchdog waits with nothing to watch before it exits
_PRUNE_FROM = 256  # entries in the watchdog's heap before finished ones are dropped


class BodyDeadline(TimeoutError):
    """A body still arriving when its read's deadline passed."""


class _Scope:
    """One try of a read: its deadline, and the cut of the body it reads now, if any."""

    __slots__ = ("cut", "deadline", "finished", "fired", "lock", "watched", "what")

    def __init__(self, deadline: float, what: Callable[[], str]) -> None:
        self.deadline, self.what = deadline, what
        self.cut: Callable[[], object] | None = None
        self.fired = False
        self.watched = False
        self.finished = False
        self.lock = threading.Lock()

    def expire(self) -> None:
        with self.lock:
            self.fired = True
            cut = self.cut
        if cut is not None:
            with contextlib.suppress(Exception):  # a body closed meanwhile: nothing to cut
                cut()

    def error(self) -> BodyDeadline:
        return BodyDeadline(f"timed out: the body was still arriving at the read's deadline ({self.what()})")


class _Watchdog:
    """Expires scopes at their deadlines, in one daemon thread made when first needed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Scope]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._live = 0  # scopes watched and not finished

    def watch(self, scope: _Scope) -> None:
        with self._cond:
            self._live += 1
            if len(self._heap) > _PRUNE_FROM and len(self._heap) > 4 * self._live:
                # finished tries wait in the heap for their deadlines: drop them, so many
                # short reads a second do not keep a deadline's worth of them
                self._heap = [entry for entry in self._heap if not entry[2].finished]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, (scope.deadline, next(self._order), scope))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shardstream-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def finish(self, scope: _Scope) -> None:
        with self._cond:
            scope.finished = True
            self._live -= 1

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._due()
                if due is None:
                    self._thread = None
                    return
            for scope in due:
                if not scope.finished:
                    scope.expire()

    def _due(self) -> list[_Scope] | None:
        """The scopes past their deadline, waiting for the first; None after an idle spell."""
        while True:
            now = _clock()
            due = []
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap)[2])
            if due:
                return due
            if not self._heap:
                if not self._cond.wait(_IDLE_EXIT) and not self._heap:
                    return None
                continue
            self._cond.wait(self._heap[0][0] - now)


# made anew in a fork child, whose parent's thread is not there (NOTE [ Per-process state ])
_watchdog = PerProcess(_Watchdog)
_local = threading.local()


def enter(deadline: float | None, what: Callable[[], str]) -> _Scope | None:
    """Begin one try with ``deadline`` (a ``time.monotonic`` time; None: none) on the
    bodies it reads in this thread; ``what()`` says what bounded it, for the error. Give
    what this returns to ``leave`` when the try ends. (Not a context manager: every
    storage call's try pays for this, a local read's too.)"""
    previous: _Scope | None = getattr(_local, "scope", None)
    _local.scope = None if deadline is None else _Scope(deadline, what)
    return previous


def leave(previous: _Scope | None) -> None:
    """End the try begun by the ``enter`` that returned ``previous``."""
    current: _Scope | None = _local.scope
    _local.scope = previous
    if current is not None and current.watched:
        _watchdog.get().finish(current)


@contextlib.contextmanager
def reading(cut: Callable[[], object] | None) -> Iterator[None]:
    """Read (part of) a body, which ``cut`` cuts off, under this thread's scope: past its
    deadline the read raises ``BodyDeadline`` (NOTE [ Deadlines on bodies ])."""
    current: _Scope | None = getattr(_local, "scope", None)
    if current is None or cut is None:
        yield
        return
    if current.fired or _clock() >= current.deadline:
        raise current.error()
    if not current.watched:
        current.watched = True
        _watchdog.get().watch(current)
    with current.lock:
        current.cut = cut
    try:
        yield
    except Exception as error:
        if current.fired:
            raise current.error() from error
        raise
    finally:
        with current.lock:
            current.cut = None
    if current.fired:  # cut just as it ended: the bytes may be short
        raise current.error()
