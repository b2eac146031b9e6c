"""A mixture in real processes: torchrun with 2 ranks (gloo) x 2 DataLoader workers over
S3 (moto, HTTP), three streams of different sizes in two buckets, through two endpoints,
tar and Parquet; stopped mid-epoch and resumed twice, each time on another world size
and worker count."""

from __future__ import annotations

import collections
import json

import pytest

from shardstream.pack import ShardWriter
from tests.resume_harness import write_dataset
from tests.test_distributed import global_batches, read_epoch, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.s3]

QUOTAS = {"0": 48, "1": 28, "2": 20}  # tar [17, 9, 22] once; tar [5, 6] x 2.5; Parquet 30 rows, choose 20


def per_stream(keys):
    return collections.Counter(key.split("/", 1)[0] for key in keys)


def write_streams(s3, moto_server):
    """Three streams in two buckets, stream 1 through another endpoint: JSON for dist_worker."""
    base, options = s3
    other = base + "-b"
    moto_server.create_bucket(other[len("s3://") :])
    write_dataset(f"{base}/a", [17, 9, 22], storage_options=options)
    write_dataset(f"{other}/b", [5, 6], storage_options=options)
    with ShardWriter(f"{base}/c", format="parquet", samples_per_shard=7, storage_options=options) as writer:
        for i in range(30):
            writer.write({"__key__": f"row{i:02d}", "text": f"t{i}", "label": i})
    # stream 1 through another endpoint (the same server by name): its own storage options
    by_name = {**options, "endpoint_url": options["endpoint_url"].replace("127.0.0.1", "localhost")}
    return json.dumps(
        [
            {"url": f"{base}/a"},
            {"url": f"{other}/b", "repeat": 2.5, "storage_options": by_name},
            {"url": f"{base}/c", "choose": 20},
        ]
    )


def test_torchrun_mixture_2x2_quotas_then_resume_on_1x1_and_2x1(s3, moto_server, tmp_path):
    streams = write_streams(s3, moto_server)
    runs = [tmp_path / name for name in ("first", "second", "third")]
    for out in runs:
        out.mkdir()
    env = None  # the s3 fixture pointed AWS_* at the server: torchrun inherits it
    # 2 ranks x 2 workers: epoch 0 whole, then epoch 0 again, stopped after 3 batches
    torchrun(streams, runs[0], ranks=2, workers=2, epochs=[0, 0], stop_after=3, env=env)
    whole = json.loads((runs[0] / "pass-0.json").read_text())
    keys = [key for rank in whole["ranks"] for key in rank]
    assert [len(rank) for rank in whole["ranks"]] == [48, 48]
    assert per_stream(keys) == QUOTAS
    downsampled = [key for key in keys if key.startswith("2/")]
    assert len(set(downsampled)) == len(downsampled) == 20  # each at most once
    head = json.loads((runs[0] / "pass-1.json").read_text())
    # 1 rank x 1 worker: 2 batches more; then 2 ranks x 1 worker: the rest
    torchrun(
        streams, runs[1], ranks=1, workers=1, epochs=[0], stop_after=2, resume=runs[0] / "state.json", env=env
    )
    torchrun(streams, runs[2], ranks=2, workers=1, epochs=[0], resume=runs[1] / "state.json", env=env)
    parts = [head, read_epoch(runs[1], 0), read_epoch(runs[2], 0)]
    assert [len(rank) for rank in parts[1]["ranks"]] == [2 * 4]
    resumed = [key for part in parts for rank in part["ranks"] for key in rank]
    assert collections.Counter(resumed) == collections.Counter(keys)  # sample for sample


def test_torchrun_stratified_mixture_2x2_every_global_batch_holds_the_shares(s3, moto_server, tmp_path):
    streams = write_streams(s3, moto_server)
    torchrun(streams, tmp_path, ranks=2, workers=2, epochs=[0], env=None, global_batch=8, mix="stratified")
    batches = global_batches(read_epoch(tmp_path, 0), 8)
    assert len(batches) == 12
    shares = {stream: 8 * quota / 96 for stream, quota in QUOTAS.items()}
    for batch in batches:
        counts = per_stream(batch)
        assert all(abs(counts[stream] - share) < 1 for stream, share in shares.items())
    assert per_stream([key for batch in batches for key in batch]) == QUOTAS
