"""``ReadBudget``: the bytes of windows a worker holds, the one being taken and those fetched ahead.

# NOTE [ Read budget ]
# On object storage a worker fetches the windows after the current one while its samples
# are taken (NOTE [ Getting the bytes ] in fetch.py), as far ahead as the budget allows:
# the bytes of every window fetched or being fetched, and of the window whose samples
# the caller is taking (in flight plus buffered), stay within ``read_budget``. A window
# takes its share in window order (a ticket each), after its sidecars are read (a
# window of whole shards: before, NOTE [ Whole shards at once ] in window_fetch.py) and before
# its first shard byte is asked for, so a later window never takes the room an earlier
# one waits for. It gives the share back when the caller asks for the next window, not
# when the window is decoded: its decoded samples hold about its bytes until then (views
# of its reads, or copies), and a slow caller (a training step) holds them longest.
# A window larger than the budget still goes beside one other window (one taken while the
# next is read), so the bound is max(budget, two windows) and the stream never stalls;
# but only once at most half the budget of that window's bytes is still to come. Its reads
# tell the budget of their bytes as they arrive (the ``tell`` a fetch passes to its reads). Letting the second window go at once would have both share the wire
# and a caller that keeps up hold both; letting it go only once the first is all in would
# lose the wire's overlap; half the budget still to come is a lead of several latencies.
# tools/bench_memory.py and tools/bench_wan.py measure the RSS and the rate.
#
# The default budget is DEFAULT_READ_BUDGET, or LONG_LINK_READ_BUDGET where the process's
# small GETs to the storage (the manifest's first) took LONG_LATENCY or more to answer (a
# remote region, a WAN: NOTE [ A link's latency before its reads ] in storage/cuts.py),
# decided as each iteration's reader is made (a forked DataLoader worker knows its
# parent's GETs; a spawned one that made none yet takes DEFAULT_READ_BUDGET its first
# epoch). By Little's law a worker carries at most its budget per the time a byte is held,
# from its GET to the caller taking its sample, and over a long link every read holds its
# bytes a round trip longer before the first of them arrives. A budget given is kept.
#
# A fetch waiting for room must not outlive its process: a script that exits holding an
# iterator it never finished (``batch = next(iter(loader))``) would leave a fetch waiting
# for a share nobody gives back, and the interpreter, which joins the fetch threads at
# exit, would hang. Every open budget is closed by a hook that the interpreter calls before
# that join (NOTE [ Exit hooks ] in lifecycle.py), so the fetches give up as ``close`` makes them.
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from shardstream.errors import UsageError
from shardstream.lifecycle import before_threads_join
from shardstream.manifest import ShardInfo
from shardstream.plan import Run, Window
from shardstream.storage import Prefetcher, trim_read_buffers
from shardstream.storage.cuts import long_answers

__all__ = [
    "DEFAULT_READ_BUDGET",
    "LONG_LINK_READ_BUDGET",
    "BudgetClosed",
    "ReadBudget",
    "default_read_budget",
    "fetch_in_turn",
    "fetched_in_order",
    "in_pieces",
    "piece_limit",
]

F = TypeVar("F")
D = TypeVar("D")

_OPEN: weakref.WeakSet[ReadBudget] = weakref.WeakSet()  # budgets to close at exit (NOTE [ Read budget ])


def _close_open_budgets() -> None:
    for budget in list(_OPEN):
        budget.close()


before_threads_join(_close_open_budgets)  # NOTE [ Exit hooks ] in lifecycle.py

DEFAULT_READ_BUDGET = 64 * 2**20
LONG_LINK_READ_BUDGET = 128 * 2**20  # the default over a long link (NOTE [ Read budget ])


def default_read_budget(latency: float | None) -> int:
    """The read budget of a reader whose storage's small GETs answered in ``latency``
    seconds (None: not measured): NOTE [ Read budget ]."""
    return LONG_LINK_READ_BUDGET if long_answers(latency) else DEFAULT_READ_BUDGET


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
                # only its arrivals decide whether a window beside it may go (``_fits``):
                # waiters are woken when its bytes to come cross half the budget, not per chunk
                before = sum(self._coming.values())
                self._coming[ticket] = max(0, self._coming[ticket] - count)
                if sum(self._coming.values()) <= self.limit // 2 < before:
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
    fetch: Callable[[Any, Callable[[int], None] | None, Callable[[int], None] | None], F],
    budget: ReadBudget | None,
    ticket: int,
    window: Any,
) -> tuple[F, int]:
    """``fetch(window, take, tell)`` taking its bytes from ``budget`` in ``ticket`` order,
    its reads telling the budget of their bytes as they arrive; the result and the ticket
    (a fetch that fails gives back its bytes, or its turn)."""
    if budget is None:
        return fetch(window, None, None), ticket
    try:
        fetched = fetch(
            window, functools.partial(budget.take, ticket), functools.partial(budget.arrived, ticket)
        )
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
        decoded = (window, *decode(window, fetched))  # type: ignore[misc]
        del fetched  # the reads the samples do not hold are free: past the idle ones, let go
        trim_read_buffers()  # NOTE [ Reusing read buffers ] in storage/sinks.py
        return decoded

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


# NOTE [ Unshuffled windows in pieces ]
# A window is the plan's unit of shuffling: the default one holds four mean-sized shards
# (NOTE [ Window size ] in plan/config.py), whatever their bytes, and its samples come
# only once all of it is in. With ``shuffle=False`` its yield order is its runs' order,
# so nothing needs all of it at once: the reader takes such a window
# (``Window.in_run_order``) as consecutive pieces of at most a piece's bytes each
# (``in_pieces``, bytes as the manifest counts a shard's per sample), one after another
# across the windows' ends. A piece is a quarter of the budget (``piece_limit``): the one
# whose samples are taken and three in flight fit in it, so when the caller lets go of a
# piece the next piece's reads go at once while two or three others are still arriving,
# and the wire never drains at a piece's or a window's end, whatever the shards' size
# next to the budget (a shard of a gigabyte is cut into many pieces, shards of a few
# megabytes share one). A run is cut only where it alone is longer than a piece, evenly,
# so a shard that fits stays one read (a whole-shard GET where it is all of its shard,
# NOTE [ Whole shards ] in window_fetch.py); and a piece of less than half a piece joins
# the one before it (the first, the one after), so a window a little over a piece stays
# whole (a piece is then at most 1.5 pieces' bytes; one sample longer than that is a
# piece of its own). The plan, its order and its resume state are unchanged: the caller
# sees the same samples, and ``state_dict`` counts them as before (a piece is laid out
# lazily, after its sidecars). A window resumed part way is taken in pieces too: the
# plan knows the runs of its rest up front (``Window.known_runs``), so a resume inside
# a window of large shards does not read the rest of the window at once.
# - Why: a window over the budget goes beside one other (NOTE [ Read budget ]), so a
#   caller as fast as the wire would hold two big windows and the next one's decoding;
#   and pieces of about the budget leave room for one in flight only, which starts
#   behind the caller's, so the wire drained at every piece.
# - Why not smaller pieces still: each piece costs a fetch thread (``AHEAD_THREADS``) and
#   cuts its shards into more ranged reads, each paying a request's latency (and, on a
#   server that copies the whole object for every ranged GET, moto's copy: NOTE [ Whole
#   shards ]); four in the budget keep the wire busy with the fetch threads there are.
# - An iteration's first piece is cut in two: its first 1/FIRST_PIECE_SHARE (512 KiB on
#   a long link, or one sample where that is longer), then the rest. The first sample
#   comes when its piece is in and checked, and every piece in flight at the start shares
#   the wire with the others: a piece of a quarter of the budget made the first sample
#   wait for a quarter of the budget's bytes (on a long link, 32 MiB over the four
#   connections of its parts). A short head brings it after about one round trip. It
#   costs one more ranged GET per iteration. Heads of a sixteenth, and a ramp of pieces
#   of a 64th, a 16th and a quarter, made the epoch no faster and the first sample later
#   (paired on tools/bench_matrix.py's WAN cells, SeaweedFS behind the proxy).
# - A cached dataset (``cache_dir``) keeps pieces of the budget: a shard's first read
#   fills all of its cache entry, so pieces of part of a shard would wait on one fill.
# tools/bench_memory.py measures the RSS, tools/bench_wan.py the rate.
PIECES_IN_BUDGET = 4
FIRST_PIECE_SHARE = 64  # an iteration's first piece begins with this share of a piece


def piece_limit(limit: int, *, cached: bool = False) -> int:
    """The most bytes of a piece of an unshuffled window under a budget of ``limit``
    (NOTE [ Unshuffled windows in pieces ])."""
    return limit if cached else max(1, limit // PIECES_IN_BUDGET)


def in_pieces(
    windows: Iterator[Any], shards: Sequence[ShardInfo], limit: int, *, head: bool = False
) -> Iterator[Any]:
    """``windows``, each one in run order whose runs' bytes (``shards``' bytes per sample)
    pass ``limit`` (``piece_limit``) as consecutive windows of about ``limit`` bytes
    (``_pieces``; NOTE [ Unshuffled windows in pieces ]); with ``head``, the first such
    window's first piece cut in two, its first 1/FIRST_PIECE_SHARE and the rest."""
    for window in windows:
        runs = window.known_runs if getattr(window, "in_run_order", False) else None
        pieces = _pieces(runs, shards, limit) if runs is not None else []
        if head and pieces:
            first = _pieces(pieces[0], shards, max(1, limit // FIRST_PIECE_SHARE))
            if len(first) > 1:
                pieces[:1] = [first[0], _joined([run for group in first[1:] for run in group])]
        head = False
        if len(pieces) < 2:
            yield window
            continue
        # each laid out once its sidecars are checked, as the window would be; the first
        # loads those of all the window's shards at once, as the window would: the later
        # pieces find theirs in the LRU, no round trip ahead of their reads
        for number, piece in enumerate(pieces):
            shards_of = window.shards if not number else tuple(dict.fromkeys(run.shard for run in piece))
            yield Window.lazy(shards_of, functools.partial(_in_order, tuple(piece)), piece, in_run_order=True)


def _joined(runs: list[Run]) -> list[Run]:
    """``runs`` with each that goes on where the one before it stops in its shard joined to it."""
    out: list[Run] = []
    for run in runs:
        if out and out[-1].shard == run.shard and out[-1].stop == run.start:
            out[-1] = Run(run.shard, out[-1].start, run.stop)
        else:
            out.append(run)
    return out


def _in_order(runs: tuple[Run, ...]) -> tuple[tuple[Run, ...], np.ndarray]:
    order = np.arange(sum(map(len, runs)), dtype=np.int64)
    order.setflags(write=False)
    return runs, order


def _pieces(runs: Sequence[Run], shards: Sequence[ShardInfo], limit: int) -> list[list[Run]]:
    """``runs`` in consecutive groups of at most ``limit`` bytes, a run longer than that
    alone cut into even parts, each a group of its own; then a group of less than half
    of ``limit`` joins the one before it, or the first the one after it (NOTE [
    Unshuffled windows in pieces ])."""
    pieces: list[list[Run]] = []
    sizes: list[float] = []
    for run in runs:
        info = shards[run.shard]
        size = len(run) * info.bytes / max(1, info.samples)
        if size <= limit:
            if not pieces or not pieces[-1] or sizes[-1] + size > limit:
                pieces.append([])
                sizes.append(0.0)
            pieces[-1].append(run)
            sizes[-1] += size
            continue
        count = min(len(run), -(-int(size) // limit))  # parts of at most `limit`, or one sample each
        cuts = run.start + (np.arange(count + 1, dtype=np.int64) * len(run)) // count
        for start, stop in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
            pieces.append([Run(run.shard, start, stop)])
            sizes.append(size * (stop - start) / len(run))
        pieces.append([])  # the next run starts a piece of its own
        sizes.append(0.0)
    pieces, sizes = [p for p in pieces if p], [z for p, z in zip(pieces, sizes, strict=True) if p]
    j = 0
    while len(pieces) > 1 and j < len(pieces):
        if sizes[j] < limit / 2:
            k = j - 1 if j else 1  # the one before, or the first's next
            lo, hi = min(j, k), max(j, k)
            pieces[lo : hi + 1] = [pieces[lo] + pieces[hi]]
            sizes[lo : hi + 1] = [sizes[lo] + sizes[hi]]
            j = lo
        else:
            j += 1
    return pieces
