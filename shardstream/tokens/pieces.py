"""Document ends and the pieces cut from them: the arrays every layout is made of."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardstream.errors import FormatError, UsageError


@dataclass(frozen=True, slots=True)
class SequencePieces:
    """The pieces of a run of sequences, in order: piece ``k`` is tokens ``[lo[k], hi[k])``
    of document ``doc[k]`` (shard offsets, the document numbered in its shard) and sits in
    sequence ``seq[k]`` (counted from the run's first) after the pieces before it there.
    ``more[k]`` says the document goes on after ``hi[k]``, so the piece's last label is the
    token at ``hi[k]`` rather than -100."""

    seq: np.ndarray
    doc: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    more: np.ndarray

    def __len__(self) -> int:
        return len(self.doc)

    def take(self, index: np.ndarray | slice, seq: np.ndarray) -> SequencePieces:
        """The pieces at ``index``, placed in the sequences ``seq``."""
        return SequencePieces(seq, self.doc[index], self.lo[index], self.hi[index], self.more[index])


def check_ends(ends: np.ndarray, *, shard: str | None = None) -> np.ndarray:
    """``ends`` as int64 document end offsets (non-decreasing, from 0), else FormatError."""
    array = np.asarray(ends)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise UsageError(
            f"document ends must be a 1-d integer array, not {array.dtype} of shape {array.shape}"
        )
    array = array.astype(np.int64, copy=False)
    if array.size and (array[0] < 0 or (np.diff(array) < 0).any()):
        first = 0 if array[0] < 0 else int(np.flatnonzero(np.diff(array) < 0)[0]) + 1
        raise FormatError(f"document ends go backwards at document {first}", shard=shard)
    return array


def ragged_arange(counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(c) for c in counts])`` without a Python loop."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    firsts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(firsts, counts)


def split_documents(ends: np.ndarray, seq_len: int, cuts: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """``(doc, lo, hi)``: the documents cut into pieces of at most ``seq_len`` tokens, in order.
    A document is cut at ``cuts`` (token offsets) too, and counts its pieces of ``seq_len``
    afresh after each; empty documents have none."""
    bounds = ends
    if cuts is not None and len(cuts):
        at = np.searchsorted(ends, cuts)
        new = (at == len(ends)) | (ends[np.minimum(at, len(ends) - 1)] != cuts)
        bounds = np.insert(ends, at[new], cuts[new])
    total = int(ends[-1]) if len(ends) else 0
    return _split(ends, bounds[(bounds > 0) & (bounds <= total)], 0, seq_len)


def split_range(ends: np.ndarray, seq_len: int, lo: int, hi: int) -> tuple[np.ndarray, ...]:
    """The pieces of ``split_documents(ends, seq_len, cuts)`` in tokens ``[lo, hi)`` where
    ``lo`` and ``hi`` are document ends or cuts, and no other cut lies between them."""
    first, last = np.searchsorted(ends, [lo, hi], side="right")
    bounds = ends[first:last]
    if not len(bounds) or bounds[-1] != hi:
        bounds = np.append(bounds, hi)
    return _split(ends, bounds, lo, seq_len)


def _split(ends: np.ndarray, bounds: np.ndarray, start: int, seq_len: int) -> tuple[np.ndarray, ...]:
    """The pieces of the segments ``[start, bounds[0]), [bounds[0], bounds[1]), ...``."""
    seg_lo = np.concatenate([[start], bounds])[:-1].astype(np.int64)
    counts = -(-(bounds - seg_lo) // seq_len)
    doc = np.repeat(np.searchsorted(ends, seg_lo, side="right"), counts)
    lo = np.repeat(seg_lo, counts) + ragged_arange(counts) * seq_len
    hi = np.minimum(lo + seq_len, np.repeat(bounds, counts))
    return doc, lo, hi
