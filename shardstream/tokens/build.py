"""Packed sequences as arrays, from the tokens that hold a run of them (NOTE [ Building sequences ])."""

from __future__ import annotations

import numpy as np

from shardstream.errors import UsageError
from shardstream.tokens.layout import SequenceRun
from shardstream.tokens.pieces import SequencePieces

__all__ = ["IGNORE_INDEX", "build_sequences"]

IGNORE_INDEX = -100  # a label nothing is predicted at: torch's cross_entropy default

# NOTE [ Building sequences ]
# A run of n sequences of S tokens becomes n rows of each array, with no Python per token:
# - The row is cut into segments: the run's pieces in order, then the row's padding, if
#   any, as a segment of its own. position_ids count from 0 in every segment, document_ids
#   are the dataset's document numbers (-1 over padding), and cu_seqlens (S + 1 int32) are
#   the segments' starts, then S, repeated to the end (zero-length segments, as varlen
#   attention takes them). So the segments of cu_seqlens are exactly the runs of one
#   document_id, and position_ids are 0 exactly at their starts: the three agree.
# - labels are input_ids shifted by one, patched at each piece's last token: the next
#   token of its document where the document goes on, else IGNORE_INDEX; and IGNORE_INDEX
#   over padding. Where the run's pieces are the run's tokens in order with no padding
#   (concat), input_ids are one slice of the tokens; else a gather by piece.


def build_sequences(
    run: SequenceRun, tokens: np.ndarray, token_lo: int, *, doc_base: int = 0, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """The arrays of ``run``'s sequences (NOTE [ Building sequences ]): ``input_ids``,
    ``labels``, ``position_ids`` and ``document_ids`` (n, S) int64 and ``cu_seqlens``
    (n, S + 1) int32. ``tokens`` are the shard's tokens from offset ``token_lo`` on and must
    hold ``run.tokens``; ``doc_base`` is the dataset's number of the shard's first document."""
    size, n = run.seq_len, run.count
    t0, t1 = run.tokens
    if n and (token_lo > t0 or token_lo + len(tokens) < t1):
        raise UsageError(
            f"tokens [{token_lo}, {token_lo + len(tokens)}) do not hold the run's tokens [{t0}, {t1})"
        )
    p = run.pieces
    lengths = p.hi - p.lo
    excl = np.cumsum(lengths) - lengths
    offset = excl - excl[np.searchsorted(p.seq, p.seq, side="left")]  # within the row
    dst = p.seq * size + offset
    fill = np.bincount(p.seq, weights=lengths, minlength=n).astype(np.int64)
    padded = np.flatnonzero(fill < size)
    seg_dst, seg_len, seg_doc, seg_shift = _segments(p, dst, lengths, padded, fill, size, doc_base, token_lo)
    flat = n * size
    contiguous = not len(padded) and (len(p) < 2 or bool((p.lo[1:] == p.hi[:-1]).all()))
    if contiguous and n:
        start = t0 - token_lo
        input_ids = tokens[start : start + flat].astype(np.int64)
    else:
        src = np.repeat(seg_shift, seg_len) + np.arange(flat, dtype=np.int64)
        input_ids = np.take(tokens, src, mode="clip").astype(np.int64)
    labels = np.empty(flat, dtype=np.int64)
    labels[:-1] = input_ids[1:]
    ends = dst + lengths - 1
    if len(ends):
        nxt = np.take(tokens, p.hi - token_lo, mode="clip").astype(np.int64)
        labels[ends] = np.where(p.more, nxt, IGNORE_INDEX)
    if len(padded):
        pad = np.arange(size) >= fill[:, None]
        input_ids.reshape(n, size)[pad] = pad_id
        labels.reshape(n, size)[pad] = IGNORE_INDEX
    return {
        "input_ids": input_ids.reshape(n, size),
        "labels": labels.reshape(n, size),
        "position_ids": (np.arange(flat, dtype=np.int64) - np.repeat(seg_dst, seg_len)).reshape(n, size),
        "document_ids": np.repeat(seg_doc, seg_len).reshape(n, size),
        "cu_seqlens": _cu_seqlens(seg_dst, n, size),
    }


def _segments(
    p: SequencePieces,
    dst: np.ndarray,
    lengths: np.ndarray,
    padded: np.ndarray,
    fill: np.ndarray,
    size: int,
    doc_base: int,
    token_lo: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows' segments in order: ``(flat start, length, document_id, source shift)``."""
    docs = p.doc + doc_base
    shift = p.lo - token_lo - dst
    if not len(padded):
        return dst, lengths, docs, shift
    pad_dst = padded * size + fill[padded]
    at = np.searchsorted(dst, pad_dst)
    return (
        np.insert(dst, at, pad_dst),
        np.insert(lengths, at, size - fill[padded]),
        np.insert(docs, at, -1),
        np.insert(shift, at, -pad_dst),
    )


def _cu_seqlens(seg_dst: np.ndarray, n: int, size: int) -> np.ndarray:
    """(n, S + 1) int32: each row's segment starts, then S repeated."""
    cu = np.full((n, size + 1), size, dtype=np.int32)
    if len(seg_dst):
        row = seg_dst // size
        rank = np.arange(len(seg_dst)) - np.searchsorted(row, row, side="left")
        cu[row, rank] = seg_dst - row * size
    return cu
