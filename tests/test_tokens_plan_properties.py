"""Packed sequences through the plan, without I/O (hypothesis): documents of any lengths
in a few shards, any S and packing, any ranks and workers, any order. Every rank gets the
same number of sequences; over the epoch, concat gives every token of every shard but
each shard's tail under S, best_fit and pad give every token (pad with split); the masks
agree with the document ends; a resume on another shape finishes the epoch exactly."""

from __future__ import annotations

import collections

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.plan import PlanConfig, Shape, make_plan
from shardstream.plan.tokens import TokenSequences
from shardstream.tokens import IGNORE_INDEX, Packing, build_sequences, sequence_layout


@st.composite
def corpora(draw: st.DrawFn) -> list[list[int]]:
    """Document lengths of each shard (some empty, some longer than any S drawn)."""
    return draw(st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=12), min_size=1, max_size=4))


def tokens_of(lengths: list[list[int]]) -> list[np.ndarray]:
    """Each shard's tokens: token t of document d is d * 1000 + t, so a token names its place."""
    shards, number = [], 0
    for shard in lengths:
        parts = []
        for length in shard:
            parts.append(number * 1000 + np.arange(length, dtype=np.int64))
            number += 1
        shards.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
    return shards


def sequences_of(layouts, tokens, doc_base, samples):
    for shard, index in samples:
        run = layouts[shard].run(index, index + 1)
        built = build_sequences(run, tokens[shard], 0, doc_base=doc_base[shard], pad_id=-7)
        yield {key: value[0] for key, value in built.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=corpora(),
    size=st.integers(1, 16),
    mode=st.sampled_from(["concat", "best_fit", "pad"]),
    shape=st.sampled_from([(1, 1), (2, 1), (2, 2), (3, 1)]),
    order=st.sampled_from(["local", "global"]),
    seed=st.integers(0, 99),
)
def test_every_token_once_equal_ranks_and_agreeing_masks(lengths, size, mode, shape, order, seed):
    packing = Packing(size, mode)
    tokens = tokens_of(lengths)
    ends = [np.cumsum(shard, dtype=np.int64) for shard in lengths]
    layouts = [sequence_layout(packing, e) for e in ends]
    counts = np.array([layout.count for layout in layouts])
    if counts.sum() == 0 or (order == "global" and counts.sum() < 6):
        return  # nothing to plan, or a global batch larger than the epoch (refused)
    doc_base = np.cumsum([len(s) for s in lengths]) - [len(s) for s in lengths]
    world, workers = shape
    config = PlanConfig(seed=seed, order=order, global_batch_size=6 if order == "global" else None)
    source = TokenSequences(counts, size, mode, "split", "t")
    plan = make_plan(source, config, epoch=0, shape=Shape(world, workers, config.rank_batch_size(world)))
    ranks = [list(plan.rank_samples(rank)) for rank in range(world)]
    assert len({len(r) for r in ranks}) == 1  # equal sequences per rank
    seen = collections.Counter()
    for sample in sequences_of(layouts, tokens, doc_base, {s for r in ranks for s in r}):
        ids, labels, docs, pos = (
            sample["input_ids"],
            sample["labels"],
            sample["document_ids"],
            sample["position_ids"],
        )
        real = docs >= 0
        assert ((ids[real] // 1000) == docs[real]).all()  # each token is of the document it says
        assert (ids[~real] == -7).all()
        assert (labels[~real] == IGNORE_INDEX).all()
        starts = np.flatnonzero(np.diff(docs, prepend=-2) != 0)
        assert np.array_equal(np.flatnonzero(pos == 0), starts)
        nxt = labels[real] != IGNORE_INDEX
        assert ((labels[real][nxt] - ids[real][nxt]) == 1).all()  # the next token of the same document
        seen.update(ids[real].tolist())
    every = collections.Counter(np.concatenate(tokens).tolist())
    if mode == "concat":
        kept = [t[: len(t) // size * size] for t in tokens]
        assert seen == collections.Counter(np.concatenate(kept).tolist())
    else:
        assert seen == every  # no token dropped


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=corpora(),
    size=st.integers(1, 12),
    mode=st.sampled_from(["concat", "best_fit", "pad"]),
    before=st.sampled_from([(1, 1), (2, 2), (3, 1)]),
    after=st.sampled_from([(1, 2), (2, 1), (3, 1)]),
    data=st.data(),
)
def test_a_resume_on_another_shape_finishes_the_epoch_exactly(lengths, size, mode, before, after, data):
    ends = [np.cumsum(shard, dtype=np.int64) for shard in lengths]
    counts = np.array([sequence_layout(Packing(size, mode), e).count for e in ends])
    if counts.sum() < 6:
        return
    config = PlanConfig(seed=1, order="global", global_batch_size=6)
    source = TokenSequences(counts, size, mode, "split", "t")
    plan = make_plan(source, config, epoch=0, shape=Shape(before[0], before[1], 6 // before[0]))
    steps = data.draw(st.integers(0, plan.batches_per_rank()))
    resumed = make_plan(
        source, config, state=plan.state_dict(steps), shape=Shape(after[0], after[1], 6 // after[0])
    )
    whole = [plan.global_batch(k) for k in range(plan.batches_per_rank())]  # type: ignore[attr-defined]
    rest = [resumed.global_batch(k) for k in range(steps, steps + resumed.batches_per_rank())]  # type: ignore[attr-defined]
    assert rest == whole[steps:]
