"""The tokens of a window of documents, for the sequences built from them (NOTE [ Reading
sequences ] in sequences.py): one flat array per document run, each a view of its read.

NOTE [ Tokens without documents ]
Sequences need of a document window only its runs' tokens, one array per run: never a
document's key, dict or array of its own. A document read as a sample costs all three,
more than building its tokens into sequences. So a window of one dataset is fetched by its
``WindowReader`` as any window is (ranged reads, the budget, prefetch, checks, the cache)
and then, instead of being decoded sample by sample, each of its runs is cut out of its
read (``read_tokens``: a view, no copy). A read is a fresh buffer of its own (bytes, or a
memory map made for it), so the views keep it for as long as the sequences are built; a
buffer of another kind is copied first. A mixture's windows are so too, each stream's
reads cut by its own index.
"""

from __future__ import annotations

import collections
import functools
import mmap
import operator
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from typing import Any, cast

import numpy as np

from shardstream.dataset.ahead import prefetched
from shardstream.dataset.mixture_reader import MixtureReader
from shardstream.dataset.read_checks import Fetched
from shardstream.dataset.reader import WindowReader
from shardstream.formats.base import SampleColumns
from shardstream.formats.tokens import read_tokens
from shardstream.plan import Run, Window
from shardstream.storage import Prefetcher
from shardstream.tokens import SequenceRun

__all__ = ["DocumentTokens", "SharedShards", "flat_tokens", "joined_runs", "placed_runs", "shared_shards"]

# NOTE [ A shard read once across windows ]
# A shuffled window of sequences holds runs of sequences of many shards, and the plan cuts
# a shard's sequences between several consecutive windows. Each window reading its own part
# of every shard costs a request per run, and the runs of a shuffled window are short; and
# a best-fit bin mixes documents from all over its block, so the documents of a run of
# bins are nearly all of the block's: every window holding bins of a shard would read
# nearly the whole of it. So a shard's read is shared (``shared_shards``): the first
# window holding its sequences reads the documents of its own sequences of that shard and
# of the windows after it that hold some (one ranged read, where they touch), and those
# windows read none of it but borrow those tokens. A window lends to the next window only,
# and never a shard it borrowed (it did not read it), so a shard cut between many windows
# is read by every other one; concat's and pad's windows lend only where they are
# shuffled (an unshuffled window's pieces go on where the one before ended, NOTE [
# Unshuffled windows in pieces ] in budget.py), and never a stream's first window (its
# samples wait for all of its reads, so the next window's would only hold up the first
# sample). A best-fit shard no larger than an unshuffled piece of the read budget
# (``piece_limit``: a part of the budget, or all of it with a cache) is lent on along the
# consecutive windows after the reader that hold it: the chain ends at the first window
# that does not, and holds at most ``CHAIN_WINDOWS`` windows, the reader's among them (as
# many windows are looked ahead at, their runs as the plan knows them, none laid out); a
# later window that holds it reads it again. Its one read is about what each of those
# windows would have read of it alone. Which tokens make each sequence
# is the same either way: a document run is cut from the shard's tokens wherever it was
# read. The lent tokens stay until the last window that borrows them is built, after the
# reader's bytes went back to the read budget: at most the bytes the borrowers would have
# read of that shard themselves (a best-fit chain), or one window's share (a lend to the
# next window).


