"""``ReadPool``: the threads of long reads, and what a pool measured of its link.

The pool's threads read the parts of long reads (NOTE [ Reads in parts ] in cuts.py).
They are made on first use by the process that uses them, never reused by a fork child
(its threads did not fork), so a Storage or a dataset made before ``fork`` works after
it. The pool also keeps, per process, its long reads' GETs in flight, their rates, and
the latency and rate of its last GETs, by which cuts.py decides where to cut.
"""

from __future__ import annotations

import collections
import functools
import statistics
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from shardstream.errors import UsageError
from shardstream.lifecycle import PerProcess
from shardstream.storage.sinks import Buffers

__all__ = ["LINK", "ReadPool", "trim_read_buffers"]

LINK = 8  # the last GETs whose latency and rate a pool's up-front cuts go by (NOTE [ Reads in parts ])

T = TypeVar("T")


class Measured(Protocol):
    """A GET as a pool measures it (cuts.py's and parts.py's ``Measured``): its latency and its rate, each
    None until measured."""

    latency: float | None

    def rate(self) -> float | None: ...


_BUFFERS = PerProcess(Buffers)  # a fork child's are its own (NOTE [ Reusing read buffers ] in sinks.py)


def trim_read_buffers() -> None:
    """Let go of this process's read buffers that nobody holds, beyond ``IDLE_BUFFERS``
    bytes of them: called as a window's reads are let go and as a pool closes (NOTE [
    Reusing read buffers ])."""
    buffers = _BUFFERS.peek()
    if buffers is not None:
        buffers.trim()


class _Gets:
    """A pool's long reads in flight in one process: their GETs and their streams."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.streams: set[Measured] = set()
        self.fast = False  # a GET was measured fast over FAST_PROOF bytes (NOTE [ Reads in parts ])
        # (latency, rate) of the last GETs measured (NOTE [ Reads in parts ])
        self.link: collections.deque[tuple[float, float]] = collections.deque(maxlen=LINK)
        self.unmeasured = 0  # reads cut up front since a GET was last measured


class ReadPool:
    """``threads`` threads for reads, made on first use in each process (see NOTE
    [ Reads in parts ]); ``close`` joins them (a pool made by a parent is dropped)."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise UsageError(f"a read pool needs at least 1 thread, not {threads}")
        self.threads = threads
        # no reference back to the pool: a pool dropped unclosed lets its threads go at once
        self._pool = PerProcess(
            functools.partial(ThreadPoolExecutor, threads, thread_name_prefix="shardstream-read")
        )
        self._gets = PerProcess(_Gets)  # a fork child's count and lock are its own

    @property
    def buffers(self) -> Buffers:
        """This process's buffers for long reads, shared by its pools (NOTE [ Reusing read buffers ])."""
        return _BUFFERS.get()

    @property
    def gets(self) -> int:
        """GETs of this pool's long reads in flight in this process: their first GETs
        and parts (NOTE [ Reads in parts ])."""
        gets = self._gets.peek()
        return gets.count if gets is not None else 0

    def count_gets(self, change: int) -> None:
        gets = self._gets.get()
        with gets.lock:
            gets.count += change

    def reading(self, stream: Measured, now: bool) -> None:
        """``stream`` is being read (``now``) or is done: ``rate`` sums those being read."""
        gets = self._gets.get()
        with gets.lock:
            if now:
                gets.streams.add(stream)
            else:
                gets.streams.discard(stream)

    @property
    def fast(self) -> bool:
        """Whether a GET of this pool read at FAST_CONNECTION over FAST_PROOF bytes in this
        process: its reads are cut no more (NOTE [ Reads in parts ])."""
        gets = self._gets.peek()
        return gets is not None and gets.fast

    def proven_fast(self) -> None:
        self._gets.get().fast = True

    def measured(self, stream: Measured) -> None:
        """Keep ``stream``'s latency and rate, where it measured both."""
        rate = stream.rate()
        if stream.latency is not None and rate is not None:
            gets = self._gets.get()
            with gets.lock:
                gets.link.append((stream.latency, rate))
                gets.unmeasured = 0

    def cut_up_front(self) -> bool:
        """Count a read cut up front; False where LINK of them in a row measured nothing
        (parts too short to give a rate), so this one probes (NOTE [ Reads in parts ])."""
        gets = self._gets.get()
        with gets.lock:
            if gets.unmeasured >= LINK:
                return False
            gets.unmeasured += 1
            return True

    def link(self) -> tuple[float, float] | None:
        """The median latency (s) and rate (bytes/s) of this pool's last GETs measured in
        this process, or None before any (NOTE [ Reads in parts ])."""
        gets = self._gets.peek()
        if gets is None:
            return None
        with gets.lock:
            link = list(gets.link)
        if not link:
            return None
        return statistics.median(t for t, _ in link), statistics.median(r for _, r in link)

    def rate(self) -> float:
        """Bytes/s of this pool's long reads being read, together (NOTE [ Reads in parts ])."""
        gets = self._gets.peek()
        if gets is None:
            return 0.0
        with gets.lock:
            streams = list(gets.streams)
        return sum(stream.rate() or 0.0 for stream in streams)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)`` in a thread of the pool."""
        return self._pool.get().submit(fn, *args)

    def close(self) -> None:
        # at interpreter exit the threads are joined already, and the modules may be gone
        if sys.is_finalizing():
            return
        pool = self._pool.clear()  # this process's: a parent's is dropped
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        trim_read_buffers()  # at most IDLE_BUFFERS kept for the next reader

    def __reduce__(self):  # configuration only, never threads
        return (ReadPool, (self.threads,))
