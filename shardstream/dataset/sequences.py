"""Packed sequences from a token dataset: the plan's samples are sequences, the shards'
samples are documents.

NOTE [ Reading sequences ]
A token dataset read with ``seq_len`` is planned over per-shard sequence counts (the
"tokens" plan kind, plan/tokens.py): a worker's windows hold runs of sequences of a
shard. Each such window is read as a window of documents: a run of sequences needs the
documents that hold its tokens (``SequenceLayout.run``; with concat, best-fit blocks and
pad these are consecutive), the runs of a shard are joined where their documents touch,
and the document window goes through the ``WindowReader`` as any window does (ranged
reads, the read budget, prefetch, checks, the cache). Its documents in run order are one
flat token array per joined run, the sequences are built from it (``build_sequences``)
and yielded in the sequence window's order. The document window keeps its documents in
run order and is never cut in pieces, so every window read gives back one window of
sequences, in turn. A document the format cannot read cannot be skipped: the sequences
around it would change, so it is an error whatever ``on_error`` says.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.dataset.mixture_reader import STREAM_KEY
from shardstream.errors import FormatError, UsageError
from shardstream.formats.base import SampleColumns
from shardstream.formats.tokens import doc_ends
from shardstream.layout import fit_sidecar_name
from shardstream.manifest import Manifest, sequences_key
from shardstream.plan import Run, Window
from shardstream.tokens import (
    BestFit,
    Packing,
    SequenceLayout,
    SequencePieces,
    SequenceRun,
    build_sequences,
    sequence_layout,
)

__all__ = ["SequenceReader", "TokenShards", "check_token_dataset", "sequence_counts"]

# Shard layouts kept per reader (a window touches a few shards; best-fit layouts hold a
# table of the shard's pieces).
_LAYOUTS = 64


def check_token_dataset(manifest: Manifest, url: str) -> None:
    """``UsageError`` unless ``manifest`` is of a token dataset (``seq_len`` needs one)."""
    if manifest.format != "tokens" or manifest.tokens is None:
        raise UsageError(
            f"seq_len reads packed sequences of a token dataset; this one is {manifest.format!r} "
            "(pack it with `shardstream pack SRC DEST --format tokens --tokenizer T`)",
            url=url,
        )


def sequence_counts(packing: Packing, manifest: Manifest, layouts: Any) -> np.ndarray:
    """The sequences of every shard: recorded in the manifest (NOTE [ Recorded sequences ]),
    or concat's from its token counts; else from each shard's document ends (``layouts(packing)``
    gives ``(layout of shard, close)``, reading sidecars; made only where they are needed)."""
    shards = manifest.shards
    recorded = manifest.sequences.get(sequences_key(packing.mode, packing.seq_len, packing.long_docs))
    if recorded is not None:
        return np.array(recorded, dtype=np.int64)
    if packing.mode == "concat" and all(info.tokens is not None for info in shards):
        tokens = np.fromiter((info.tokens or 0 for info in shards), dtype=np.int64, count=len(shards))
        return tokens // packing.seq_len
    layout, close = layouts(packing)
    try:
        return np.array([layout(shard).count for shard in range(len(shards))], dtype=np.int64)
    finally:
        close()


@dataclass(frozen=True, slots=True)
class TokenShards:
    """The token shards a reader's windows number (one dataset's, or a mixture's streams'
    one after another): each one's path, the number of its first document among all of
    them, its stream (``None``: one dataset), and the id that pads a sequence (its
    stream's end-of-document id, else 0)."""

    paths: tuple[str, ...]
    doc_base: tuple[int, ...]
    streams: tuple[int, ...] | None
    pads: tuple[int, ...]
    fits: tuple[str | None, ...]  # each shard's best-fit sidecar where one was recorded

    @classmethod
    def of(cls, manifests: Sequence[Manifest], packing: Packing, *, mixture: bool = False) -> TokenShards:
        paths, counts, streams, pads, fits = [], [], [], [], []
        for number, manifest in enumerate(manifests):
            eos = manifest.tokens.eos_id if manifest.tokens is not None else None
            fitted = (
                packing.mode == "best_fit"
                and sequences_key("best_fit", packing.seq_len) in manifest.sequences
            )
            for info in manifest.shards:
                paths.append(info.path)
                counts.append(info.samples)
                streams.append(number)
                pads.append(0 if eos is None else int(eos))
                fits.append(fit_sidecar_name(info.path, packing.seq_len) if fitted else None)
        base = np.cumsum(counts, dtype=np.int64) - np.asarray(counts, dtype=np.int64)
        streamed = tuple(streams) if mixture else None
        return cls(tuple(paths), tuple(base.tolist()), streamed, tuple(pads), tuple(fits))


class SequenceReader:
    """Reads windows of sequences through ``reader`` (a ``WindowReader`` of the token
    shards' documents, or a ``MixtureReader`` of several datasets'); NOTE [ Reading
    sequences ]."""

    def __init__(self, reader: Any, packing: Packing, shards: TokenShards) -> None:
        self.reader, self.packing, self.shards = reader, packing, shards
        self._layouts: collections.OrderedDict[int, SequenceLayout] = collections.OrderedDict()

    def layout(self, shard: int) -> SequenceLayout:
        """The sequences of ``shard`` (its sidecar read once, the layout kept a while)."""
        found = self._layouts.get(shard)
        if found is None:
            name, fit_name = self.shards.paths[shard], self.shards.fits[shard]
            fit = (
                None
                if fit_name is None
                else BestFit.from_bytes(self.reader.sidecar(shard, fit_name), name=fit_name)
            )
            found = sequence_layout(self.packing, doc_ends(self.reader.index(shard)), fit=fit, shard=name)
            self._layouts[shard] = found
            while len(self._layouts) > _LAYOUTS:
                self._layouts.popitem(last=False)
        self._layouts.move_to_end(shard)
        return found

    def stream(self, windows: Iterator[Window]) -> Iterator[tuple[Window, WindowSequences, bool]]:
        """``(window, sequences, False)`` for each window of sequences, in yield order."""
        pending: collections.deque[tuple[Window, list[tuple[SequenceRun, int]], list[Run]]] = (
            collections.deque()
        )

        def documents() -> Iterator[Window]:
            for window in windows:
                runs = [(run.shard, self.layout(run.shard).run(run.start, run.stop)) for run in window.runs]
                joined, placed = _joined(runs)
                pending.append((window, placed, joined))
                yield Window(joined, np.arange(sum(len(r) for r in joined), dtype=np.int64))

        for _, docs, holes in self.reader.stream(documents()):
            window, placed, joined = pending.popleft()
            if holes:
                raise FormatError(
                    "a document of a token shard could not be read: its sequences cannot be built"
                )
            listed = docs.samples() if isinstance(docs, SampleColumns) else docs
            flats = _flat_tokens(joined, listed)
            del docs, listed
            yield window, WindowSequences(self, window.order, placed, joined, flats), False

    def build(self, seq_run: SequenceRun, run: Run, tokens: np.ndarray) -> list[dict[str, Any]]:
        """The sequences of ``seq_run`` as samples, from ``tokens``: the tokens of the documents
        of ``run`` (which holds it), end to end."""
        ends = doc_ends(self.reader.index(run.shard))
        token_lo = int(ends[run.start - 1]) if run.start else 0
        arrays = build_sequences(
            seq_run,
            tokens,
            token_lo,
            doc_base=self.shards.doc_base[run.shard],
            pad_id=self.shards.pads[run.shard],
        )
        if self.shards.streams is not None:
            arrays[STREAM_KEY] = np.full(seq_run.count, self.shards.streams[run.shard])
        names = list(arrays)
        return [dict(zip(names, row, strict=True)) for row in zip(*arrays.values(), strict=True)]

    def close(self) -> None:
        self.reader.close()


def _flat_tokens(joined: list[Run], docs: list[Any]) -> list[np.ndarray]:
    """The tokens of each document run, end to end (the window's documents in run order)."""
    flats, first = [], 0
    for run in joined:
        parts = [doc["tokens"] for doc in docs[first : first + len(run)]]
        first += len(run)
        flats.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
    return flats


class WindowSequences(Sequence[dict[str, Any]]):
    """A window's sequences in yield order, made ``_BUILT_TOKENS`` tokens at a time from its tokens
    (the arrays of a window of whole shards at once would be many times its tokens)."""

    def __init__(
        self,
        reader: SequenceReader,
        order: np.ndarray,
        placed: list[tuple[SequenceRun, int]],
        joined: list[Run],
        flats: list[np.ndarray],
    ) -> None:
        self.reader, self.order, self.placed, self.joined, self.flats = reader, order, placed, joined, flats
        counts = np.array([run.count for run, _ in placed], dtype=np.int64)
        self.firsts = np.cumsum(counts) - counts  # where each run's sequences start in the window

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return _Built(self)

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]  # one at a time
        return self.made(np.array([self.order[index]], dtype=np.int64))[0]

    def made(self, positions: np.ndarray) -> list[dict[str, Any]]:
        """The sequences at ``positions`` (of the window's runs end to end), in that order: those
        of one document run built at once (``_picked``)."""
        numbers = np.searchsorted(self.firsts, positions, side="right") - 1
        starts = np.array([run.start for run, _ in self.placed], dtype=np.int64)
        sequences = starts[numbers] + positions - self.firsts[numbers]  # numbered in their shard
        holders = np.array([self.placed[n][1] for n in numbers.tolist()], dtype=np.int64)
        out: list[dict[str, Any]] = [{} for _ in range(len(positions))]
        for at in np.unique(holders).tolist():
            targets = np.flatnonzero(holders == at)
            run = self.joined[at]
            wanted, where = np.unique(sequences[targets], return_inverse=True)
            built = self.reader.build(_picked(self.reader.layout(run.shard), wanted), run, self.flats[at])
            for target, number in zip(targets.tolist(), where.tolist(), strict=True):
                out[target] = dict(built[number])  # a repeat (padding) is a sample of its own
        return out