class DocumentTokens:
    """Windows of documents as the tokens of their runs (NOTE [ Tokens without documents ]):
    fetched by ``reader`` (one dataset's, or a mixture's with ``streams``: each mixture
    shard's stream), cut from its reads in yield order. What ``prefetched`` drives (an
    ``AheadReader``), in place of ``reader``'s samples."""

    def __init__(
        self,
        reader: WindowReader | MixtureReader,
        streams: tuple[int, ...] | None = None,
        beside: Callable[[tuple[int, ...]], None] | None = None,
    ) -> None:
        """``beside(shards)``: what a window's fetch runs beside the reader's (the reads of
        its shards' other sidecars)."""
        self.reader, self.streams, self.beside = reader, streams, beside
        self.prefetch, self.budget = reader.prefetch, reader.budget
        self.turns = _Turns()
        self.numbers: dict[int, int] = {}  # id of a window given -> its number

    def stream(self, windows: Iterator[Any]) -> Iterator[tuple[Any, list[np.ndarray], bool]]:
        """``(window, tokens of each run, holes)`` for each window of documents."""
        return prefetched(self, self._numbered(windows))

    def _numbered(self, windows: Iterator[Any]) -> Iterator[Any]:
        for number, window in enumerate(windows):
            self.numbers[id(window)] = number
            yield window

    def fetch(
        self,
        window: Any,
        take: Callable[[int], None] | None = None,
        tell: Callable[[int], None] | None = None,
    ) -> Any:
        """``window``'s bytes, its sidecars read once the window before it has its own
        (NOTE [ Sidecars in turn ])."""
        number = self.numbers.pop(id(window), None)
        if number is None:
            return self._fetch(window, take, tell)
        taking = None
        if take is not None:  # one asking no bytes is not held, but lets the next by as it ends
            self.turns.wait(number)
            taking = functools.partial(_taking, self.turns, number, take)
        try:
            return self._fetch(window, taking, tell)
        finally:
            self.turns.done(number)

    def _fetch(
        self, window: Any, take: Callable[[int], None] | None, tell: Callable[[int], None] | None
    ) -> Any:
        if self.beside is None:
            return self.reader.fetch(window, take, tell)
        with ThreadPoolExecutor(1) as pool:
            beside = pool.submit(self.beside, window.shards)
            fetched = self.reader.fetch(window, take, tell)
        beside.result()
        return fetched

    def in_yield_order(self, window: Any, fetched: Any) -> tuple[list[np.ndarray], bool]:
        """The tokens of each of ``window``'s runs (documents in run order are the yield
        order of a document window), and whether a read failed its checks (skipped)."""
        runs = window.runs
        none = np.zeros(0, dtype=np.int64)
        flats: list[np.ndarray] = [none] * len(runs)
        holes = False
        for reader, numbers, reads in self._by_reader(runs, fetched):
            shards = reader.manifest.shards
            reads.reverse()
            while reads:
                read, data, index, bad = reads.pop()
                if isinstance(bad, Future):
                    data, bad = bad.result()  # its check is done before its bytes are cut
                if bad:
                    holes = True
                    continue
                kept, name = _kept(data), shards[read.shard].path
                for number in read.runs:
                    run = runs[numbers[number]]
                    flats[numbers[number]] = read_tokens(
                        kept, read.rng, index, run.start, run.stop, name=name
                    )
                del data, kept
        return flats, holes

    def _by_reader(
        self, runs: Sequence[Run], fetched: Any
    ) -> list[tuple[WindowReader, list[int], list[Fetched]]]:
        """Each reader with the numbers (in ``runs``) of the runs it read, in the order its
        reads number them, and its reads: a mixture's streams' each read their runs in
        window order (``MixtureReader.fetch``)."""
        if self.streams is None:
            return [(cast(WindowReader, self.reader), list(range(len(runs))), fetched)]
        mixture = cast(MixtureReader, self.reader)
        numbers: dict[int, list[int]] = {}
        for number, run in enumerate(runs):
            numbers.setdefault(self.streams[run.shard], []).append(number)
        return [(mixture.readers[stream], mine, fetched[stream]) for stream, mine in numbers.items()]

    def in_pieces(self, windows: Iterator[Any]) -> Iterator[Any]:
        return windows  # a document window is read whole (NOTE [ Reading sequences ])

    def check_beside_decoding(self) -> None:
        self.reader.check_beside_decoding()

    def hold(self, prefetcher: Prefetcher[Any, Any]) -> None:
        self.reader.hold(prefetcher)

    def close(self) -> None:
        self.turns.close()
        self.reader.close()


# NOTE [ Sidecars in turn ]
# A stream's first windows are fetched at once, each first reading its shards' sidecars
# (sample indexes, best-fit bins), then its bytes. Left to themselves, the sidecar GETs of
# all the windows ahead share the connections with the first window's, whose bytes then
# wait for the sidecars of windows long after it. So a window's fetch reads its sidecars
# only once the window before it has all of its own (it asks the read budget for its
# bytes then): its sidecars come beside the earlier window's bytes, never before them.
# Once a stream runs, a window's sidecars are long in when its turn comes. Windows are
# numbered as they are given and fetched in that order, so a window waits only for one
# whose fetch has begun: one that fails, or that asks no bytes (no read budget), lets the
# next by as it ends, and closing lets every waiter by.


