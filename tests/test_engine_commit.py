"""The commit protocol of engine write jobs, without an engine (NOTE [ One commit for every engine ])."""

from __future__ import annotations

import os

import pytest

from shardstream.errors import PackError, UsageError
from shardstream.lock import PackLease
from shardstream.pack.attempt import AttemptWriter, write_partition
from shardstream.pack.commit import abort_job, begin_job, choose_attempts, commit_job, prepare_job
from shardstream.storage import Storage
from tests.engine_helpers import PARTITIONS, check_exactly_once, files_of, packed_by_parts, partition


def _job(url: str, **options):
    job = prepare_job(url, **options)
    begin_job(job)
    return job


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_two_attempts_of_a_partition_commit_one_and_equal_pack_parts(tmp_path, fmt):
    dest = str(tmp_path / "engine")
    job = _job(dest, format=fmt, samples_per_shard=9)
    messages = [write_partition(job, p, partition(p)) for p in range(PARTITIONS)]
    messages.append(write_partition(job, 1, partition(1)))  # a speculative copy that finished too
    commit_job(job, reversed(messages), partitions=PARTITIONS)
    check_exactly_once(dest)
    assert not os.path.exists(tmp_path / "engine" / ".shardstream" / "attempts")
    assert files_of(dest) == files_of(packed_by_parts(str(tmp_path), fmt, 9))


def test_choose_attempts_is_one_per_partition_whatever_the_order(tmp_path):
    job = _job(str(tmp_path / "d"), samples_per_shard=50)
    a, b = (write_partition(job, 0, partition(0)) for _ in range(2))
    assert choose_attempts(job.run, [a, b]) == choose_attempts(job.run, [b, a])
    with pytest.raises(PackError, match="partition 1 has no finished attempt"):
        choose_attempts(job.run, [a, None], partitions=2)
    abort_job(job)


def test_abort_leaves_no_manifest_and_no_files(s3):
    url, options = s3
    dest = f"{url}/aborted"
    job = _job(dest, format="parquet", samples_per_shard=7, storage_options=options)
    messages = [write_partition(job, p, partition(p)) for p in range(2)]
    client = _client(options)
    bucket = url.removeprefix("s3://")
    # what a task killed in the middle of a large shard leaves: an upload, no object
    client.create_multipart_upload(
        Bucket=bucket, Key=f"aborted/{job.folder}/00002.dead/part-00002-shard-000000.tar"
    )
    abort_job(job, messages)
    assert files_of(url, options) == {}
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")


def _client(options):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=options["endpoint_url"],
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
        region_name="us-east-1",
    )


def test_a_failed_commit_aborts(tmp_path):
    dest = str(tmp_path / "d")
    job = _job(dest, format="parquet", samples_per_shard=7)
    messages = [
        write_partition(job, 0, partition(0)),
        write_partition(job, 1, [{"__key__": "x", "cls": "a"}]),
    ]
    with pytest.raises(PackError, match="one dataset has one schema"):
        commit_job(job, messages)
    assert files_of(dest) == {}


def test_an_attempt_that_outlives_the_commit_deletes_its_own_shards(s3):
    url, options = s3
    dest = f"{url}/late"
    job = _job(dest, samples_per_shard=5, storage_options=options)
    late = AttemptWriter(job, 0)
    for row in partition(0)[:5]:
        late.write(row)
    commit_job(job, [write_partition(job, p, partition(p)) for p in range(PARTITIONS)])
    with pytest.raises(PackError, match="is over"):
        late.write(partition(0)[5])  # its first shard is stored, then it sees the job's claim gone
    check_exactly_once(dest, options)


def test_the_destination_is_refused_as_pack_refuses_it(tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "shard-000000.tar").write_bytes(b"another tool's shard")
    with pytest.raises(UsageError, match=r"shard-000000\.tar"):
        _job(str(dest))
    assert files_of(str(dest)) == {"shard-000000.tar": files_of(str(dest))["shard-000000.tar"]}
    with Storage(str(dest)) as storage:
        lease = PackLease(storage)
        lease.acquire()  # a pack is writing there
        try:
            with pytest.raises(UsageError, match="another pack is writing"):
                _job(str(dest), overwrite=True)
        finally:
            lease.release()
    job = _job(str(dest), overwrite=True, samples_per_shard=50)  # replaces it, as pack --overwrite does
    commit_job(job, [write_partition(job, p, partition(p)) for p in range(PARTITIONS)])
    check_exactly_once(str(dest))


def test_token_shards_equal_pack_parts_with_the_same_tokenizer(tmp_path):
    pytest.importorskip("tokenizers")
    from tests.tokens_helpers import train_tokenizer

    tokenizer = train_tokenizer(tmp_path)
    dest = str(tmp_path / "engine")
    job = _job(dest, format="tokens", tokenizer=tokenizer, samples_per_shard=11)
    commit_job(job, [write_partition(job, p, partition(p)) for p in range(PARTITIONS)])
    packed = packed_by_parts(str(tmp_path), "tokens", 11, tokenizer=tokenizer)
    assert files_of(dest) == files_of(packed)


def test_a_job_taken_over_commits_nothing_and_deletes_nothing_of_the_other(tmp_path):
    dest = tmp_path / "d"
    job = _job(str(dest), samples_per_shard=50)
    messages = [write_partition(job, p, partition(p)) for p in range(PARTITIONS)]
    with Storage(str(dest)) as storage:
        for name in storage.list_files():
            if name.startswith(".shardstream-lock"):
                storage.delete(name)  # the job stalled past its lease; a pack took its claim over
        lease = PackLease(storage)
        lease.acquire()
        try:
            (dest / "shard-000000.tar").write_bytes(b"the other pack's shard")
            with pytest.raises(UsageError, match="lost its lock"):
                commit_job(job, messages)
            assert (dest / "shard-000000.tar").exists()
            assert not (dest / ".shardstream" / "manifest.json").exists()
        finally:
            lease.release()