def _picked(layout: SequenceLayout, wanted: np.ndarray) -> SequenceRun:
    """Sequences ``wanted`` (ascending, of one shard) as one run of them, in that order: the
    pieces of the stretch that spans them, those of other sequences left out."""
    lo, hi = int(wanted[0]), int(wanted[-1]) + 1
    stretch = layout.run(lo, hi)
    rank = np.full(hi - lo, -1, dtype=np.int64)
    rank[wanted - lo] = np.arange(len(wanted), dtype=np.int64)
    seq = rank[stretch.pieces.seq]
    keep = seq >= 0
    p = stretch.pieces
    pieces = SequencePieces(seq[keep], p.doc[keep], p.lo[keep], p.hi[keep], p.more[keep])
    if not len(pieces):
        return SequenceRun(0, len(wanted), stretch.seq_len, (0, 0), (0, 0), pieces)
    tokens = (int(pieces.lo.min()), int((pieces.hi + pieces.more).max()))
    docs = (int(pieces.doc.min()), int(pieces.doc.max()) + 1)
    return SequenceRun(0, len(wanted), stretch.seq_len, docs, tokens, pieces)


_BUILT_TOKENS = 1 << 22  # a window's sequences are built about this many tokens at a time


class _Built:
    """An iterator over ``WindowSequences`` that says how many are left (``__length_hint__``,
    which the dataset's state counts by)."""

    def __init__(self, sequences: WindowSequences) -> None:
        self.sequences, self.at, self.given = sequences, 0, 0
        self.ready: collections.deque[dict[str, Any]] = collections.deque()

    def __iter__(self) -> _Built:
        return self

    def __length_hint__(self) -> int:
        return len(self.sequences) - self.given

    def __next__(self) -> dict[str, Any]:
        if not self.ready:
            many = max(1, _BUILT_TOKENS // self.sequences.reader.packing.seq_len)
            positions = self.sequences.order[self.at : self.at + many]
            if not len(positions):
                raise StopIteration
            self.at += len(positions)
            self.ready.extend(self.sequences.made(np.asarray(positions, dtype=np.int64)))
        self.given += 1
        return self.ready.popleft()


def _joined(runs: list[tuple[int, SequenceRun]]) -> tuple[list[Run], list[tuple[SequenceRun, int]]]:
    """The document runs that hold ``runs`` (a shard's joined where they touch, in order of
    first use), and each sequence run with the number of the document run that holds it."""
    spans: dict[int, list[list[int]]] = {}
    for shard, run in runs:
        if run.count:
            spans.setdefault(shard, []).append([run.docs[0], run.docs[1]])
    joined: list[Run] = []
    where: dict[int, list[tuple[int, int, int]]] = {}
    for shard, found in spans.items():
        found.sort()
        merged = [found[0]]
        for lo, hi in found[1:]:
            if lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        for lo, hi in merged:
            where.setdefault(shard, []).append((lo, hi, len(joined)))
            joined.append(Run(shard, lo, hi))
    placed = []
    for shard, run in runs:
        if run.count:
            at = next(number for lo, hi, number in where[shard] if lo <= run.docs[0] and run.docs[1] <= hi)
            placed.append((run, at))
    return joined, placed
