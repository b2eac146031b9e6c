"""Packed token sequences (shardstream/tokens): every token once per epoch, masks that agree
with document ends, runs equal to their sequences built alone, and the best-fit sidecar."""

from __future__ import annotations

import bisect
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import FormatError, PlanError, ShardstreamError, UsageError
from shardstream.tokens import (
    IGNORE_INDEX,
    BestFit,
    Packing,
    best_fit,
    build_sequences,
    count_sequences,
    sequence_layout,
)
from shardstream.tokens.bestfit import _bfd
from shardstream.tokens.pieces import split_documents

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Document lengths with many empty and one-token documents, and some longer than S.
lengths = st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, 40)), min_size=0, max_size=40)
seq_lens = st.integers(1, 12)
packings = st.one_of(
    st.builds(Packing, seq_lens, st.sampled_from(["concat", "best_fit"])),
    st.builds(Packing, seq_lens, st.just("pad"), st.sampled_from(["split", "truncate"])),
)
blocks = st.sampled_from([None, 1, 2, 3, 8])  # block_tokens in sequences (None: the default)


def ends_of(sizes: list[int]) -> np.ndarray:
    return np.cumsum(np.asarray(sizes, dtype=np.int64))


def layout_of(packing: Packing, ends: np.ndarray, block: int | None):
    """The layout, best_fit's in blocks of ``block`` sequences, concat's from an offset of
    ``block`` tokens (up to what it drops)."""
    if packing.mode == "concat" and block is not None:
        dropped = sequence_layout(packing, ends).dropped
        return sequence_layout(packing, ends, offset=block % (dropped + 1))
    fit = None
    if packing.mode == "best_fit" and block is not None:
        fit = best_fit(ends, packing.seq_len, block_tokens=block * packing.seq_len)
    return sequence_layout(packing, ends, fit=fit)


def covered(layout) -> list[int]:
    """Every token offset of every piece of the shard's sequences, in order."""
    pieces = layout.run(0, layout.count).pieces
    return [t for lo, hi in zip(pieces.lo.tolist(), pieces.hi.tolist(), strict=True) for t in range(lo, hi)]


# -- Packing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_len": 0}, "seq_len"),
        ({"seq_len": -4}, "seq_len"),
        ({"seq_len": True}, "seq_len"),
        ({"seq_len": 4.0}, "seq_len"),
        ({"seq_len": 2**40}, "seq_len"),
        ({"seq_len": 8, "mode": "chunk"}, "packing must be one of"),
        ({"seq_len": 8, "mode": "pad", "long_docs": "drop"}, "long_docs must be one of"),
        ({"seq_len": 8, "mode": "best_fit", "long_docs": "truncate"}, "truncate"),
        ({"seq_len": 8, "mode": "concat", "long_docs": "truncate"}, "truncate"),
    ],
)
def test_packing_refuses_what_cannot_work(kwargs, match):
    with pytest.raises(UsageError, match=match):
        Packing(**kwargs)


def test_packing_is_a_frozen_value():
    packing = Packing(np.int64(16), "best_fit")
    assert packing == Packing(16, "best_fit")
    assert type(packing.seq_len) is int
    with pytest.raises(AttributeError):
        packing.seq_len = 8  # type: ignore[misc]


def test_blocks_shorter_than_a_sequence_are_refused():
    with pytest.raises(UsageError, match="block_tokens"):
        best_fit(np.array([10]), 8, block_tokens=4)


def test_ends_that_go_backwards_are_refused():
    with pytest.raises(FormatError, match="backwards at document 2"):
        sequence_layout(Packing(4), np.array([3, 5, 4]), shard="s.tokens")
    with pytest.raises(UsageError, match="integer"):
        sequence_layout(Packing(4), np.array([1.5]))


# -- every token once per epoch -----------------------------------------------------------


@PROPERTY
@given(lengths, seq_lens, st.integers(0, 20))
def test_concat_covers_every_token_once_up_to_the_counted_tail(sizes, size, offset):
    ends = ends_of(sizes)
    total = int(ends[-1]) if sizes else 0
    offset = min(offset, total % size)
    layout = sequence_layout(Packing(size, "concat"), ends, offset=offset)
    assert layout.count == total // size
    assert layout.dropped == total - layout.count * size
    assert covered(layout) == list(range(offset, offset + layout.count * size))


