"""Packed sequences in real processes: torchrun with 2 ranks (gloo) x 2 DataLoader
workers over S3 (moto, HTTP), a token mixture of two sources packed by ``shardstream
pack --tokenizer``, in the global order; stopped mid-epoch and resumed on 3 ranks, then
on 1: the same global batches, token for token, as the uninterrupted run."""

from __future__ import annotations

import json

import pytest

from shardstream.pack import pack
from tests.test_distributed import global_batches, read_epoch, torchrun
from tests.tokens_helpers import texts, train_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.s3]

G = 6  # global batch: 1, 2 and 3 ranks divide it


def test_torchrun_token_mixture_2x2_resumed_on_3_ranks_then_1_token_for_token(s3, tmp_path):
    base, options = s3
    tokenizer = train_tokenizer(tmp_path)
    for name, seed, count in (("a", 1, 160), ("b", 2, 90)):
        source = tmp_path / f"{name}.jsonl"
        source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(count, seed=seed)))
        pack(
            str(source),
            f"{base}/{name}",
            format="tokens",
            tokenizer=str(tokenizer),
            text_field="text",
            samples_per_shard=40,
            storage_options=options,
        )
    streams = json.dumps([{"url": f"{base}/a", "weight": 2}, {"url": f"{base}/b", "weight": 1}])
    runs = {name: tmp_path / name for name in ("whole", "first", "second", "third")}
    for out in runs.values():
        out.mkdir()
    extra = ("--seq-len", "16", "--packing", "best_fit")
    common = dict(env=None, global_batch=G, extra=extra)  # the s3 fixture pointed AWS_* at moto
    torchrun(streams, runs["whole"], ranks=2, workers=2, epochs=[0], **common)
    torchrun(streams, runs["first"], ranks=2, workers=2, epochs=[0], stop_after=3, **common)
    state = runs["first"] / "state.json"
    torchrun(streams, runs["second"], ranks=3, workers=1, epochs=[0], stop_after=2, resume=state, **common)
    state = runs["second"] / "state.json"
    torchrun(streams, runs["third"], ranks=1, workers=2, epochs=[0], resume=state, **common)
    whole = global_batches(read_epoch(runs["whole"], 0), G)
    parts = [global_batches(read_epoch(runs[name], 0), G) for name in ("first", "second", "third")]
    assert [len(part) for part in parts[:2]] == [3, 2]
    assert parts[0] + parts[1] + parts[2] == whole  # token for token
    streams_seen = {key.split("/", 1)[0] for batch in whole for key in batch}
    assert streams_seen == {"0", "1"}
    tokens = [key.split("/", 1)[1].split("|")[0].split() for batch in whole for key in batch]
    assert all(len(row) == 16 for row in tokens)
