"""Best-fit-decreasing bins of a shard's documents (NOTE [ Best-fit bins ]): a pure function
of the document ends and the sequence length."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

import numpy as np

from shardstream.errors import UsageError
from shardstream.tokens.fitfile import BestFit, ends_crc
from shardstream.tokens.pieces import check_ends, split_range

# NOTE [ Best-fit bins ]
# Sequences of best_fit are bins of best-fit-decreasing (BFD): a shard's documents, cut in
# pieces of at most seq_len tokens, taken longest first, each into the open bin with the
# least room that holds it, or a new bin. Three things make it fit a streaming reader:
# - Blocks. BFD runs within blocks of consecutive tokens, about BLOCK_TOKENS each (the
#   shard's tokens shared evenly), and a block's bins are consecutive sequences. A run of
#   sequences then needs the tokens of the blocks it touches, one contiguous range (one
#   ranged read), where a bin of a whole-shard BFD mixes documents from anywhere in it.
# - The end of a block. What BFD cannot fill is the room left in the bins where no piece
#   fits, plus the room of its emptiest bin: a block's last bin. The first is small where
#   short documents are plentiful; the second is up to a whole sequence per block. So a
#   block ends at the document end near its share (within 1/_CUT_WINDOW) that leaves its
#   bins room for a little more than the first (estimated from the block before, and
#   retried once with what a try found, the try that left less kept), and the room left
#   in its emptiest bin is then filled with the tokens that follow, in order: whole
#   documents and the head of the next one, which is cut there (a cut the sidecar records;
#   its rest starts the next block). So a block wastes only what BFD leaves in its full
#   bins, and the shard one more partly filled sequence at its end; one document per
#   block is cut where it would not otherwise be.
# - Counts, not documents. BFD only asks "the smallest room at least x": bins are kept in
#   stacks by their room (a sorted list of the rooms that have bins), and the pieces of one
#   length are placed together: a bin with room c takes c // x of them at once (it stays
#   the smallest room that fits until it is below x), so the work is per length and per
#   room touched, list slices moving whole stacks, not per document. It is an exact BFD
#   (bins of one room taken from their stack's top), so the padding is BFD's.
BLOCK_TOKENS = 1 << 25
_CUT_WINDOW = 8
_TRIES = 2
_MARGIN = 4  # a block's bins get room for a quarter sequence more than the gaps expected


def best_fit(ends: np.ndarray, seq_len: int, *, block_tokens: int = BLOCK_TOKENS) -> BestFit:
    """The best-fit bins of a shard whose documents end at ``ends`` (NOTE [ Best-fit bins ])."""
    ends = check_ends(ends)
    if block_tokens < seq_len:
        raise UsageError(f"block_tokens ({block_tokens}) must be at least seq_len ({seq_len})")
    total = int(ends[-1]) if len(ends) else 0
    start, nbins, gaps = 0, 0, seq_len // 4
    parts, stops = [], []
    for left in range(max(1, round(total / block_tokens)), 0, -1):
        if start >= total:
            break
        start, bins, gaps = _block(ends, start, seq_len, left, gaps)
        parts.append(bins + nbins)
        nbins += int(bins.max(initial=-1)) + 1
        stops.append(start)
    stops_array = np.asarray(stops[:-1], dtype=np.int64)
    at = np.minimum(np.searchsorted(ends, stops_array), len(ends) - 1)
    cuts = stops_array[ends[at] != stops_array]
    bins = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    first = np.zeros(nbins + 1, dtype=np.int64)
    np.cumsum(np.bincount(bins, minlength=nbins), out=first[1:])
    order = np.argsort(bins, kind="stable")
    return BestFit(seq_len, block_tokens, len(ends), total, ends_crc(ends), cuts, order, first)


def _block(ends: np.ndarray, start: int, seq_len: int, left: int, gaps: int) -> tuple[int, np.ndarray, int]:
    """The block from token ``start``, ``left`` blocks (this one too) before the shard's end:
    ``(where the next one starts, the bin of each of its pieces, its gaps)``, ``gaps`` being
    what BFD left unfilled in its full bins (NOTE [ Best-fit bins ])."""
    best: tuple[int, np.ndarray, np.ndarray, int] = (start, np.zeros(0, dtype=np.int64), np.zeros(0), 0)
    for attempt in range(_TRIES):
        stop = _cut(ends, start, seq_len, left, gaps)
        _, lo, hi = split_range(ends, seq_len, start, stop)
        sizes = hi - lo
        bins = _bfd(sizes, seq_len)
        room = seq_len - np.bincount(bins, weights=sizes).astype(np.int64)
        found = int(room.sum() - room.max(initial=0))
        if not attempt or found < best[3]:
            best = (stop, bins, room, found)
        if left == 1 or room.sum() < seq_len:  # no choice, or no bin more than the tokens need
            break
        gaps = found
    stop, bins, room, found = best
    if left == 1 or not len(room):
        return stop, bins, found
    emptiest = int(np.argmax(room))
    fill = min(stop + int(room[emptiest]), int(ends[-1]))
    filled = len(split_range(ends, seq_len, stop, fill)[0]) if fill > stop else 0
    return fill, np.concatenate([bins, np.full(filled, emptiest, dtype=np.int64)]), found


def _cut(ends: np.ndarray, start: int, seq_len: int, left: int, gaps: int) -> int:
    """The end (a document end, in tokens) of the block from ``start``, ``left`` blocks before
    the shard's end: an equal share of the tokens left, give or take 1/_CUT_WINDOW, whose
    pieces leave the bins room for about ``gaps`` tokens and little more."""
    total = int(ends[-1])
    if left == 1:
        return total
    size = (total - start) // left
    window = size // _CUT_WINDOW
    lo, hi = np.searchsorted(ends, [start + size - window, start + size + window], side="right")
    candidates = ends[lo:hi]
    candidates = candidates[(candidates > start) & (candidates < total)]
    if not len(candidates):  # one document spans the window: end after it
        return int(ends[min(int(lo), len(ends) - 1)])
    room = (start - candidates) % seq_len
    want = gaps + seq_len // _MARGIN
    return int(candidates[np.argmin(np.where(room >= want, room - want, seq_len + room))])


def _bfd(sizes: np.ndarray, seq_len: int) -> np.ndarray:
    """The bin of each piece of ``sizes`` by best-fit-decreasing (NOTE [ Best-fit bins ])."""
    order = np.argsort(-sizes, kind="stable")
    ordered = sizes[order]
    if not len(ordered):
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.diff(ordered, prepend=ordered[0] + 1))
    counts = np.diff(np.append(starts, len(ordered)))
    takers, takes = _place(zip(ordered[starts].tolist(), counts.tolist(), strict=True), seq_len)
    bins = np.empty(len(sizes), dtype=np.int64)
    bins[order] = np.repeat(np.asarray(takers, dtype=np.int64), takes)
    return bins


def _place(groups: Iterable[tuple[int, int]], seq_len: int) -> tuple[list[int], list[int]]:
    """BFD over ``(length, how many)`` groups, longest first: ``(takers, takes)``, bin
    ``takers[j]`` taking the next ``takes[j]`` pieces in that order."""
    stacks: dict[int, list[int]] = {}  # room -> bins with that room
    rooms: list[int] = []  # the keys of stacks, sorted
    takers: list[int] = []
    takes: list[int] = []
    nbins = 0

    def put(room: int, bins: list[int]) -> None:
        if room and bins:
            stack = stacks.get(room)
            if stack is None:
                stacks[room] = list(bins)
                insort(rooms, room)
            else:
                stack.extend(bins)

    for x, k in groups:
        while k:
            i = bisect_left(rooms, x)
            if i == len(rooms):  # no bin holds x: new bins, each taking seq_len // x
                q = seq_len // x
                full, r = divmod(k, q)
                moved = list(range(nbins, nbins + full + (r > 0)))
                nbins += len(moved)
                c = seq_len
            else:
                c = rooms[i]
                stack = stacks[c]
                q, n = c // x, len(stack)
                full, r = divmod(min(k, n * q), q)
                take = full + (r > 0)
                moved = stack[n - take :]
                del stack[n - take :]
                if not stack:
                    del stacks[c], rooms[i]
            takers.extend(moved)
            takes.extend([q] * full)
            put(c - q * x, moved[:full])
            if r:
                takes.append(r)
                put(c - r * x, moved[full:])
            k -= full * q + r
    return takers, takes