def _taking(turns: _Turns, number: int, take: Callable[[int], None], size: int) -> None:
    turns.done(number)  # the window has its sidecars: the next one may read its own
    take(size)


class _Turns:
    """Numbered fetches let through one after another up to a point (``done``)."""

    def __init__(self) -> None:
        self.turn, self.closed = 0, False
        self.cond = threading.Condition()

    def wait(self, number: int) -> None:
        with self.cond:
            while not self.closed and self.turn < number:
                self.cond.wait()

    def done(self, number: int) -> None:
        with self.cond:
            if self.turn <= number:
                self.turn = number + 1
                self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


@dataclass(frozen=True, slots=True)
class SharedShards:
    """What a window of sequences shares with its neighbours (NOTE [ A shard read once
    across windows ]): the shards it ``borrows`` from a window before it, those it ``lends``
    to the windows after it, those whose tokens it ``keeps`` for the window after it (lent
    or borrowed), and ``runs``: the sequence runs of every shard it shares, in all the
    windows that share that shard's read (its own runs too)."""

    borrows: frozenset[int]
    lends: frozenset[int]
    keeps: frozenset[int]
    runs: tuple[Run, ...]

    def of(self, shards: frozenset[int]) -> list[Run]:
        """``runs`` of ``shards``."""
        return [run for run in self.runs if run.shard in shards]


_ALONE = SharedShards(frozenset(), frozenset(), frozenset(), ())
CHAIN_WINDOWS = 8  # the most windows that share one read of a shard (windows looked ahead)


def shared_shards(
    windows: Iterator[Window],
    lending: bool | Callable[[Window], bool],
    chained: Callable[[int], bool] | None = None,
) -> Iterator[tuple[Window, SharedShards]]:
    """Each of ``windows`` with what it shares: nothing unless ``lending`` (or where it says
    no of the window); a shard ``chained`` says yes of is lent on along every window after
    the reader that holds sequences of it (up to ``CHAIN_WINDOWS`` in all), any other to
    the next window only. The windows a read is shared with are taken from ``windows``
    before the reader is given."""
    if lending is False:
        yield from zip(windows, repeat(_ALONE))
        return
    lends = (lambda _: True) if lending is True else lending
    ahead: collections.deque[tuple[Window, frozenset[int], bool]] = collections.deque()
    # per window still to give, its number -> shard -> (borrowed, kept, runs of the read)
    told: collections.defaultdict[int, dict[int, tuple[bool, bool, tuple[Run, ...]]]] = (
        collections.defaultdict(dict)
    )
    number = 0
    for window in windows:
        ahead.append((window, frozenset(window.shards), lends(window)))
        if len(ahead) == CHAIN_WINDOWS:
            yield ahead[0][0], _share(ahead, told, number, chained)
            ahead.popleft()
            number += 1
    while ahead:
        yield ahead[0][0], _share(ahead, told, number, chained)
        ahead.popleft()
        number += 1


def _share(
    ahead: collections.deque[tuple[Window, frozenset[int], bool]],
    told: collections.defaultdict[int, dict[int, tuple[bool, bool, tuple[Run, ...]]]],
    number: int,
    chained: Callable[[int], bool] | None,
) -> SharedShards:
    """What ``ahead[0]`` (window ``number``) shares: the reads it shares with the windows
    after it decided now, those it borrows as decided before."""
    window, _, lending = ahead[0]
    mine = told.pop(number, {})
    lent = set()
    for shard in window.shards if lending else ():
        if shard in mine:
            continue  # borrowed: never read, so never the start of a read shared on
        most = CHAIN_WINDOWS if chained is not None and chained(shard) else 2
        last = 1
        while last < min(most, len(ahead)) and ahead[last][2] and shard in ahead[last][1]:
            last += 1
        if last < 2:
            continue
        runs = tuple(run for held, _, _ in list(ahead)[:last] for run in _runs(held) if run.shard == shard)
        lent.add(shard)
        mine[shard] = (False, True, runs)
        for after in range(1, last):
            told[number + after][shard] = (True, after < last - 1, runs)
    return SharedShards(
        frozenset(shard for shard, (borrowed, _, _) in mine.items() if borrowed),
        frozenset(lent),
        frozenset(shard for shard, (_, kept, _) in mine.items() if kept),
        tuple(run for _, _, runs in mine.values() for run in runs),
    )


