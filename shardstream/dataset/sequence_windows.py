"""A window of packed sequences in yield order, built a block of rows at a time from the
tokens of its document runs (NOTE [ Reading sequences ] in sequences.py, NOTE [ Building
sequences ] in tokens/build.py)."""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from shardstream.dataset.mixture_reader import STREAM_KEY
from shardstream.formats.tokens import doc_ends
from shardstream.plan import Run
from shardstream.tokens import Packing, SequenceLayout, SequencePieces, SequenceRun
from shardstream.tokens.build import Rows, needs_segments

__all__ = ["SequenceLayouts", "WindowSequences"]


class SequenceLayouts(Protocol):
    """What a window of sequences is built with (a ``SequenceReader``): the reader of its
    documents (``index``), the packing, the shards' numbering, the arrays a sequence
    carries and each shard's layout."""

    reader: Any
    packing: Packing
    shards: Any
    fields: tuple[str, ...]

    def layout(self, shard: int) -> SequenceLayout: ...


class WindowSequences(Sequence[dict[str, Any]]):
    """A window's sequences in yield order, made ``_BUILT_TOKENS`` tokens at a time from its
    tokens (the arrays of a window of whole shards at once would be many times its tokens),
    a block of ``_BLOCK_TOKENS`` at a time (NOTE [ Building sequences ])."""

    def __init__(
        self,
        reader: SequenceLayouts,
        order: np.ndarray,
        placed: list[tuple[SequenceRun, int]],
        joined: list[Run],
        flats: list[np.ndarray],
    ) -> None:
        self.reader, self.order, self.joined, self.flats = reader, order, joined, flats
        counts = np.array([run.count for run, _ in placed], dtype=np.int64)
        self.firsts = np.cumsum(counts) - counts  # where each run's sequences start in the window
        self.starts = np.array([run.start for run, _ in placed], dtype=np.int64)
        self.holders = np.array([holder for _, holder in placed], dtype=np.int64)
        shards = reader.shards
        self.token_lo = np.array(  # where each document run's tokens start in its shard
            [int(doc_ends(reader.reader.index(r.shard))[r.start - 1]) if r.start else 0 for r in joined],
            dtype=np.int64,
        )
        self.shards = np.array([run.shard for run in joined], dtype=np.int64)  # each document run's
        self.doc_base = np.array([shards.doc_base[run.shard] for run in joined], dtype=np.int64)
        self.pads = np.array([shards.pads[run.shard] for run in joined], dtype=np.int64)
        streams = shards.streams
        self.streams = None if streams is None else np.array([streams[run.shard] for run in joined])

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return _Built(self)

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]  # one at a time
        return self.made(np.array([self.order[index]], dtype=np.int64))[0]

    def made(self, positions: np.ndarray) -> list[dict[str, Any]]:
        """The sequences at ``positions`` (of the window's runs end to end), in that order."""
        rows, streams = self.rows(positions)
        return _samples(rows.build(0, rows.count, self.reader.fields), streams)

    def rows(self, positions: np.ndarray, block: int | None = None) -> tuple[Rows, np.ndarray | None]:
        """What the sequences at ``positions`` are made of (a row each, in that order; a repeat
        is a row of its own), and each one's stream where the window mixes several."""
        numbers = np.searchsorted(self.firsts, positions, side="right") - 1
        sequences = self.starts[numbers] + positions - self.firsts[numbers]  # numbered in their shard
        holders = self.holders[numbers]
        shards = self.shards[holders]
        parts = []
        for shard in np.unique(shards).tolist():  # one take per shard, whatever runs hold it
            targets = np.flatnonzero(shards == shard)
            p = self.reader.layout(shard).take(sequences[targets])
            held = holders[targets[p.seq]]
            parts.append((targets[p.seq], p.doc + self.doc_base[held], p.lo, p.hi, p.more, held))
        if parts:
            row, doc, lo, hi, more, source = (np.concatenate(column) for column in zip(*parts, strict=True))
            ordered = np.argsort(row, kind="stable")  # a row's pieces come from one holder, in order
            row, doc, lo, hi, more, source = (a[ordered] for a in (row, doc, lo, hi, more, source))
        else:
            row = doc = lo = hi = source = np.zeros(0, dtype=np.int64)
            more = row > 0
        pieces = SequencePieces(row, doc, lo, hi, more)
        size = self.reader.packing.seq_len
        offset, pads = self.token_lo[source], self.pads[holders]
        segments = needs_segments(self.reader.fields)
        rows = Rows.of(
            len(positions), size, pieces, self.flats, source, offset, pads, block=block, segments=segments
        )
        return rows, None if self.streams is None else self.streams[holders]


def _samples(arrays: dict[str, np.ndarray], streams: np.ndarray | None) -> list[dict[str, Any]]:
    """A dict per row of ``arrays`` (views of its rows, under the same names), with its
    stream where it has one."""
    rows = _dicts(tuple(arrays), list(arrays.values()))
    if streams is not None:
        for row, stream in zip(rows, streams, strict=True):
            row[STREAM_KEY] = stream
    return rows


def _dicts(names: tuple[str, ...], columns: list[np.ndarray]) -> list[dict[str, Any]]:
    """A dict per row of ``columns``, ``names[i]`` holding that row of ``columns[i]``: dict
    displays for input_ids and labels alone and for all five arrays (the usual choices; a
    display costs less per row than a dict made from a zip), a zip for the other choices."""
    if len(names) == 2:
        a, b = names
        return [{a: x, b: y} for x, y in zip(*columns, strict=True)]
    if len(names) == 5:
        a, b, c, d, e = names
        return [{a: v, b: w, c: x, d: y, e: z} for v, w, x, y, z in zip(*columns, strict=True)]
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


# A layout costs a step per run of the window that its rows hit, whatever its size: fewer,
# larger layouts, whose tables are still small beside the tokens they lay out.
_BUILT_TOKENS = 1 << 23  # a window's sequences are laid out about this many tokens at a time
_BLOCK_TOKENS = 1 << 16  # and built this many at a time, in one allocation


class _Built:
    """An iterator over ``WindowSequences`` that says how many are left (``__length_hint__``,
    which the dataset's state counts by)."""

    def __init__(self, sequences: WindowSequences) -> None:
        self.sequences, self.at, self.given = sequences, 0, 0
        self.ready: collections.deque[dict[str, Any]] = collections.deque()
        self.rows: Rows | None = None
        self.streams: np.ndarray | None = None
        self.row = 0
        size = sequences.reader.packing.seq_len
        self.chunk, self.block = max(1, _BUILT_TOKENS // size), max(1, _BLOCK_TOKENS // size)

    def __iter__(self) -> _Built:
        return self

    def __length_hint__(self) -> int:
        return len(self.sequences) - self.given

    def __next__(self) -> dict[str, Any]:
        if not self.ready:
            self._fill()
        self.given += 1
        return self.ready.popleft()

    def _fill(self) -> None:
        if self.rows is None or self.row == self.rows.count:
            positions = self.sequences.order[self.at : self.at + self.chunk]
            if not len(positions):
                raise StopIteration
            self.at += len(positions)
            self.rows, self.streams = self.sequences.rows(np.asarray(positions, dtype=np.int64), self.block)
            self.row = 0
        start, stop = self.row, min(self.row + self.block, self.rows.count)
        self.row = stop
        streams = None if self.streams is None else self.streams[start:stop]
        self.ready.extend(_samples(self.rows.build(start, stop, self.sequences.reader.fields), streams))
