"""``Prefetcher``: fetch ahead of use in a few background threads, hand results back in order."""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from shardstream.errors import UsageError

__all__ = ["Prefetcher"]

T = TypeVar("T")
R = TypeVar("R")


class Prefetcher(Generic[T, R]):
    """Runs ``fetch`` in a small background thread pool, ahead of use, in submission order.

    ``submit`` never blocks: at most ``max_pending`` fetches are running or holding an
    unclaimed result at a time (that bounds memory); later items wait in a queue and
    start as results are claimed with ``next``. ``next`` returns the result of the
    oldest submitted item, re-raising its exception. ``close`` cancels what has not
    started and joins the threads.
    """

    def __init__(self, fetch: Callable[[T], R], *, threads: int = 4, max_pending: int = 8) -> None:
        if threads < 1 or max_pending < 1:
            raise UsageError(
                f"Prefetcher needs threads >= 1 and max_pending >= 1, not {threads}, {max_pending}"
            )
        self._fetch = fetch
        self._max_pending = max_pending
        self._queued: collections.deque[T] = collections.deque()
        self._running: collections.deque[Future[R]] = collections.deque()
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            threads, thread_name_prefix="shardstream-prefetch"
        )

    @property
    def pending(self) -> int:
        """Items submitted and not yet claimed by ``next``."""
        return len(self._queued) + len(self._running)

    def submit(self, item: T) -> None:
        """Queue ``item``; its fetch starts as soon as there is room."""
        self._live()
        self._queued.append(item)
        self._fill()

    def next(self) -> R:
        """The result of the oldest submitted item (waits for it); re-raises its error."""
        self._live()
        self._fill()
        if not self._running:
            raise UsageError("Prefetcher.next() called with nothing submitted")
        future = self._running.popleft()
        try:
            return future.result()
        finally:
            self._fill()

    def close(self) -> None:
        """Cancel fetches not yet started, wait for running ones, join the threads."""
        pool, self._pool = self._pool, None
        self._queued.clear()
        if pool is None or sys.is_finalizing():  # at exit the threads are joined already
            return
        for future in self._running:
            future.cancel()
        self._running.clear()
        pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetcher[T, R]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A dropped, unclosed Prefetcher must not keep threads alive.
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _live(self) -> ThreadPoolExecutor:
        if self._pool is None:
            raise UsageError("Prefetcher is closed")
        return self._pool

    def _fill(self) -> None:
        pool = self._live()
        while self._queued and len(self._running) < self._max_pending:
            self._running.append(pool.submit(self._fetch, self._queued.popleft()))
