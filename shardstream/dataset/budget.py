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
# the budget still goes beside one other window (today's one-window prefetch: one window
# taken while the next is read), so the bound is max(budget, two windows) and the stream
# never stalls; but only once at most half the budget of that window's bytes is still to
# come. Its reads tell the budget of their bytes as they arrive (``counting_arrivals`` in
# storage/parts.py: a chunk of a long read at a time, a short read when done; a window
# whose fetch is done has nothing to come, its bytes from a cache too). It used to go
# at once: two windows arriving together share the wire, so the first was in (and could
# be decoded, taken and let go) only when the second was about as far, and a caller that
# keeps up held both (150 x 1 MB, windows of 75 MB: +150 MB against +77 MB). Letting the
# second go only once the first's bytes were all in held +122 MB, but cost the wire its
# overlap: through the WAN proxy (tools/bench_wan.py --only large,loopback, 3 rounds,
# trees alternated) 1 MB tar fell from 1.92x to 1.69x of LitData and 0.84x to 0.77x of
# boto3 in 16 threads. Half the budget still to come (32 MiB by default) is a lead of
# ~100-200 ms at the wire's 170-300 MB/s there, several of its latencies: the same
# epoch, paired with the rule before in 5 rounds (tools/bench_compare.py 2967451
# 242a099), grew its RSS 162 MB, not 186, at 0.98x the rate, as the peers moved in
# those rounds. On loopback the wire outruns the check and decode, so the second
# window is in before the first is let go either way.
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
import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from shardstream.errors import UsageError
from shardstream.storage import Prefetcher
from shardstream.storage.parts import counting_arrivals

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
        self._taken: dict[int, int] = {}  # ticket -> bytes, of each window holding bytes
        self._coming: dict[int, int] = {}  # ticket -> its bytes still to arrive
        self._turn = 0  # the ticket whose turn it is
        self._closed = False
        self._cond = threading.Condition()
        _OPEN.add(self)

    @property
    def _windows(self) -> int:
        """Windows holding bytes."""
        return len(self._taken)

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
            self._taken[ticket] = self._coming[ticket] = size
            self._turn += 1
            self._cond.notify_all()

    def _fits(self, size: int) -> bool:
        if self.held + size <= self.limit or not self._windows:
            return True
        # larger than the room left: beside one window only, once most of its bytes are in
        return self._windows == 1 and sum(self._coming.values()) <= self.limit // 2

    def arrived(self, ticket: int, count: int) -> None:
        """``count`` bytes of ``ticket``'s window are in."""
        with self._cond:
            if ticket in self._coming:
                self._coming[ticket] = max(0, self._coming[ticket] - count)
                self._cond.notify_all()

    def fetched(self, ticket: int) -> None:
        """All of ``ticket``'s window is in (bytes no read told of too: a cache's, say)."""
        self.arrived(ticket, self._coming.get(ticket, 0))

    def give_back(self, ticket: int) -> None:
        """``ticket``'s window lets go of the bytes it took, or of its turn if it took none
        (its fetch failed first)."""
        with self._cond:
            if ticket in self._taken:
                self.held -= self._taken.pop(ticket)
                self._coming.pop(ticket)
            else:
                while not self._closed and ticket != self._turn:
                    self._cond.wait()
                self._turn = max(self._turn, ticket + 1)
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
    """``fetch(window, take)`` taking its bytes from ``budget`` in ``ticket`` order, its
    reads telling the budget of their bytes as they arrive; the result and the ticket
    (a fetch that fails gives back its bytes, or its turn)."""
    if budget is None:
        return fetch(window, None), ticket
    try:
        with counting_arrivals(functools.partial(budget.arrived, ticket)):
            fetched = fetch(window, functools.partial(budget.take, ticket))
    except BaseException:
        budget.give_back(ticket)
        raise
    budget.fetched(ticket)
    return fetched, ticket


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
    taken: list[int] = []  # the ticket of the window whose samples are taken

    def give_back() -> None:
        if budget is not None and taken:
            budget.give_back(taken.pop())

    def claim() -> tuple[Any, Any]:
        give_back()
        window = pending.popleft()
        fetched, ticket = prefetcher.next()
        taken.append(ticket)
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