def _runs(window: Window) -> tuple[Run, ...]:
    """``window``'s runs, not laid out (O(window)) where the plan knows them."""
    return window.runs if window.known_runs is None else window.known_runs


def joined_runs(runs: list[tuple[int, SequenceRun]]) -> list[Run]:
    """The document runs that hold ``runs`` (sequence runs of shards): a shard's joined
    where they touch, in order of first use. The same sequence runs of a shard give the
    same document runs, whatever else is among ``runs``."""
    spans: dict[int, list[list[int]]] = {}
    for shard, run in runs:
        if run.count:
            spans.setdefault(shard, []).append([run.docs[0], run.docs[1]])
    joined: list[Run] = []
    for shard, found in spans.items():
        found.sort()
        merged = [found[0]]
        for lo, hi in found[1:]:
            if lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        joined.extend(Run(shard, lo, hi) for lo, hi in merged)
    return joined


def placed_runs(runs: list[tuple[int, SequenceRun]], joined: list[Run]) -> list[tuple[SequenceRun, int]]:
    """Each of ``runs`` that holds sequences, with the number of the run of ``joined`` that
    holds its documents."""
    where: dict[int, list[tuple[int, int, int]]] = {}
    for number, doc_run in enumerate(joined):
        where.setdefault(doc_run.shard, []).append((doc_run.start, doc_run.stop, number))
    placed = []
    for shard, run in runs:
        if run.count:
            lo, hi = run.docs
            placed.append((run, next(n for a, b, n in where[shard] if a <= lo and hi <= b)))
    return placed


def _kept(data: bytes | memoryview) -> bytes | memoryview:
    """``data``, where it is a buffer of its read's own that views may keep; else a copy."""
    if isinstance(data, bytes):
        return data
    owner = data.obj if isinstance(data, memoryview) else None
    return data if isinstance(owner, (bytes, mmap.mmap)) else bytes(data)


def flat_tokens(joined: list[Run], docs: Any) -> list[np.ndarray]:
    """The tokens of each document run, end to end (``docs``: the window's documents in run
    order): the one array they are views of where they are consecutive in it, else a copy."""
    if isinstance(docs, SampleColumns):
        column = docs.values[len(docs.fields) - 1 - docs.fields[::-1].index("tokens")]
    else:
        column = [doc["tokens"] for doc in docs]
    flats, first = [], 0
    for run in joined:
        parts = column[first : first + len(run)]
        first += len(run)
        flats.append(_consecutive(parts) if parts else np.zeros(0, dtype=np.int64))
    return flats


_BASE = operator.attrgetter("base")


def _consecutive(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` end to end: a view of the buffer they are all views of, where they lie in
    it one after the other (one read's documents, in order), else a copy."""
    head, tail = parts[0], parts[-1]
    base, total = head.base, sum(map(len, parts))
    if len(parts) == 1:
        return head
    if base is None or head.ndim != 1 or not all(map(operator.is_, map(_BASE, parts), repeat(base))):
        return np.concatenate(parts)
    try:
        buffer = np.frombuffer(base, dtype=np.uint8)
    except (TypeError, ValueError, BufferError):
        return np.concatenate(parts)
    step = head.dtype.itemsize
    offset = head.ctypes.data - buffer.ctypes.data
    contiguous = head.strides == tail.strides == (step,) and tail.dtype == head.dtype
    if not contiguous or tail.ctypes.data + tail.nbytes != head.ctypes.data + total * step or offset < 0:
        return np.concatenate(parts)
    return np.frombuffer(base, dtype=head.dtype, count=total, offset=offset)
