"""Packed sequences as arrays, from the tokens that hold a run of them (NOTE [ Building sequences ])."""

from __future__ import annotations

import numpy as np

from shardstream.errors import UsageError
from shardstream.tokens.layout import SequenceRun
from shardstream.tokens.pieces import SequencePieces

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
    dst = p.seq * size + excl - excl[np.searchsorted(p.seq, p.seq, side="left")]  # flat starts
    fill = np.bincount(p.seq, weights=lengths, minlength=n).astype(np.int64)
    padded = np.flatnonzero(fill < size)
    seg_dst, seg_len, seg_doc = _segments(p, dst, lengths, padded, fill, size, doc_base)
    input_ids = _input_ids(p, dst, lengths, tokens, token_lo, n * size, contiguous=not len(padded))
    labels = np.empty(n * size, dtype=np.int64)
    labels[:-1] = input_ids[1:]
    if len(p):
        after = np.take(tokens, p.hi - token_lo, mode="clip").astype(np.int64)
        labels[dst + lengths - 1] = np.where(p.more, after, IGNORE_INDEX)
    rows_in, rows_labels = input_ids.reshape(n, size), labels.reshape(n, size)
    for row, filled in zip(padded.tolist(), fill[padded].tolist(), strict=True):
        rows_in[row, filled:] = pad_id
        rows_labels[row, filled:] = IGNORE_INDEX
    return {
        "input_ids": rows_in,
        "labels": rows_labels,
        "position_ids": _positions(seg_dst, seg_len, n * size).reshape(n, size),
        "document_ids": np.repeat(seg_doc, seg_len).reshape(n, size),
        "cu_seqlens": _cu_seqlens(seg_dst, n, size),
    }


# Pieces of at least this many tokens on average are copied one slice each; shorter ones
# by one gather (a Python step per piece would cost more than the gather's index arrays).
_SLICED_PIECES = 16


def _input_ids(
    p: SequencePieces,
    dst: np.ndarray,
    lengths: np.ndarray,
    tokens: np.ndarray,
    token_lo: int,
    flat: int,
    *,
    contiguous: bool,
) -> np.ndarray:
    """The rows' tokens, flat (padding left as it comes: the caller sets it)."""
    if contiguous and (len(p) < 2 or bool((p.lo[1:] == p.hi[:-1]).all())):
        start = int(p.lo[0]) - token_lo if len(p) else 0
        return tokens[start : start + flat].astype(np.int64)
    out = np.empty(flat, dtype=np.int64)  # every place a piece's or, set by the caller, padding
    if len(p) * _SLICED_PIECES <= flat:
        for at, lo, length in zip(dst.tolist(), (p.lo - token_lo).tolist(), lengths.tolist(), strict=True):
            out[at : at + length] = tokens[lo : lo + length]
    elif len(p):
        within = _positions(np.cumsum(lengths) - lengths, lengths, int(lengths.sum()))
        out[np.repeat(dst, lengths) + within] = tokens[np.repeat(p.lo - token_lo, lengths) + within]
    return out


def _positions(seg_dst: np.ndarray, seg_len: np.ndarray, flat: int) -> np.ndarray:
    """0, 1, ... from the start of each segment (the segments tile ``[0, flat)``)."""
    steps = np.ones(flat, dtype=np.int64)
    if len(seg_dst):
        steps[seg_dst[1:]] = 1 - seg_len[:-1]
        steps[0] = 0
    return np.cumsum(steps, out=steps)


def _segments(
    p: SequencePieces,
    dst: np.ndarray,
    lengths: np.ndarray,
    padded: np.ndarray,
    fill: np.ndarray,
    size: int,
    doc_base: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows' segments in order: ``(flat start, length, document_id)``."""
    docs = p.doc + doc_base
    if not len(padded):
        return dst, lengths, docs
    pad_dst = padded * size + fill[padded]
    at = np.searchsorted(dst, pad_dst)
    return np.insert(dst, at, pad_dst), np.insert(lengths, at, size - fill[padded]), np.insert(docs, at, -1)


def _cu_seqlens(seg_dst: np.ndarray, n: int, size: int) -> np.ndarray:
    """(n, S + 1) int32: each row's segment starts, then S repeated."""
    cu = np.full((n, size + 1), size, dtype=np.int32)
    if len(seg_dst):
        row = seg_dst // size
        rank = np.arange(len(seg_dst)) - np.searchsorted(row, row, side="left")
        cu[row, rank] = seg_dst - row * size
    return cu
