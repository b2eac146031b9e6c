"""``ReadBudget``: the bytes of windows a worker holds, the one being taken and those fetched ahead.

# NOTE [ Read budget ]
# On object storage a worker fetches the windows after the current one while its samples
# are taken (NOTE [ Getting the bytes ] in fetch.py), as far ahead as the budget allows:
# the bytes of every window fetched or being fetched, and of the window whose samples
# the caller is taking (in flight plus buffered), stay within ``read_budget``. A window
# takes its share in window order (a ticket each), after its sidecars are read (a
# window of whole shards: before, NOTE [ Whole shards at once ] in reader.py) and before
# its first shard byte is asked for, so a later window never takes the room an earlier
# one waits for. It gives the share back when the caller asks for the next window: its
# decoded samples hold about its bytes until then (they are views of its reads, or
# copies of them), and a slow caller (a training step) holds them longest. It used to go
# back when the window was decoded, before its samples were taken: with a caller slower
# than the wire, two windows were fetched ahead of the one being taken (600 x 1 MB on
# loopback moto, windows of 120 MB: RSS growth in the epoch +334 MB against +211 MB for
# the reader before issue 9, ``read_concurrency=1``; now +245 MB). A window larger than
# the budget still goes when at most one other window holds bytes (today's one-window
# prefetch: one window taken while the next is read), so the bound is max(budget, two
# windows) and the stream never stalls. Where the caller keeps up and the epoch is two
# such windows, both are read at once and both are in memory when the first is taken
# (150 x 1 MB, windows of 75 MB: +150 MB against +77 MB). Letting the second go only once
# the first's bytes were all in held +122 MB, but cost the wire its overlap: through the
# WAN proxy (tools/bench_wan.py --only large,loopback, 3 rounds, trees alternated) 1 MB
# tar fell from 1.92x to 1.69x of LitData and 0.84x to 0.77x of boto3 in 16 threads. So
# it goes with the one before, as the reader before issue 9 fetched its next window.
#
# A fetch waiting for room must not outlive its process: a script that exits holding an
# iterator it never finished (``batch = next(iter(loader))``) left a fetch waiting for a
# share nobody gives back, and the interpreter, which joins the fetch threads at exit
# (``concurrent.futures``' own hook), hung there forever. Every open budget is closed by
# a hook that the interpreter calls before that join (``threading``'s exit hooks run
# newest first, and ``concurrent.futures.thread`` registers its hook when imported, before
# ours), so the fetches give up as ``close`` makes them.
"""

from __future__ import annotations

import collections
import concurrent.futures.thread  # noqa: F401  (its exit hook first: ours runs before it)
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from shardstream.errors import UsageError
from shardstream.storage import Prefetcher

__all__ = ["DEFAULT_READ_BUDGET", "BudgetClosed", "ReadBudget", "fetch_in_turn", "fetched_in_order"]

F = TypeVar("F")
D = TypeVar("D")

_OPEN: weakref.WeakSet[ReadBudget] = weakref.WeakSet()  # budgets to close at exit (NOTE [ Read budget ])


def _close_open_budgets() -> None:
    for budget in list(_OPEN):
        budget.close()


# private, as concurrent.futures uses it; without it an exit may wait as before
getattr(threading, "_register_atexit", lambda hook: None)(_close_open_budgets)

DEFAULT_READ_BUDGET = 64 * 2**20


class BudgetClosed(Exception):
    """The stream stopped while a fetch waited for room (the fetch is dropped)."""


class ReadBudget:
    """Bytes held by windows fetched ahead, handed out in ticket order (NOTE [ Read budget ])."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise UsageError(f"read_budget must be at least 1 byte, not {limit}")
        self.limit = limit
        self.held = 0  # bytes of windows fetched or in flight, not yet decoded
        self.peak = 0  # the most ``held`` ever was: at most max(limit, 2 * largest)
        self.largest = 0  # the most one window took
        self._windows = 0  # windows holding bytes
        self._turn = 0  # the ticket whose turn it is
        self._closed = False
        self._cond = threading.Condition()
        _OPEN.add(self)

    def take(self, ticket: int, size: int) -> None:
        """Wait until it is ``ticket``'s turn and ``size`` bytes fit, then hold them."""
        with self._cond:
            while not self._closed and (ticket != self._turn or not self._fits(size)):
                self._cond.wait()
            if self._closed:
                raise BudgetClosed
            self.held += size
            self.peak = max(self.peak, self.held)
            self.largest = max(self.largest, size)
            self._windows += 1
            self._turn += 1
            self._cond.notify_all()

    def _fits(self, size: int) -> bool:
        return self.held + size <= self.limit or self._windows <= 1

    def skip(self, ticket: int) -> None:
        """``ticket`` takes nothing (its fetch failed first): let the next one go."""
        with self._cond:
            while not self._closed and ticket != self._turn:
                self._cond.wait()
            self._turn = max(self._turn, ticket + 1)
            self._cond.notify_all()

    def give_back(self, size: int) -> None:
        with self._cond:
            self.held -= size
            self._windows -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiting fetch (they raise ``BudgetClosed``)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def fetch_in_turn(
    fetch: Callable[[Any, Callable[[int], None] | None], F],
    budget: ReadBudget | None,
    ticket: int,
    window: Any,
) -> tuple[F, int]:
    """``fetch(window, take)`` taking its bytes from ``budget`` in ``ticket`` order; the
    result and the bytes it holds (a fetch that fails gives them back, or its turn)."""
    if budget is None:
        return fetch(window, None), 0
    held: list[int] = []

    def take(size: int) -> None:
        budget.take(ticket, size)
        held.append(size)

    try:
        fetched = fetch(window, take)
    except BaseException:
        if held:
            budget.give_back(held[0])
        else:
            budget.skip(ticket)
        raise
    (size,) = held  # every fetch takes its share before it reads
    return fetched, size


def fetched_in_order(
    windows: Iterator[Any],
    prefetcher: Prefetcher[Any, tuple[F, int]],
    ahead: int,
    budget: ReadBudget | None,
    decode: Callable[[Any, F], D],
) -> Iterator[Any]:
    """``(window, *decode(window, fetched))`` for each window, fetched ``ahead`` windows
    ahead by ``prefetcher`` (items ``(ticket, window)``); a window's bytes go back to
    ``budget`` once the caller asks for the next one (its samples are all taken)."""
    pending: collections.deque[Any] = collections.deque()
    taken: list[int] = []  # the bytes of the window the caller is taking samples of

    def give_back() -> None:
        if budget is not None and taken:
            budget.give_back(taken.pop())

    def claim() -> tuple[Any, Any]:
        give_back()
        window = pending.popleft()
        fetched, held = prefetcher.next()
        taken.append(held)
        return (window, *decode(window, fetched))  # type: ignore[misc]

    try:
        for ticket, window in enumerate(windows):
            pending.append(window)
            prefetcher.submit((ticket, window))
            if len(pending) > ahead:
                yield claim()
        while pending:
            yield claim()
    finally:
        give_back()
