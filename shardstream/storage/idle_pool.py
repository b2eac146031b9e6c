"""``IdlePool``: a thread pool whose threads end once they have waited a while for work.

# NOTE [ Threads that linger ]
# Starting a thread makes its starter wait until the new thread runs, and on a loaded
# machine that is a wait for the GIL behind every thread already reading: a batch of reads
# whose pool starts a thread per read sends its last GET that many waits after its first,
# and a pool ended after each batch starts them all again for the next. A pool kept while
# the process lives would hold its threads where nothing is read any more (a DataLoader
# worker between epochs, a test that made a dataset). So the threads of an ``IdlePool``
# wait ``idle`` seconds for more work, then end: batches that follow each other find them
# waiting, and none is left soon after the reads stop. The pool grows to the work in
# flight, ``threads`` at most, one thread at a time and only where no thread waits. At
# interpreter exit the waiting threads are told to end at once
# (``lifecycle.before_threads_join``), so exit never waits out ``idle``.
"""

from __future__ import annotations

import functools
import itertools
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from shardstream.errors import UsageError
from shardstream.lifecycle import before_threads_join

__all__ = ["IdlePool"]

P = ParamSpec("P")
T = TypeVar("T")
_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class IdlePool(Executor):
    """Up to ``threads`` threads named ``name``, each ending after ``idle`` seconds without
    work (NOTE [ Threads that linger ]); ``shutdown`` ends them all."""

    def __init__(self, threads: int, idle: float, name: str = "shardstream-idle") -> None:
        if threads < 1 or idle <= 0:
            raise UsageError(
                f"an idle pool needs at least 1 thread and a positive idle time, not {threads}, {idle}"
            )
        self.threads, self.idle, self.name = threads, idle, name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: set[threading.Thread] = set()
        # threads waiting for work less work queued: below zero, work waits for a thread
        self._free = 0
        self._closed = False
        self._numbers = itertools.count()
        before_threads_join(functools.partial(_shut, weakref.ref(self)))

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """``fn(*args, **kwargs)`` in a thread of the pool: a waiting one, else a new one."""
        future: Future[T] = Future()
        start = None
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: cannot submit work to a pool that is shut down")
            self._work.put((future, fn, args, kwargs))
            self._free -= 1
            if self._free < 0 and len(self._running) < self.threads:
                start = threading.Thread(target=self._serve, name=f"{self.name}_{next(self._numbers)}")
                self._running.add(start)
                self._free += 1
        if start is not None:
            try:
                start.start()
            except BaseException:
                with self._lock:
                    self._running.discard(start)
                    self._free -= 1
                raise
        return future

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                work = self._work.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    if self._work.empty():  # else work came in meanwhile: take it
                        self._running.discard(me)
                        self._free -= 1
                        return
                continue
            if work is None:  # shut down
                with self._lock:
                    self._running.discard(me)
                return
            _run(*work)
            del work  # its arguments and result are not held while this thread waits
            with self._lock:
                self._free += 1

    @property
    def running(self) -> int:
        """Threads alive in the pool now."""
        with self._lock:
            return len(self._running)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """End every thread once the work before it is done (``cancel_futures``: work not
        begun is cancelled); with ``wait``, join them."""
        with self._lock:
            self._closed = True
            threads = list(self._running)
        if cancel_futures:
            while True:
                try:
                    work = self._work.get_nowait()
                except queue.Empty:
                    break
                if work is not None:
                    work[0].cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()


def _run(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as error:
        future.set_exception(error)
    else:
        future.set_result(result)


def _shut(pool: weakref.ref[IdlePool]) -> None:
    """At exit: a pool still alive lets its threads go now (NOTE [ Threads that linger ])."""
    alive = pool()
    if alive is not None:
        alive.shutdown(wait=False, cancel_futures=True)
