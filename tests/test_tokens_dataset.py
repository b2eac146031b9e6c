"""Packed sequences streamed from a token dataset: ``StreamingDataset(url, seq_len=S,
packing=...)`` (NOTE [ Reading sequences ]). A small BPE is trained here; the corpus is
packed with ``shardstream pack --format tokens``; what comes out is checked against the
shards' own tokens, read back through the format."""

from __future__ import annotations

import collections
import itertools
import json
import pathlib

import numpy as np
import pytest

import shardstream
from shardstream.errors import StateError, UsageError
from shardstream.pack import pack
from shardstream.tokens import IGNORE_INDEX
from tests.tokens_helpers import read_documents, texts, train_tokenizer

S = 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, list[np.ndarray]]:
    """A token dataset of 300 documents in 5 shards, and each shard's tokens end to end."""
    root = tmp_path_factory.mktemp("tokens")
    tokenizer = train_tokenizer(root)
    source = root / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(300, seed=5)))
    url = str(root / "ds")
    pack(str(source), url, format="tokens", tokenizer=str(tokenizer), text_field="text", samples_per_shard=60)
    return url, [np.concatenate(docs) for docs in shard_documents(url)]


def shard_documents(url: str) -> list[list[np.ndarray]]:
    """Every shard's documents (token arrays), read back through the format."""
    documents = [tokens for _, tokens in read_documents(url)]
    counts = [shard.samples for shard in shardstream.StreamingDataset(url).manifest.shards]
    firsts = np.cumsum(counts) - counts
    return [documents[first : first + count] for first, count in zip(firsts, counts, strict=True)]


