"""seq_fields: a sequence carries only the arrays asked for, each equal to the same array of
the sequence with all of them (NOTE [ Building sequences ])."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import shardstream
from shardstream.errors import UsageError
from shardstream.tokens import Packing, build_sequences, sequence_layout
from shardstream.tokens.build import SEQ_FIELDS

S = 32
CHOSEN = [("input_ids", "labels"), ("labels",), ("position_ids", "cu_seqlens"), ("document_ids", "input_ids")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """About 9,000 tokens in 5 shards: lognormal documents, some empty, some longer than S."""
    url = str(tmp_path_factory.mktemp("fields") / "ds")
    rng = np.random.default_rng(3)
    with shardstream.ShardWriter(url, format="tokens", samples_per_shard=60) as writer:
        for number in range(300):
            n = 0 if number % 29 == 7 else int(max(1, rng.lognormal(3.2, 0.9)))
            writer.write({"__key__": f"{number:06d}", "tokens": rng.integers(2, 900, n, dtype=np.uint16)})
    return url


def numpy(batch: dict) -> dict[str, np.ndarray]:
    return {name: value.numpy() for name, value in batch.items()}


def same_fields(got: list[dict], full: list[dict], fields: tuple[str, ...]) -> None:
    assert len(got) == len(full)
    assert len(got) > 0
    for a, b in zip(got, full, strict=True):
        assert set(a) == set(fields)
        for name in fields:
            assert a[name].dtype == b[name].dtype
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("packing", ["concat", "best_fit", "pad"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_chosen_arrays_are_those_of_the_full_sequences(corpus, packing, shuffle):
    def read(**given) -> list[dict]:  # type: ignore[no-untyped-def]
        options = {"seq_len": S, "packing": packing, "shuffle": shuffle, "seed": 5, "shuffle_window": 7}
        return list(shardstream.StreamingDataset(corpus, **options, **given))

    full = read()
    assert set(full[0]) == set(SEQ_FIELDS)  # the default: all of them
    for fields in CHOSEN:
        same_fields(read(seq_fields=fields), full, fields)


@pytest.mark.parametrize("packing", ["concat", "best_fit", "pad"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_chosen_arrays_through_a_dataloader_with_workers(corpus, packing, shuffle):
    def batches(**given) -> list[dict]:  # type: ignore[no-untyped-def]
        dataset = shardstream.StreamingDataset(
            corpus, seq_len=S, packing=packing, shuffle=shuffle, seed=1, **given
        )
        return list(shardstream.DataLoader(dataset, batch_size=4, num_workers=2))  # default_collate

    fields = ("input_ids", "labels")
    got, full = batches(seq_fields=list(fields)), batches()
    assert all(isinstance(batch["labels"], torch.Tensor) for batch in got)
    same_fields([numpy(batch) for batch in got], [numpy(batch) for batch in full], fields)


def test_a_mixture_carries_the_chosen_arrays(corpus):
    def read(**given) -> list[dict]:  # type: ignore[no-untyped-def]
        streams = [shardstream.Stream(corpus, weight=1)]
        return list(shardstream.StreamingDataset(streams, seq_len=S, packing="best_fit", seed=2, **given))

    got, full = read(seq_fields=("labels", "input_ids")), read()
    extra = set(full[0]) - set(SEQ_FIELDS)  # the stream of each sequence, where it is given
    assert all(set(sample) == {"input_ids", "labels"} | extra for sample in got)
    for a, b in zip(got, full, strict=True):
        for name in extra:
            assert a[name] == b[name]
    same_fields([{k: s[k] for k in ("input_ids", "labels")} for s in got], full, ("input_ids", "labels"))


@pytest.mark.parametrize("mode", ["concat", "best_fit", "pad"])
def test_build_sequences_makes_only_the_chosen_arrays(mode):
    rng = np.random.default_rng(0)
    ends = np.cumsum(rng.integers(1, 3 * S, 40))
    tokens = rng.integers(0, 500, int(ends[-1]), dtype=np.uint16)
    run = sequence_layout(Packing(S, mode), ends).run(0, 10)
    full = build_sequences(run, tokens, 0, doc_base=2, pad_id=9)
    for fields in CHOSEN:
        got = build_sequences(run, tokens, 0, doc_base=2, pad_id=9, fields=fields)
        assert set(got) == set(fields)
        for name in fields:
            np.testing.assert_array_equal(got[name], full[name])


@pytest.mark.parametrize("fields", [("input_ids", "mask"), (), "attention_mask", 3])
def test_unknown_fields_are_refused_with_the_valid_ones(corpus, fields):
    with pytest.raises(UsageError, match="seq_fields must name some of input_ids, labels, position_ids"):
        shardstream.StreamingDataset(corpus, seq_len=S, seq_fields=fields)


def test_seq_fields_needs_a_seq_len(corpus):
    with pytest.raises(UsageError, match="give a seq_len"):
        shardstream.StreamingDataset(corpus, seq_fields=("input_ids",))


def test_a_state_resumes_with_other_fields(corpus):
    full = shardstream.StreamingDataset(corpus, seq_len=S, packing="concat", seed=6)
    every = list(full)
    iterator = iter(full)
    for _ in range(7):
        next(iterator)
    state = full.state_dict()
    fields = ("input_ids", "labels")
    resumed = shardstream.StreamingDataset(corpus, seq_len=S, packing="concat", seed=6, seq_fields=fields)
    resumed.load_state_dict(state)
    same_fields(list(resumed), every[7:], fields)
