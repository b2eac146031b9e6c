"""Sequences built a block of rows at a time (shardstream/tokens/build.py ``Rows``) from any
sequences of several shards, in any order and with repeats, equal each sequence built
alone; a layout's ``take`` gives each sequence the pieces its run gives it; the tokens of
a document run are a view where its documents lie one after another in one buffer."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.dataset.sequences import _flat_tokens
from shardstream.plan import Run
from shardstream.tokens import Packing, SequencePieces, build_sequences, sequence_layout
from shardstream.tokens import build as building
from shardstream.tokens.build import Rows

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

lengths = st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, 40)), min_size=1, max_size=30)
packings = st.one_of(
    st.builds(Packing, st.integers(1, 12), st.sampled_from(["concat", "best_fit"])),
    st.builds(Packing, st.integers(1, 12), st.just("pad"), st.sampled_from(["split", "truncate"])),
)


def ends_of(sizes: list[int]) -> np.ndarray:
    return np.cumsum(np.asarray(sizes, dtype=np.int64))


def tokens_for(ends: np.ndarray, seed: int) -> np.ndarray:
    total = int(ends[-1]) if len(ends) else 0
    return np.random.default_rng(seed).integers(0, 60000, total, dtype=np.uint16)


@PROPERTY
@given(lengths, packings, st.data())
def test_take_gives_each_sequence_the_pieces_of_its_run(sizes, packing, data):
    layout = sequence_layout(packing, ends_of(sizes))
    if not layout.count:
        return
    wanted = np.array(data.draw(st.lists(st.integers(0, layout.count - 1), max_size=12)), dtype=np.int64)
    taken = layout.take(wanted)
    for i, sequence in enumerate(wanted.tolist()):
        alone = layout.run(sequence, sequence + 1).pieces
        mine = taken.seq == i
        for name in ("doc", "lo", "hi", "more"):
            np.testing.assert_array_equal(getattr(taken, name)[mine], getattr(alone, name), err_msg=name)
    assert (np.diff(taken.seq) >= 0).all()


@PROPERTY
@given(st.lists(st.tuples(lengths, packings.map(lambda p: p.mode)), min_size=1, max_size=3), st.data())
def test_rows_of_several_shards_in_any_order_built_in_blocks_equal_each_sequence_alone(shards, data):
    """Rows of sequences drawn from several shards (any order, repeats), built a block at a
    time, are the arrays of each sequence built alone, whatever the blocks."""
    size = data.draw(st.integers(1, 9))
    layouts = [sequence_layout(Packing(size, mode), ends_of(sizes)) for sizes, mode in shards]
    tokens = [tokens_for(ends_of(sizes), seed) for seed, (sizes, _) in enumerate(shards)]
    choices = [(shard, k) for shard, layout in enumerate(layouts) for k in range(layout.count)]
    if not choices:
        return
    picked = data.draw(st.lists(st.sampled_from(choices), min_size=1, max_size=20))
    bases, pads = [0, 100, 200][: len(shards)], [-1, -2, -3][: len(shards)]
    parts = []
    for row, (shard, k) in enumerate(picked):
        p = layouts[shard].take(np.array([k]))
        parts.append((p.seq + row, p.doc + bases[shard], p.lo, p.hi, p.more, np.full(len(p), shard)))
    row, doc, lo, hi, more, source = (np.concatenate(column) for column in zip(*parts, strict=True))
    pieces = SequencePieces(row, doc, lo, hi, more)
    shard_of = np.array([shard for shard, _ in picked])
    block = data.draw(st.integers(1, len(picked)))
    rows = Rows.of(
        len(picked), size, pieces, tokens, source, source * 0, np.array(pads)[shard_of], block=block
    )
    built, before = [], building._SLICED_TOKENS
    building._SLICED_TOKENS = data.draw(st.sampled_from([1, 1 << 30]))  # spans sliced each, or gathered
    try:
        for start in range(0, len(picked), block):
            arrays = rows.build(start, min(start + block, len(picked)))
            built += [dict(zip(arrays, one, strict=True)) for one in zip(*arrays.values(), strict=True)]
    finally:
        building._SLICED_TOKENS = before
    for (shard, k), got in zip(picked, built, strict=True):
        run = layouts[shard].run(k, k + 1)
        alone = build_sequences(run, tokens[shard], 0, doc_base=bases[shard], pad_id=pads[shard])
        for key, value in alone.items():
            assert got[key].dtype == value.dtype, key
            np.testing.assert_array_equal(got[key], value[0], err_msg=key)


def test_a_document_run_is_a_view_of_its_read_where_its_documents_follow_each_other():
    read = np.arange(100, dtype=np.uint16).tobytes()
    flat = np.frombuffer(read, dtype=np.uint16)
    docs = [flat[10:20], flat[20:25], flat[25:40]]
    (joined,) = _flat_tokens([Run(0, 3, 6)], [{"tokens": d} for d in docs])
    assert np.shares_memory(joined, flat)
    np.testing.assert_array_equal(joined, np.arange(10, 40))
    out_of_order = [flat[20:25], flat[10:20], flat[25:40]]
    (copied,) = _flat_tokens([Run(0, 3, 6)], [{"tokens": d} for d in out_of_order])
    assert not np.shares_memory(copied, flat)
    np.testing.assert_array_equal(copied, np.concatenate(out_of_order))
    apart = [flat[10:20], np.arange(5, dtype=np.uint16), flat[25:40]]
    (copied,) = _flat_tokens([Run(0, 3, 6)], [{"tokens": d} for d in apart])
    np.testing.assert_array_equal(copied, np.concatenate(apart))
