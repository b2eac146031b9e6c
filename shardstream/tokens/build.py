"""Packed sequences as arrays, from the tokens that hold them (NOTE [ Building sequences ])."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardstream.errors import UsageError
from shardstream.tokens.layout import SequenceRun
from shardstream.tokens.pieces import SequencePieces

IGNORE_INDEX = -100  # a label nothing is predicted at: torch's cross_entropy default

# NOTE [ Building sequences ]
# n sequences of S tokens are n rows, laid end to end (row r is [r*S, (r+1)*S)), built a
# block of rows at a time with no Python per token, from a table made once for all n:
# - The rows are cut into segments: each row's pieces in order, then its padding, if
#   any, as a segment of its own. position_ids count from 0 in every segment, document_ids
#   are the dataset's document numbers (-1 over padding), and cu_seqlens (S + 1 int32) are
#   the segments' starts, then S, repeated to the end (zero-length segments, as varlen
#   attention takes them). So the segments of cu_seqlens are exactly the runs of one
#   document_id, and position_ids are 0 exactly at their starts: the three agree.
# - labels are input_ids shifted by one, patched at each piece's last token: the next
#   token of its document where the document goes on, else IGNORE_INDEX; and IGNORE_INDEX
#   over padding. input_ids are copied a span at a time, a span being pieces that follow
#   each other in the same tokens (concat's rows, and its consecutive rows, are one each);
#   short spans are gathered at once instead.
# - A block's arrays are fresh (input_ids, labels, position_ids and cu_seqlens views of one
#   allocation, document_ids np.repeat's own), and a row is a view of them: nothing yielded
#   is ever written again. A few allocations per block of a few rows are what the
#   allocator hands back warm; an array per row, or one per array of a whole window, cost
#   it page faults and cache misses.
# - Only the arrays asked for are made (``seq_fields``): a model that takes input_ids and
#   labels alone pays for neither the segments' arrays nor their memory; input_ids are
#   still made for labels, which are cut from them.

# Spans at least this long on average are copied a slice each; shorter ones by one gather
# (a Python step per span would cost more than the gather's index arrays).
_SLICED_TOKENS = 64
# The arrays a sequence can carry, in the order a sample holds them.
SEQ_FIELDS = ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens")


def needs_segments(fields: Sequence[str] | frozenset[str]) -> bool:
    """Whether the arrays of ``fields`` need the rows' segments (those but input_ids and labels)."""
    return any(name in fields for name in SEQ_FIELDS[2:])


