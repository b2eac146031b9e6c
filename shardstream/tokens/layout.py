"""A shard's packed sequences: how many, and which tokens each is made of (NOTE [ Packed sequences ])."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from shardstream.errors import FormatError, PlanError, UsageError
from shardstream.tokens.bestfit import best_fit
from shardstream.tokens.fitfile import BestFit
from shardstream.tokens.packing import Packing
from shardstream.tokens.pieces import SequencePieces, check_ends, ragged_arange, split_documents

# NOTE [ Packed sequences ]
# A packed sequence of seq_len tokens is the plan's sample: the plan runs over the
# sequence count of each shard (a sequence never crosses a shard), and a reader maps a run
# of consecutive sequences [start, stop) of a shard to the contiguous tokens that hold them
# (``SequenceRun.tokens``, documents ``SequenceRun.docs``), reads them with one ranged read,
# and builds the sequences (build.py). A sequence is made of pieces, each a slice of one
# document; its label at a piece's last token is the next token of that document where the
# document goes on (concat cuts a document at every sequence end, best_fit cuts the
# documents longer than seq_len), else -100, so a run reads at most one token past its
# last piece. Every mode gives the same pieces for a sequence however the run around it
# was cut, so a sequence built alone equals the one built in any run.
# - concat: tokens [o + i*S, o + (i+1)*S) of the shard, o the offset (0 unless a dataset
#   draws one per epoch, up to what is dropped); what is left over is dropped, and counted.
# - best_fit: the bins of NOTE [ Best-fit bins ] (bestfit.py), read from a sidecar or made
#   when the layout is; a run needs the blocks it touches.
# - pad: the pieces of seq_len tokens of each document in order, one per sequence; with
#   long_docs="truncate" only each document's first (the rest dropped, and counted).
# Empty documents have no piece, in any mode.


@dataclass(frozen=True, slots=True, eq=False)
class SequenceRun:
    """Sequences ``[start, stop)`` of a shard: the documents ``docs`` and tokens ``tokens``
    (half-open ranges, numbered in the shard) that hold them, and their pieces (``found``
    where the layout found them to tell those ranges; else ``layout`` finds them when
    asked: a dataset's window needs only the ranges, NOTE [ Packed sequences ])."""

    start: int
    stop: int
    seq_len: int
    docs: tuple[int, int]
    tokens: tuple[int, int]
    found: SequencePieces | None = None
    layout: SequenceLayout | None = None

    @property
    def count(self) -> int:
        return self.stop - self.start

    @property
    def pieces(self) -> SequencePieces:
        if self.found is not None:
            return self.found
        if self.layout is None or not self.count:
            none = np.zeros(0, dtype=np.int64)
            return SequencePieces(none, none, none, none, none > 0)
        return self.layout.take(np.arange(self.start, self.stop, dtype=np.int64))


class SequenceLayout(Protocol):
    """A shard's sequences under one ``Packing``."""

    @property
    def packing(self) -> Packing: ...

    @property
    def count(self) -> int:
        """The sequences in the shard."""

    @property
    def dropped(self) -> int:
        """The shard's tokens in no sequence (concat's tail, what truncate cuts)."""

    def run(self, start: int, stop: int) -> SequenceRun:
        """Sequences ``[start, stop)``: where they are and their pieces."""

    def take(self, sequences: np.ndarray) -> SequencePieces:
        """The pieces of ``sequences`` (of the shard; any order, repeats too), those of
        ``sequences[i]`` placed in sequence ``i``: the pieces ``run`` gives each of them."""


def sequence_layout(
    packing: Packing,
    ends: np.ndarray,
    *,
    fit: BestFit | None = None,
    offset: int = 0,
    shard: str | None = None,
) -> SequenceLayout:
    """The sequences of a shard whose documents end at ``ends`` (int64 token offsets).

    ``fit`` is the shard's best-fit sidecar (``BestFit.from_bytes``) for ``best_fit``; without
    one the bins are made here (a pure function, NOTE [ Best-fit bins ]). ``offset`` (concat
    only, 0 to ``dropped``) is how many of the tokens concat drops come before its first
    sequence: a dataset may draw it per (seed, epoch, shard), so documents are cut in other
    places every epoch and the dropped tail is another one; the count is the same."""
    ends = check_ends(ends, shard=shard)
    if packing.mode == "concat":
        layout = ConcatLayout(packing, ends, int(offset))
        if not 0 <= offset <= layout.dropped:
            raise PlanError(f"concat offset {offset} is outside [0, {layout.dropped}]", shard=shard)
        return layout
    if offset:
        raise UsageError(f"an offset applies to packing='concat' only, not {packing.mode!r}")
    if packing.mode == "pad":
        doc, lo, hi = split_documents(ends, packing.seq_len)
        if packing.long_docs == "truncate":
            keep = np.ones(len(doc), dtype=bool)
            keep[1:] = doc[1:] != doc[:-1]
            doc, lo, hi = doc[keep], lo[keep], hi[keep]
        return PieceLayout.of(packing, ends, (doc, lo, hi), np.arange(len(doc)), np.arange(len(doc) + 1))
    if fit is None:
        fit = best_fit(ends, packing.seq_len)
    else:
        fit.check(ends, packing.seq_len, name=shard)
    doc, lo, hi = split_documents(ends, packing.seq_len, fit.cuts)
    if len(doc) != len(fit.order) or (
        len(doc) and (np.add.reduceat((hi - lo)[fit.order], fit.first[:-1]) > packing.seq_len).any()
    ):
        raise FormatError(
            "best-fit sidecar's sequences do not fit the shard's documents: rebuild it", shard=shard
        )
    return PieceLayout.of(packing, ends, (doc, lo, hi), fit.order, fit.first)


def count_sequences(packing: Packing, ends: np.ndarray, *, fit: BestFit | None = None) -> int:
    """The sequences of a shard under ``packing``, without laying them out: concat's is its
    tokens // seq_len, pad's one per piece (or per non-empty document), best_fit's its bins
    (``fit``'s, else made here)."""
    ends = check_ends(ends)
    size = packing.seq_len
    if packing.mode == "concat":
        return (int(ends[-1]) if len(ends) else 0) // size
    if packing.mode == "pad":
        lengths = np.diff(ends, prepend=0)
        return int(
            np.count_nonzero(lengths) if packing.long_docs == "truncate" else (-(-lengths // size)).sum()
        )
    if fit is None:
        return best_fit(ends, size).count
    fit.check(ends, size)
    return fit.count


def _check_run(start: int, stop: int, count: int) -> None:
    if not 0 <= start <= stop <= count:
        raise PlanError(f"sequences [{start}, {stop}) are outside the shard's {count}")


def _empty(packing: Packing, start: int) -> SequenceRun:
    return SequenceRun(start, start, packing.seq_len, (0, 0), (0, 0))


def _check_taken(sequences: np.ndarray, count: int) -> np.ndarray:
    wanted = np.asarray(sequences, dtype=np.int64)
    if len(wanted) and (int(wanted.min()) < 0 or int(wanted.max()) >= count):
        raise PlanError(f"sequences {int(wanted.min())}..{int(wanted.max())} are outside the shard's {count}")
    return wanted


def _run(packing: Packing, ends: np.ndarray, start: int, stop: int, pieces: SequencePieces) -> SequenceRun:
    """The run of ``pieces`` with its token and document ranges."""
    if not len(pieces):
        return _empty(packing, start)
    t0 = int(pieces.lo.min())
    t1 = int((pieces.hi + pieces.more).max())
    return SequenceRun(start, stop, packing.seq_len, _held(ends, t0, t1), (t0, t1), pieces)


def _held(ends: np.ndarray, t0: int, t1: int) -> tuple[int, int]:
    """The documents that hold tokens ``[t0, t1)`` (not empty)."""
    d0, d1 = np.searchsorted(ends, [t0, t1 - 1], side="right")
    return int(d0), int(d1) + 1


@dataclass(frozen=True, slots=True, eq=False)
class ConcatLayout:
    """concat: sequence ``i`` is tokens ``[offset + i*S, offset + (i+1)*S)``, its pieces found
    when asked."""

    packing: Packing
    ends: np.ndarray
    offset: int = 0
    cuts: np.ndarray = field(init=False, repr=False)  # the distinct document ends

    def __post_init__(self) -> None:
        ends = self.ends
        distinct = np.ones(len(ends), dtype=bool)
        distinct[1:] = ends[1:] != ends[:-1]
        object.__setattr__(self, "cuts", ends[distinct])

    @property
    def count(self) -> int:
        return self._total // self.packing.seq_len

    @property
    def dropped(self) -> int:
        return self._total - self.count * self.packing.seq_len

    @property
    def _total(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def run(self, start: int, stop: int) -> SequenceRun:
        """Its ranges from the run's ends alone, its pieces found only when asked: a window
        of a dataset lays out every run of its own and of the windows it lends to, and
        needs only where their tokens are."""
        _check_run(start, stop, self.count)
        if start == stop:
            return _empty(self.packing, start)
        size = self.packing.seq_len
        t0, hi = self.offset + start * size, self.offset + stop * size
        at = int(np.searchsorted(self.cuts, hi))
        # the last token's document goes on past the run unless one ends there: its label is read too
        t1 = hi + int(at == len(self.cuts) or int(self.cuts[at]) != hi)
        return SequenceRun(start, stop, size, _held(self.ends, t0, t1), (t0, t1), layout=self)

    def take(self, sequences: np.ndarray) -> SequencePieces:
        return self._pieces(_check_taken(sequences, self.count))

    def _pieces(self, wanted: np.ndarray) -> SequencePieces:
        """Sequence ``wanted[i]`` is tokens ``[lo, lo + S)``, cut at every document end inside."""
        size, ends, cuts = self.packing.seq_len, self.ends, self.cuts
        lo_tok = self.offset + wanted * size
        inner = np.searchsorted(cuts, lo_tok, side="right")
        count = np.searchsorted(cuts, lo_tok + size, side="left") - inner + 1  # pieces of each
        seq = np.repeat(np.arange(len(wanted), dtype=np.int64), count)
        nth = ragged_arange(count)
        cut = np.repeat(inner, count) + nth  # the end of each piece but the last of its sequence
        last = np.zeros(len(seq), dtype=bool)
        last[np.cumsum(count) - 1] = True
        hi = np.where(last, np.repeat(lo_tok + size, count), np.take(cuts, cut, mode="clip"))
        lo = np.where(nth == 0, np.repeat(lo_tok, count), np.take(cuts, cut - 1, mode="clip"))
        doc = np.searchsorted(ends, lo, side="right")
        return SequencePieces(seq, doc, lo, hi, hi < ends[doc])


@dataclass(frozen=True, slots=True, eq=False)
class PieceLayout:
    """best_fit and pad: a table of the shard's pieces, sequence ``i`` being pieces
    ``order[first[i]:first[i + 1]]``."""

    packing: Packing
    ends: np.ndarray
    doc: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    order: np.ndarray
    first: np.ndarray

    @classmethod
    def of(
        cls,
        packing: Packing,
        ends: np.ndarray,
        pieces: tuple[np.ndarray, ...],
        order: np.ndarray,
        first: np.ndarray,
    ) -> PieceLayout:
        doc, lo, hi = pieces
        return cls(packing, ends, doc, lo, hi, order, first)

    @property
    def count(self) -> int:
        return len(self.first) - 1

    @property
    def dropped(self) -> int:
        total = int(self.ends[-1]) if len(self.ends) else 0
        return total - int((self.hi - self.lo).sum())

    def run(self, start: int, stop: int) -> SequenceRun:
        _check_run(start, stop, self.count)
        index = self.order[self.first[start] : self.first[stop]]
        seq = np.repeat(np.arange(stop - start, dtype=np.int64), np.diff(self.first[start : stop + 1]))
        return _run(self.packing, self.ends, start, stop, self._pieces(index, seq))

    def take(self, sequences: np.ndarray) -> SequencePieces:
        wanted = _check_taken(sequences, self.count)
        firsts = self.first[wanted]
        count = self.first[wanted + 1] - firsts
        index = self.order[np.repeat(firsts, count) + ragged_arange(count)]
        return self._pieces(index, np.repeat(np.arange(len(wanted), dtype=np.int64), count))

    def _pieces(self, index: np.ndarray, seq: np.ndarray) -> SequencePieces:
        doc, hi = self.doc[index], self.hi[index]
        return SequencePieces(seq, doc, self.lo[index], hi, hi < self.ends[doc])