def test_an_offset_past_what_concat_drops_or_for_another_packing_is_refused():
    ends = np.array([5, 10])
    with pytest.raises(PlanError, match=r"offset 3 is outside \[0, 2\]"):
        sequence_layout(Packing(4), ends, offset=3)
    with pytest.raises(UsageError, match="applies to packing='concat' only"):
        sequence_layout(Packing(4, "pad"), ends, offset=1)


@PROPERTY
@given(lengths, seq_lens, blocks)
def test_best_fit_covers_every_token_once_and_drops_none(sizes, size, block):
    ends = ends_of(sizes)
    layout = layout_of(Packing(size, "best_fit"), ends, block)
    assert sorted(covered(layout)) == list(range(int(ends[-1]) if sizes else 0))
    assert layout.dropped == 0
    pieces = layout.run(0, layout.count).pieces
    fills = np.bincount(pieces.seq, weights=pieces.hi - pieces.lo, minlength=layout.count)
    assert (fills <= size).all()
    assert (fills > 0).all()


@PROPERTY
@given(lengths, seq_lens)
def test_pad_keeps_every_token_when_split_and_a_head_when_truncated(sizes, size):
    ends = ends_of(sizes)
    split = sequence_layout(Packing(size, "pad"), ends)
    assert covered(split) == list(range(int(ends[-1]) if sizes else 0))
    assert split.count == sum(-(-n // size) for n in sizes)
    assert split.dropped == 0
    cut = sequence_layout(Packing(size, "pad", "truncate"), ends)
    starts = [int(e) - n for e, n in zip(ends, sizes, strict=True)]
    assert covered(cut) == [s + i for s, n in zip(starts, sizes, strict=True) for i in range(min(n, size))]
    assert cut.count == sum(1 for n in sizes if n)
    assert cut.dropped == sum(max(0, n - size) for n in sizes)


@PROPERTY
@given(lengths, packings)
def test_counting_sequences_needs_no_layout(sizes, packing):
    ends = ends_of(sizes)
    layout = sequence_layout(packing, ends)
    assert count_sequences(packing, ends) == layout.count
    if packing.mode == "best_fit":
        assert count_sequences(packing, ends, fit=best_fit(ends, packing.seq_len)) == layout.count


def _reference_bfd_rooms(sizes: list[int], size: int) -> list[int]:
    """Rooms of the bins of a plain best-fit-decreasing, one piece at a time."""
    rooms: list[int] = []  # sorted
    for x in sorted(sizes, reverse=True):
        i = bisect.bisect_left(rooms, x)
        room = rooms.pop(i) if i < len(rooms) else size
        bisect.insort(rooms, room - x)
    return rooms


@PROPERTY
@given(st.lists(st.integers(1, 300), max_size=200), st.integers(1, 64))
def test_best_fit_within_a_block_is_best_fit_decreasing(sizes, size):
    """The grouped BFD opens the bins a piece-at-a-time BFD does, with the same rooms."""
    _, lo, hi = split_documents(ends_of(sizes), size)
    pieces = hi - lo
    bins = _bfd(pieces, size)
    rooms = size - np.bincount(bins, weights=pieces).astype(np.int64)
    assert sorted(rooms.tolist()) == _reference_bfd_rooms(pieces.tolist(), size)


# -- the sequences' arrays ----------------------------------------------------------------


def reference(layout, tokens: np.ndarray, doc_base: int, pad_id: int) -> dict[str, np.ndarray]:
    """The arrays of every sequence, one token at a time from the pieces."""
    size, ends = layout.packing.seq_len, layout.ends
    out = {k: [] for k in ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens")}
    pieces = layout.run(0, layout.count).pieces
    for s in range(layout.count):
        row = {k: [] for k in out}
        cu = []
        for k in np.flatnonzero(pieces.seq == s):
            doc, lo, hi = int(pieces.doc[k]), int(pieces.lo[k]), int(pieces.hi[k])
            cu.append(len(row["input_ids"]))
            for t in range(lo, hi):
                row["input_ids"].append(int(tokens[t]))
                row["labels"].append(int(tokens[t + 1]) if t + 1 < ends[doc] else IGNORE_INDEX)
                row["position_ids"].append(t - lo)
                row["document_ids"].append(doc_base + doc)
        filled = len(row["input_ids"])
        if filled < size:
            cu.append(filled)
        row["input_ids"] += [pad_id] * (size - filled)
        row["labels"] += [IGNORE_INDEX] * (size - filled)
        row["position_ids"] += list(range(size - filled))
        row["document_ids"] += [-1] * (size - filled)
        row["cu_seqlens"] = cu + [size] * (size + 1 - len(cu))
        for k in out:
            out[k].append(row[k])
    return {k: np.asarray(v, dtype=np.int32 if k == "cu_seqlens" else np.int64).reshape(
        layout.count, size + (k == "cu_seqlens")) for k, v in out.items()}  # fmt: skip


def tokens_for(ends: np.ndarray, seed: int) -> np.ndarray:
    total = int(ends[-1]) if len(ends) else 0
    return np.random.default_rng(seed).integers(0, 60000, total, dtype=np.uint16)


@PROPERTY
@given(lengths, packings, blocks, st.integers(0, 10**12), st.integers(0, 2))
def test_sequences_agree_with_their_documents(sizes, packing, block, doc_base, pad_id):
    """input_ids, labels (-100 at each document's end and over padding), position_ids,
    document_ids and cu_seqlens are what one token at a time makes of the pieces."""
    ends = ends_of(sizes)
    layout = layout_of(packing, ends, block)
    tokens = tokens_for(ends, len(sizes))
    built = build_sequences(layout.run(0, layout.count), tokens, 0, doc_base=doc_base, pad_id=pad_id)
    expected = reference(layout, tokens, doc_base, pad_id)
    for key, value in expected.items():
        assert built[key].dtype == value.dtype, key
        np.testing.assert_array_equal(built[key], value, err_msg=key)


@PROPERTY
@given(lengths, packings, blocks, st.data())
def test_a_run_is_its_sequences_built_one_by_one(sizes, packing, block, data):
    """Any split of the shard's sequences into runs, each built from exactly the tokens its
    run names, gives the same arrays as the whole shard at once."""
    ends = ends_of(sizes)
    layout = layout_of(packing, ends, block)
    tokens = tokens_for(ends, 7)
    whole = build_sequences(layout.run(0, layout.count), tokens, 0, doc_base=3)
    cuts = sorted(data.draw(st.lists(st.integers(0, layout.count), max_size=4)))
    bounds = [0, *cuts, layout.count]
    for start, stop in itertools.pairwise(bounds):
        run = layout.run(start, stop)
        t0, t1 = run.tokens
        part = build_sequences(run, tokens[t0:t1], t0, doc_base=3)
        for key, value in part.items():
            np.testing.assert_array_equal(value, whole[key][start:stop], err_msg=key)
        if run.count:
            d0, d1 = run.docs
            lo_doc = int(ends[d0 - 1]) if d0 else 0
            assert lo_doc <= t0 < t1 <= int(ends[d1 - 1])  # the documents hold the tokens
            assert run.pieces.doc.min() >= d0
            assert run.pieces.doc.max() < d1
            # no more than its pieces take: their tokens and the label after a piece that goes on
            pieces = run.pieces
            assert (t0, t1) == (int(pieces.lo.min()), int((pieces.hi + pieces.more).max()))
            first, last = np.searchsorted(ends, [t0, t1 - 1], side="right")
            assert run.docs == (int(first), int(last) + 1)


@PROPERTY
@given(lengths, seq_lens)
def test_masks_agree_with_document_ends(sizes, size):
    """Segments of cu_seqlens are the runs of one document_id; position_ids are 0 exactly at
    their starts; a label is -100 exactly at a document's last token and over padding
    (documents of at most S tokens: best_fit keeps each whole in one sequence)."""
    ends = ends_of([min(n, size) for n in sizes])
    layout = sequence_layout(Packing(size, "best_fit"), ends)
    out = build_sequences(layout.run(0, layout.count), tokens_for(ends, 1), 0)
    for row in range(layout.count):
        docs, cu = out["document_ids"][row], out["cu_seqlens"][row]
        starts = [0, *np.flatnonzero(docs[1:] != docs[:-1]) + 1]
        assert list(cu[: len(starts)]) == starts
        assert (cu[len(starts) :] == size).all()
        assert list(np.flatnonzero(out["position_ids"][row] == 0)) == starts
        last = np.append(docs[1:] != docs[:-1], True)
        assert ((out["labels"][row] == IGNORE_INDEX) == (last | (docs < 0))).all()


def test_concat_labels_cross_a_sequence_end_within_a_document():
    ends = np.array([10])
    layout = sequence_layout(Packing(4), ends)
    tokens = np.arange(10, dtype=np.uint16)
    out = build_sequences(layout.run(0, 2), tokens, 0)
    assert out["labels"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert layout.run(1, 2).tokens == (4, 9)  # one token past the run, for its last label


def test_a_run_outside_the_shard_is_refused():
    layout = sequence_layout(Packing(4), np.array([10]))
    with pytest.raises(PlanError, match="outside"):
        layout.run(1, 3)
    with pytest.raises(PlanError):
        layout.run(-1, 1)


def test_tokens_that_do_not_hold_the_run_are_refused():
    layout = sequence_layout(Packing(4), np.array([10]))
    run = layout.run(1, 2)
    with pytest.raises(UsageError, match=r"do not hold the run's tokens \[4, 9\)"):
        build_sequences(run, np.zeros(4, dtype=np.uint16), 4)


def test_an_empty_run_builds_empty_arrays():
    layout = sequence_layout(Packing(4, "pad"), np.array([3, 7]))
    out = build_sequences(layout.run(1, 1), np.zeros(0, dtype=np.uint16), 0)
    assert out["input_ids"].shape == (0, 4)
    assert out["cu_seqlens"].shape == (0, 5)


# -- the best-fit sidecar -----------------------------------------------------------------

NAME = ".shardstream/shard-000000.tokens.fit16"


def lognormal_ends(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(np.exp(rng.normal(4.0, 1.0, n)).astype(np.int64) + 1)


def test_the_sidecar_round_trips():
    ends = lognormal_ends(3000)
    fit = best_fit(ends, 16 * 8, block_tokens=40_000)
    assert len(fit.cuts) > 0  # blocks cut documents, and the sidecar keeps where
    again = BestFit.from_bytes(fit.to_bytes(), name=NAME)
    for field in ("seq_len", "block_tokens", "documents", "tokens", "ends_crc"):
        assert getattr(again, field) == getattr(fit, field)
    for field in ("cuts", "order", "first"):
        np.testing.assert_array_equal(getattr(again, field), getattr(fit, field))
    a = sequence_layout(Packing(128, "best_fit"), ends, fit=again).run(0, fit.count).pieces
    b = sequence_layout(Packing(128, "best_fit"), ends, fit=fit).run(0, fit.count).pieces
    np.testing.assert_array_equal(a.lo, b.lo)


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_a_corrupt_sidecar_is_refused_naming_it(data):
    blob = bytearray(best_fit(lognormal_ends(200), 64, block_tokens=2000).to_bytes())
    where = data.draw(st.integers(0, len(blob) - 1))
    blob[where] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(FormatError) as error:
        BestFit.from_bytes(bytes(blob), name=NAME)
    assert error.value.shard == NAME
    assert NAME in str(error.value)


@pytest.mark.parametrize("cut", [0, 7, 30, -1])
def test_a_truncated_sidecar_is_refused(cut):
    blob = best_fit(lognormal_ends(50), 64).to_bytes()
    with pytest.raises(FormatError, match="best-fit sidecar"):
        BestFit.from_bytes(blob[:cut], name=NAME)


def test_a_sidecar_for_other_documents_or_another_length_is_refused():
    ends = lognormal_ends(100)
    fit = BestFit.from_bytes(best_fit(ends, 64).to_bytes(), name=NAME)
    with pytest.raises(FormatError, match="seq_len 64, not 32"):
        sequence_layout(Packing(32, "best_fit"), ends, fit=fit, shard=NAME)
    other = ends.copy()
    other[3] += 1
    with pytest.raises(FormatError, match="other documents") as error:
        sequence_layout(Packing(64, "best_fit"), other, fit=fit, shard=NAME)
    assert error.value.shard == NAME


def test_a_sidecar_whose_sequences_overflow_is_refused():
    """A sidecar with a valid checksum but bins over seq_len (written by a bug) is refused."""
    ends = np.array([4, 8, 12])
    fit = best_fit(ends, 4)
    bad = BestFit(4, fit.block_tokens, 3, 12, fit.ends_crc, fit.cuts, fit.order, np.array([0, 2, 3]))
    with pytest.raises(FormatError, match="do not fit"):
        sequence_layout(Packing(4, "best_fit"), ends, fit=BestFit.from_bytes(bad.to_bytes()), shard=NAME)


def test_best_fit_pads_little_on_many_documents():
    """Blocks cut where BFD's last bins fill: a small shard of lognormal documents wastes
    under a sequence per block beyond what its full bins leave (never asserted as time)."""
    ends = lognormal_ends(20000)
    fit = best_fit(ends, 512, block_tokens=200_000)
    total = int(ends[-1])
    blocks = round(total / 200_000)
    assert fit.count * 512 - total < blocks * 512


def test_errors_are_shardstream_errors():
    assert issubclass(FormatError, ShardstreamError)
    assert issubclass(PlanError, ShardstreamError)
