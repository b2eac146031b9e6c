"""A stream of windows whose bytes are fetched ahead in background threads.

``prefetched`` drives any ``AheadReader`` (a dataset's ``WindowReader``, a mixture's
``MixtureReader``): each window is fetched ahead within the reader's ``ReadBudget``
(NOTE [ Read budget ] in budget.py) while the caller takes the samples of the one
before, then decoded in yield order; the reader is closed at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from shardstream.dataset.budget import ReadBudget, fetch_in_turn, fetched_in_order
from shardstream.storage import Prefetcher

__all__ = ["AHEAD_THREADS", "AHEAD_WINDOWS", "AheadReader", "prefetched"]

# On object storage, windows fetched ahead at most, and the threads fetching them (their
# GETs share the worker's read_concurrency; NOTE [ Read budget ] bounds their bytes). A
# thread holds a window from its sidecars to its last byte, and pieces of an unshuffled
# window can be an eighth of the budget (NOTE [ Unshuffled windows in pieces ]): as many
# threads as windows ahead, so the pieces the budget lets go are never short of a thread,
# and those waiting for room have their sidecars in before it comes.
AHEAD_WINDOWS = 8
AHEAD_THREADS = AHEAD_WINDOWS

F = TypeVar("F")


class AheadReader(Protocol[F]):
    """What ``prefetched`` needs of a reader whose fetches give ``F``."""

    prefetch: int  # windows fetched ahead (0: each fetched when it is taken)
    budget: ReadBudget | None  # None: one window ahead, in one thread

    def fetch(
        self,
        window: Any,
        take: Callable[[int], None] | None = None,
        tell: Callable[[int], None] | None = None,
    ) -> F:
        """The bytes of ``window``, ``take(bytes)`` before any is asked for, ``tell(bytes)`` as they arrive."""
        ...

    def in_yield_order(self, window: Any, fetched: F) -> tuple[Any, bool]:
        """The samples of ``window`` in yield order, and whether any is ``None``."""
        ...

    def in_pieces(self, windows: Iterator[Any]) -> Iterator[Any]:
        """``windows`` as the budget takes them (NOTE [ Unshuffled windows in pieces ])."""
        ...

    def check_beside_decoding(self) -> None:
        """Check reads in a thread of the reader's own from now on."""
        ...

    def hold(self, prefetcher: Prefetcher[Any, Any]) -> None:
        """Keep ``prefetcher``, to close it with the reader."""
        ...

    def close(self) -> None: ...


def prefetched(reader: AheadReader[F], windows: Iterator[Any]) -> Iterator[Any]:
    """``(window, samples, holes)`` for each window: fetched (``reader.fetch``) ahead in
    background threads within ``reader.budget``, then put in yield order
    (``reader.in_yield_order``); the reader is closed at the end."""
    if reader.prefetch < 1:
        for window in windows:
            yield (window, *reader.in_yield_order(window, reader.fetch(window)))
        return
    reader.check_beside_decoding()
    budget = reader.budget
    ahead = reader.prefetch if budget is None else max(reader.prefetch, AHEAD_WINDOWS)
    prefetcher: Prefetcher[Any, tuple[F, int]] = Prefetcher(
        lambda job: fetch_in_turn(reader.fetch, budget, *job),
        threads=1 if budget is None else AHEAD_THREADS,
        max_pending=ahead,
    )
    reader.hold(prefetcher)
    windows = reader.in_pieces(windows)
    try:
        yield from fetched_in_order(windows, prefetcher, ahead, budget, reader.in_yield_order)
    finally:
        reader.close()