def test_concat_in_manifest_order_is_each_shards_tokens_cut_every_seq_len(corpus):
    url, tokens = corpus
    got = list(shardstream.StreamingDataset(url, seq_len=S, shuffle=False))
    expected = [shard[: len(shard) // S * S].reshape(-1, S) for shard in tokens]
    assert len(got) == sum(len(rows) for rows in expected)
    assert np.array_equal(np.stack([s["input_ids"] for s in got]), np.concatenate(expected))
    dropped = sum(len(shard) % S for shard in tokens)  # each shard's tail under S, counted
    assert len(got) * S + dropped == sum(len(shard) for shard in tokens)


@pytest.mark.parametrize("packing", ["concat", "best_fit", "pad"])
def test_every_documents_tokens_once_and_masks_that_agree_with_document_ends(corpus, packing):
    url, _ = corpus
    documents = [doc for docs in shard_documents(url) for doc in docs]
    got = list(shardstream.StreamingDataset(url, seq_len=S, packing=packing, seed=3))
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for sample in got:
        ids, labels, pos, docs, cu = (
            sample[k] for k in ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens")
        )
        starts = np.flatnonzero(np.diff(docs, prepend=-2) != 0)
        assert np.array_equal(np.flatnonzero(pos == 0), starts)  # positions restart at each document
        assert np.array_equal(cu[: len(starts)], starts)
        assert (cu[len(starts) :] == S).all()
        for doc in np.unique(docs[docs >= 0]).tolist():
            seen[doc].update(ids[docs == doc].tolist())
        inside = (docs[:-1] == docs[1:]) & (docs[:-1] >= 0)
        assert np.array_equal(labels[:-1][inside], ids[1:][inside])  # the next token of the document
        assert (labels[docs < 0] == IGNORE_INDEX).all()  # nothing to predict over padding
        for end in np.flatnonzero(~inside[: len(inside)]).tolist():  # a document piece's last token
            assert labels[end] == IGNORE_INDEX or (docs[end] >= 0 and labels[end] in documents[docs[end]])
    if packing == "concat":  # every token but each shard's tail
        assert sum(sum(c.values()) for c in seen.values()) == len(got) * S
        assert all(seen[d] <= collections.Counter(documents[d].tolist()) for d in seen)
    else:  # best_fit and pad drop no token
        assert {d: collections.Counter(doc.tolist()) for d, doc in enumerate(documents) if len(doc)} == seen


def test_a_shuffled_epoch_is_the_same_sequences_in_another_order_each_epoch(corpus):
    url, _ = corpus
    in_order = list(shardstream.StreamingDataset(url, seq_len=S, packing="best_fit", shuffle=False))
    dataset = shardstream.StreamingDataset(url, seq_len=S, packing="best_fit", seed=1)
    epochs = []
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        epochs.append([tuple(s["input_ids"].tolist()) for s in dataset])
    key = sorted(tuple(s["input_ids"].tolist()) for s in in_order)
    assert sorted(epochs[0]) == sorted(epochs[1]) == key
    assert epochs[0] != epochs[1]


def global_batches(url: str, world: int, *, workers: int, steps: int | None = None, state=None, **options):
    """The global batches (each a list of input_ids rows) that ``world`` simulated ranks
    yield, and the state after ``steps`` of them (all ranks' states agree)."""
    per_rank, states = [], []
    for rank in range(world):
        dataset = shardstream.StreamingDataset(url, num_replicas=world, rank=rank, **options)
        loader = shardstream.DataLoader(dataset, batch_size=6 // world, num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        batches = []
        for step, batch in enumerate(loader):
            batches.append([tuple(row) for row in batch["input_ids"].tolist()])
            if steps is not None and step + 1 == steps:
                break
        per_rank.append(batches)
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)
    return [list(itertools.chain(*parts)) for parts in zip(*per_rank, strict=True)], states[0]


def test_global_order_the_same_batches_token_for_token_when_resumed_on_3_ranks_then_1(corpus):
    url, _ = corpus
    options = dict(seq_len=S, packing="best_fit", order="global", global_batch_size=6, seed=4)
    whole, _ = global_batches(url, 2, workers=2, **options)
    head, state = global_batches(url, 2, workers=2, steps=3, **options)
    middle, state = global_batches(url, 3, workers=1, steps=2, state=state, **options)
    rest, _ = global_batches(url, 1, workers=2, state=state, **options)
    assert head + middle + rest == whole
    assert len(whole) == -(-len(shardstream.StreamingDataset(url, seq_len=S, packing="best_fit")) // 6)


def test_a_state_resumes_only_the_same_sequences(corpus):
    url, _ = corpus
    dataset = shardstream.StreamingDataset(url, seq_len=S, seed=2)
    iterator = iter(dataset)
    for _ in range(5):
        next(iterator)
    state = dataset.state_dict()
    shardstream.StreamingDataset(url, seq_len=S, seed=2).load_state_dict(state)
    for other in (dict(seq_len=S + 1), dict(seq_len=S, packing="pad")):
        with pytest.raises(StateError, match="saved over sequences with"):
            shardstream.StreamingDataset(url, seed=2, **other).load_state_dict(state)
    with pytest.raises(StateError):
        shardstream.StreamingDataset(url, seed=2).load_state_dict(state)  # documents, not sequences


def test_a_token_mixture_mixes_by_tokens(corpus, tmp_path):
    url, _ = corpus
    mixture = shardstream.StreamingDataset(
        [shardstream.Stream(url, weight=3), shardstream.Stream(url, weight=1)], seq_len=S, seed=1
    )
    got = list(mixture)
    streams = collections.Counter(int(s["__stream__"]) for s in got)
    assert streams[0] == mixture.quotas[0]
    assert streams[1] == mixture.quotas[1]
    assert abs(streams[0] * S / (sum(streams.values()) * S) - 0.75) < 0.01  # tokens, 3:1


def test_seq_len_needs_a_token_dataset_and_packing_needs_seq_len(tmp_path, corpus):
    url, _ = corpus
    tar = tmp_path / "tar"
    with shardstream.ShardWriter(str(tar), samples_per_shard=4) as writer:
        writer.write({"__key__": "a", "txt": b"x"})
    with pytest.raises(UsageError, match="token dataset"):
        len(shardstream.StreamingDataset(str(tar), seq_len=S))
    with pytest.raises(UsageError, match="give a seq_len"):
        shardstream.StreamingDataset(url, packing="best_fit")
    with pytest.raises(UsageError, match="packing must be one of"):
        shardstream.StreamingDataset(url, seq_len=S, packing="greedy")


def test_sequences_through_dataloader_workers_collate_to_tensors(corpus):
    url, _ = corpus
    loader = shardstream.DataLoader(shardstream.StreamingDataset(url, seq_len=S), batch_size=4, num_workers=2)
    batch = next(iter(loader))
    assert tuple(batch["input_ids"].shape) == (4, S)
    assert tuple(batch["cu_seqlens"].shape) == (4, S + 1)
    assert str(batch["labels"].dtype) == "torch.int64"


def test_the_corpus_fixture_reads_back_what_was_packed(corpus):
    url, tokens = corpus
    assert len(tokens) == 5
    assert pathlib.Path(url, ".shardstream", "manifest.json").exists()
