"""Real processes: torchrun with 2 ranks (gloo) x 2 DataLoader workers over S3 via HTTP,
resume under another number of ranks and workers, and an epoch through a faulty proxy.

torchrun takes seconds to start, so the launches are few (five): moto for a two-epoch
run that stops mid-way through a third, moto again to finish that epoch with 1 rank x 1
worker (no test asks for more workers than the machine's 2 cores), SeaweedFS for one epoch, and two for order="global" (NOTE [ Global order ]).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

import shardstream
from tests.faultproxy import FaultProxy
from tests.resume_harness import assert_exactly_once, collate_keys, write_dataset

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "dist_worker.py"
SIZES = [17, 9, 22, 14, 6, 20]  # 88 samples: no padding for 1 or 2 ranks
BATCH = 4

pytestmark = [pytest.mark.slow, pytest.mark.s3]


def torchrun(
    url,
    out,
    *,
    ranks,
    workers,
    epochs,
    env,
    stop_after=None,
    resume=None,
    global_batch=None,
    mix=None,
    extra=(),
):
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
        str(WORKER), url, str(out), "--workers", str(workers), "--batch-size", str(BATCH),
        "--epochs", *map(str, epochs),
    ]  # fmt: skip
    if stop_after is not None:
        command += ["--stop-after", str(stop_after)]
    if resume is not None:
        command += ["--resume", str(resume)]
    if global_batch is not None:
        command += ["--global-batch-size", str(global_batch)]
    if mix is not None:
        command += ["--mix", mix]
    command += list(extra)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def read_epoch(out, epoch):
    return json.loads((out / f"epoch-{epoch}.json").read_text())


def check_full_epoch(record, keys):
    ranks = record["ranks"]
    assert len(ranks) == record["world_size"]
    assert len({len(r) for r in ranks}) == 1, "ranks got different numbers of samples"
    assert_exactly_once([k for r in ranks for k in r], keys)


def test_torchrun_two_ranks_two_workers_then_resume_on_one_rank_three_workers(s3, tmp_path):
    base, options = s3
    url = f"{base}/ds"
    keys = write_dataset(url, SIZES, storage_options=options)
    env = dict(os.environ)  # the s3 fixture set AWS_ENDPOINT_URL and the credentials
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    torchrun(url, first, ranks=2, workers=2, epochs=[0, 1, 2], stop_after=3, env=env)
    epochs = [read_epoch(first, e) for e in (0, 1)]
    for record in epochs:
        check_full_epoch(record, keys)
        assert sum(len(r) for r in record["ranks"]) == len(keys)
    assert epochs[0]["ranks"] != epochs[1]["ranks"], "two epochs came in the same order"
    assert epochs[0]["batches"] == [epochs[0]["len"]] * 2  # len(loader) is the batches of each rank

    partial = read_epoch(first, 2)
    assert [len(r) for r in partial["ranks"]] == [3 * BATCH, 3 * BATCH]
    state = first / "state.json"
    assert json.loads(state.read_text())["epoch"] == 2
    torchrun(url, second, ranks=1, workers=1, epochs=[2], resume=state, env=env)
    rest = read_epoch(second, 2)
    assert rest["world_size"] == 1
    assert_exactly_once([k for r in partial["ranks"] + rest["ranks"] for k in r], keys)


def global_batches(record, size):
    """Global batch k of a record: every rank's k-th batch of ``size // world_size`` keys."""
    part = size // record["world_size"]
    ranks = record["ranks"]
    steps = len(ranks[0]) // part
    return [[key for rank in ranks for key in rank[k * part : (k + 1) * part]] for k in range(steps)]


def test_torchrun_global_order_same_batches_on_2x2_and_1x1_and_resume_from_2_on_1(s3, tmp_path):
    base, options = s3
    url = f"{base}/global"
    keys = write_dataset(url, SIZES, storage_options=options)
    env = dict(os.environ)
    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir()
    one.mkdir()
    size = 8  # 88 samples: 11 global batches
    # 2 ranks x 2 workers: epoch 0 whole, then epoch 0 again stopped after 3 batches
    torchrun(url, two, ranks=2, workers=2, epochs=[0, 0], stop_after=3, env=env, global_batch=size)
    # 1 rank x 1 worker: the rest of that stopped epoch from its state, then epoch 0 whole
    state = two / "state.json"
    torchrun(url, one, ranks=1, workers=1, epochs=[0, 0], resume=state, env=env, global_batch=size)
    whole = global_batches(json.loads((two / "pass-0.json").read_text()), size)
    assert len(whole) == 11
    assert_exactly_once([k for batch in whole for k in batch], keys)
    assert global_batches(json.loads((one / "pass-1.json").read_text()), size) == whole  # key by key
    head = global_batches(json.loads((two / "pass-1.json").read_text()), size)
    rest = global_batches(json.loads((one / "pass-0.json").read_text()), size)
    assert head == whole[:3]
    assert head + rest == whole


def test_torchrun_against_seaweedfs(seaweedfs, tmp_path):
    bucket = "ss-" + uuid.uuid4().hex[:8]
    seaweedfs.create_bucket(bucket)
    url = f"s3://{bucket}/ds"
    keys = write_dataset(url, SIZES, storage_options=seaweedfs.storage_options())
    env = {**os.environ, **seaweedfs.env()}
    torchrun(url, tmp_path, ranks=2, workers=2, epochs=[0], env=env)
    check_full_epoch(read_epoch(tmp_path, 0), keys)


def loader_keys(url, options):
    dataset = shardstream.StreamingDataset(
        url, storage_options=options, seed=1, shuffle_window=10, decode=False
    )
    loader = shardstream.DataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=collate_keys)
    return [k for batch in loader for k in batch]


def test_epoch_through_a_faulty_proxy_equals_a_clean_epoch(s3, moto_server):
    # A fixed bucket name: the proxy's choices hang on the request path, so they repeat run to run.
    options = s3[1]
    base = "s3://faulty-epoch-fixed"
    moto_server.create_bucket(base.removeprefix("s3://"))
    url = f"{base}/ds"
    keys = write_dataset(url, SIZES, storage_options=options)
    clean = loader_keys(url, options)
    assert_exactly_once(clean, keys)
    with FaultProxy(
        moto_server.endpoint, seed=12, error_rate=0.15, reset_rate=0.1, truncate_rate=0.1
    ) as proxy:
        faulty = loader_keys(url, dict(options, endpoint_url=proxy.endpoint))
    assert faulty == clean
    assert proxy.stats["error"] > 0
    assert proxy.stats["reset"] > 0
    assert proxy.stats["truncate"] > 0
