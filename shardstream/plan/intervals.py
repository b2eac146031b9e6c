"""Ordered lists of integer intervals ``[start, stop)`` as two int64 arrays.

The plan never holds one index per sample of a shard or a slice; it holds intervals,
and only a window (bounded by the shuffle window) is ever expanded into points.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]

EMPTY: Intervals = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def total(spans: Intervals) -> int:
    return int((spans[1] - spans[0]).sum())


def shift(spans: Intervals, offset: int) -> Intervals:
    return spans[0] + offset, spans[1] + offset


def concat(parts: list[Intervals]) -> Intervals:
    if not parts:
        return EMPTY
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def merge(spans: Intervals) -> Intervals:
    """Drop empty intervals and join each one to the next where it ends as that starts."""
    starts, stops = spans
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    if starts.size <= 1:
        return starts, stops
    first = np.ones(starts.size, dtype=bool)
    first[1:] = starts[1:] != stops[:-1]
    last = np.ones(starts.size, dtype=bool)
    last[:-1] = first[1:]
    return starts[first], stops[last]


def from_points(values: np.ndarray) -> Intervals:
    """Intervals covering ``values`` (int64), in their order, one per run of +1 steps."""
    if values.size == 0:
        return EMPTY
    first = np.ones(values.size, dtype=bool)
    first[1:] = values[1:] != values[:-1] + 1
    last = np.ones(values.size, dtype=bool)
    last[:-1] = first[1:]
    return values[first], values[last] + 1


def points(spans: Intervals) -> np.ndarray:
    """Every integer of the intervals, in order (callers keep this to one window)."""
    starts, stops = spans
    lengths = stops - starts
    if lengths.size == 0:
        return np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(lengths.size), lengths)
    first = np.cumsum(lengths) - lengths
    return starts[owner] + (np.arange(int(lengths.sum()), dtype=np.int64) - first[owner])


def select(spans: Intervals, lo: int, hi: int) -> Intervals:
    """The integers ranked ``[lo, hi)`` of the concatenated intervals, as intervals."""
    starts, stops = spans
    ends = np.cumsum(stops - starts)
    begins = ends - (stops - starts)
    cut_lo = np.clip(lo - begins, 0, None)
    cut_hi = np.clip(ends - hi, 0, None)
    return merge((starts + cut_lo, stops - cut_hi))


def compose(query: Intervals, rank_starts: np.ndarray, targets: np.ndarray, lengths: np.ndarray) -> Intervals:
    """Map ``query`` intervals of a ranked space through pieces to a target space.

    Piece ``i`` maps ranks ``[rank_starts[i], rank_starts[i] + lengths[i])`` to
    ``[targets[i], targets[i] + lengths[i])``; the pieces are sorted by rank and cover
    every queried rank. The result keeps the query's order.
    """
    q_starts, q_stops = merge(query)
    if q_starts.size == 0:
        return EMPTY
    first = np.searchsorted(rank_starts, q_starts, side="right") - 1
    last = np.searchsorted(rank_starts, q_stops - 1, side="right") - 1
    count = last - first + 1
    owner = np.repeat(np.arange(q_starts.size), count)
    piece = first[owner] + (np.arange(int(count.sum())) - (np.cumsum(count) - count)[owner])
    lo = np.maximum(q_starts[owner], rank_starts[piece])
    hi = np.minimum(q_stops[owner], rank_starts[piece] + lengths[piece])
    begin = targets[piece] + (lo - rank_starts[piece])
    return merge((begin, begin + (hi - lo)))
