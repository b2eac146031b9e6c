"""``shardstream explain``: the samples (for packed sequences, the documents and token
ranges) of global batch K, from the plan alone, are those a training run took at step K."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import shardstream
from shardstream.cli import main
from shardstream.dataset.explain import explain_step
from shardstream.errors import PlanError, UsageError
from tests.resume_harness import write_dataset
from tests.test_tokens_dataset import corpus, shard_documents  # noqa: F401  # the fixture

G = 6


def run_batches(url, world, **options):
    """Global batches of a run on ``world`` simulated ranks (rank batches joined)."""
    parts = []
    for rank in range(world):
        dataset = shardstream.StreamingDataset(
            url, num_replicas=world, rank=rank, order="global", global_batch_size=G, **options
        )
        parts.append(list(shardstream.DataLoader(dataset, batch_size=G // world, collate_fn=list)))
    return [list(itertools.chain(*batch)) for batch in zip(*parts, strict=True)]


def test_explain_names_the_keys_a_run_on_two_ranks_took_at_each_step(tmp_path):
    url = str(tmp_path / "ds")
    write_dataset(url, [7, 9, 5, 11])
    batches = run_batches(url, 2, seed=3, decode=False)
    for step in (0, 2, len(batches) - 1):
        found = explain_step(url, step=step, global_batch_size=G, seed=3)
        assert [entry.key for entry in found] == [sample["__key__"] for sample in batches[step]]
    with pytest.raises(PlanError, match="not one of the epoch's"):
        explain_step(url, step=len(batches), global_batch_size=G, seed=3)


def test_explain_gives_the_documents_and_token_ranges_of_each_sequence(corpus):  # noqa: F811
    url, _ = corpus
    documents = [doc for docs in shard_documents(url) for doc in docs]
    keys = {int(key): number for number, key in enumerate(sorted(f"{i:09d}" for i in range(len(documents))))}
    batches = run_batches(url, 3, seed=1, seq_len=16, packing="best_fit")
    for step in (0, 4):
        found = explain_step(url, step=step, global_batch_size=G, seed=1, seq_len=16, packing="best_fit")
        for entry, sample in zip(found, batches[step], strict=True):
            rebuilt = [documents[keys[int(key)]][lo:hi] for key, _, lo, hi in entry.pieces]
            real = sample["input_ids"][sample["document_ids"] >= 0]
            assert np.array_equal(np.concatenate(rebuilt), real)


def test_the_cli_prints_json_and_takes_a_mixture_as_a_json_list(tmp_path, capsys):
    url = str(tmp_path / "ds")
    write_dataset(url, [7, 9, 5, 11])
    assert main(["explain", url, "--step", "1", "--global-batch-size", "4", "--seed", "2", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = explain_step(url, step=1, global_batch_size=4, seed=2)
    assert printed == [entry.to_dict() for entry in expected]
    streams = json.dumps([{"url": url, "weight": 1}, {"url": url, "weight": 1}])
    assert main(["explain", streams, "--step", "0", "--global-batch-size", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert all(line.split()[1].split(":")[0] in ("0", "1") for line in lines)
    with pytest.raises(UsageError, match="give a seq_len"):
        explain_step(url, step=0, global_batch_size=4, packing="pad")