@dataclass(frozen=True, slots=True)
class Rows:
    """What ``count`` rows of ``seq_len`` tokens are made of (NOTE [ Building sequences ]),
    flat offsets counted from row 0. Made by :meth:`of`; :meth:`build` makes a block of them.

    Segments (pieces and padding, in order): ``seg_dst``, ``seg_len``, ``seg_doc``, and
    where each is in cu_seqlens, flat: ``cu_at``, ``cu_value``. Spans of input_ids:
    ``copy_dst``, ``copy_end``, ``copy_src`` (the offset in ``sources[copy_from]``). Labels:
    ``patch_at``, ``patch_value``. Padding: ``pad_dst``, ``pad_len``, ``pad_value``.
    ``firsts`` holds, for each table, where its entries of each row start (a row's spans:
    the first that ends past the row's start), ``ramp`` is 0, 1, ... for a block's positions."""

    count: int
    seq_len: int
    sources: tuple[np.ndarray, ...]
    seg_dst: np.ndarray
    seg_len: np.ndarray
    seg_doc: np.ndarray
    cu_at: np.ndarray
    cu_value: np.ndarray
    copy_dst: np.ndarray
    copy_end: np.ndarray
    copy_src: np.ndarray
    copy_from: np.ndarray
    patch_at: np.ndarray
    patch_value: np.ndarray
    pad_dst: np.ndarray
    pad_len: np.ndarray
    pad_value: np.ndarray
    firsts: tuple[list[int], list[int], list[int], list[int], list[int]]  # segments, spans (2), patches, pads
    ramp: np.ndarray

    @classmethod
    def of(
        cls,
        count: int,
        seq_len: int,
        pieces: SequencePieces,
        sources: Sequence[np.ndarray],
        source: np.ndarray,
        offset: np.ndarray,
        pads: np.ndarray,
        *,
        block: int | None = None,
        segments: bool = True,
    ) -> Rows:
        """The rows of ``pieces`` (``pieces.seq`` their rows, non-decreasing; ``pieces.doc``
        the document_ids), piece ``k`` holding tokens ``[lo[k], hi[k])`` of
        ``sources[source[k]]`` counted from ``offset[k]`` (which holds the token at ``hi[k]``
        too where ``more[k]``); row ``r`` padded with ``pads[r]``; built at most ``block``
        rows at a time (default: all). Without ``segments`` the rows make input_ids and
        labels only (``needs_segments``)."""
        size, p = seq_len, pieces
        lengths = p.hi - p.lo
        counts = np.bincount(p.seq, minlength=count)[:count]  # pieces of each row
        piece_firsts = np.concatenate([[0], np.cumsum(counts)])
        excl = np.cumsum(lengths) - lengths
        dst = p.seq * size + excl - excl[piece_firsts[p.seq]]
        fill = np.bincount(p.seq, weights=lengths, minlength=count).astype(np.int64)[:count]
        short = fill < size
        padded = np.flatnonzero(short)
        pad_dst, pad_len = padded * size + fill[padded], size - fill[padded]
        if segments:
            at = np.searchsorted(dst, pad_dst)
            seg_dst = np.insert(dst, at, pad_dst)
            seg_firsts = np.concatenate([[0], np.cumsum(counts + short)])
            row = seg_dst // size
            rank = np.arange(len(seg_dst)) - seg_firsts[row]
            segmented = (
                seg_dst,
                np.insert(lengths, at, pad_len),
                np.insert(p.doc, at, -1),
                row * (size + 1) + rank,
                (seg_dst - row * size).astype(np.int32),
            )
        else:  # none of the segments' arrays is asked for: no table of them
            segmented = (np.zeros(0, dtype=np.int64),) * 5
        src = p.lo - offset
        patch = np.full(len(p), IGNORE_INDEX, dtype=np.int64)
        for number in np.unique(source[p.more]).tolist():
            mine = np.flatnonzero((source == number) & p.more)
            patch[mine] = sources[number][src[mine] + lengths[mine]]
        # a span goes on where the piece before it ends at this one's start, in both places
        starts = np.ones(len(p), dtype=bool)
        starts[1:] = (source[1:] != source[:-1]) | (src[1:] != src[:-1] + lengths[:-1])
        starts[1:] |= dst[1:] != dst[:-1] + lengths[:-1]
        first = np.flatnonzero(starts)
        copy_dst = dst[first]
        copy_end = copy_dst + (np.add.reduceat(lengths, first) if len(first) else 0)
        bounds = np.arange(count + 1, dtype=np.int64) * size
        firsts = (
            seg_firsts.tolist() if segments else [],
            np.searchsorted(copy_end, bounds, side="right").tolist(),
            np.searchsorted(copy_dst, bounds).tolist(),
            piece_firsts.tolist(),
            np.concatenate([[0], np.cumsum(short)]).tolist(),
        )
        ends = dst + lengths - 1
        return cls(
            count,
            size,
            tuple(sources),
            *segmented,
            copy_dst,
            copy_end,
            src[first],
            source[first],
            ends,
            patch,
            pad_dst,
            pad_len,
            np.asarray(pads, dtype=np.int64)[padded],
            firsts,
            np.arange(min(count, count if block is None else block) * size, dtype=np.int64),
        )

    def build(self, start: int, stop: int, fields: Sequence[str] = SEQ_FIELDS) -> dict[str, np.ndarray]:
        """Rows ``[start, stop)`` (at most ``block`` of them), those of ``fields`` (of
        ``SEQ_FIELDS``) that are asked: ``input_ids``, ``labels``, ``position_ids`` and
        ``document_ids`` (n, S) int64, ``cu_seqlens`` (n, S + 1) int32. An array not asked
        is not made at all (labels are made from input_ids, which are made for them)."""
        size, n = self.seq_len, stop - start
        flat = n * size
        wanted = frozenset(fields)
        longs = [
            name for name in SEQ_FIELDS[:3] if name in wanted or (name == "input_ids" and "labels" in wanted)
        ]
        cu_bytes = n * (size + 1) * 4 if "cu_seqlens" in wanted else 0
        whole = np.empty(len(longs) * flat * 8 + cu_bytes, dtype=np.uint8)
        made = {name: whole[i * flat * 8 : (i + 1) * flat * 8].view(np.int64) for i, name in enumerate(longs)}
        if "input_ids" in made:
            self._tokens(made, start, stop)
        if needs_segments(wanted):
            if self.count and not self.firsts[0]:
                raise UsageError(
                    f"these rows were laid out without segments: they cannot make {sorted(wanted)}"
                )
            self._segments(made, start, stop, wanted, whole[len(longs) * flat * 8 :].view(np.int32))
        shapes = {"cu_seqlens": (n, size + 1)}
        return {
            name: made[name].reshape(shapes.get(name, (n, size))) for name in SEQ_FIELDS if name in wanted
        }

    def _tokens(self, made: dict[str, np.ndarray], start: int, stop: int) -> None:
        """input_ids of rows ``[start, stop)`` into ``made["input_ids"]``, and their labels
        into ``made["labels"]`` where it is there."""
        size = self.seq_len
        lo, flat = start * size, (stop - start) * size
        spans, spans_end, patches, pads = self.firsts[1:]
        input_ids = made["input_ids"]
        self._input_ids(input_ids, lo, flat, spans[start], spans_end[stop])
        p0, p1 = pads[start], pads[stop]
        padding = list(zip((self.pad_dst[p0:p1] - lo).tolist(), self.pad_len[p0:p1].tolist(), strict=True))
        for (at, length), value in zip(padding, self.pad_value[p0:p1].tolist(), strict=True):
            input_ids[at : at + length] = value
        labels = made.get("labels")
        if labels is None:
            return
        if flat:
            labels[:-1] = input_ids[1:]
            a, b = patches[start], patches[stop]
            labels[self.patch_at[a:b] - lo] = self.patch_value[a:b]
        for at, length in padding:
            labels[at : at + length] = IGNORE_INDEX

    def _segments(
        self, made: dict[str, np.ndarray], start: int, stop: int, wanted: frozenset[str], cu: np.ndarray
    ) -> None:
        """position_ids, document_ids and cu_seqlens of rows ``[start, stop)``, those ``wanted``
        (position_ids into ``made["position_ids"]``, cu_seqlens into ``cu``)."""
        size = self.seq_len
        lo, flat = start * size, (stop - start) * size
        s0, s1 = self.firsts[0][start], self.firsts[0][stop]
        seg_len = self.seg_len[s0:s1]
        if "position_ids" in wanted:
            positions = made["position_ids"]
            np.subtract(self.ramp[:flat], np.repeat(self.seg_dst[s0:s1] - lo, seg_len), out=positions)
        if "document_ids" in wanted:
            made["document_ids"] = np.repeat(self.seg_doc[s0:s1], seg_len)
        if "cu_seqlens" in wanted:
            cu.fill(size)
            cu[self.cu_at[s0:s1] - start * (size + 1)] = self.cu_value[s0:s1]
            made["cu_seqlens"] = cu

    def _input_ids(self, out: np.ndarray, lo: int, flat: int, c0: int, c1: int) -> None:
        """The tokens of flat offsets ``[lo, lo + flat)`` (spans ``[c0, c1)``) into ``out``
        (padding left as it comes)."""
        if c0 >= c1:
            return
        hi = lo + flat
        dst = self.copy_dst[c0:c1]
        src = self.copy_src[c0:c1]
        end = self.copy_end[c0:c1]
        if dst[0] < lo or end[-1] > hi:  # spans that go on past the block: only their part in it
            clipped = np.maximum(dst, lo)
            dst, end, src = clipped, np.minimum(end, hi), src + (clipped - dst)
        froms = self.copy_from[c0:c1]
        if (c1 - c0) * _SLICED_TOKENS <= flat:
            sources = self.sources
            for at, stop, begin, number in zip(
                (dst - lo).tolist(), (end - lo).tolist(), src.tolist(), froms.tolist(), strict=True
            ):
                out[at:stop] = sources[number][begin : begin + stop - at]
            return
        lengths = end - dst
        excl = np.cumsum(lengths) - lengths
        ramp = self.ramp[: int(excl[-1] + lengths[-1])]
        take = ramp + np.repeat(src - excl, lengths)
        place = ramp + np.repeat(dst - lo - excl, lengths)
        numbers = np.unique(froms).tolist()
        if len(numbers) == 1:
            out[place] = self.sources[numbers[0]][take]
            return
        by = np.repeat(froms, lengths)
        for number in numbers:
            mine = by == number
            out[place[mine]] = self.sources[number][take[mine]]


def build_sequences(
    run: SequenceRun,
    tokens: np.ndarray,
    token_lo: int,
    *,
    doc_base: int = 0,
    pad_id: int = 0,
    fields: Sequence[str] = SEQ_FIELDS,
) -> dict[str, np.ndarray]:
    """The arrays of ``run``'s sequences (NOTE [ Building sequences ]) of ``fields``:
    ``input_ids``, ``labels``, ``position_ids`` and ``document_ids`` (n, S) int64 and
    ``cu_seqlens`` (n, S + 1) int32. ``tokens`` are the shard's tokens from offset ``token_lo`` on and must
    hold ``run.tokens``; ``doc_base`` is the dataset's number of the shard's first document."""
    n = run.count
    t0, t1 = run.tokens
    if n and (token_lo > t0 or token_lo + len(tokens) < t1):
        raise UsageError(
            f"tokens [{token_lo}, {token_lo + len(tokens)}) do not hold the run's tokens [{t0}, {t1})"
        )
    p = run.pieces
    pieces = SequencePieces(p.seq, p.doc + doc_base, p.lo, p.hi, p.more)
    none = np.zeros(len(p), dtype=np.int64)
    pads = np.full(n, pad_id)
    rows = Rows.of(
        n, run.seq_len, pieces, (tokens,), none, none + token_lo, pads, segments=needs_segments(fields)
    )
    return rows.build(0, n, fields)
