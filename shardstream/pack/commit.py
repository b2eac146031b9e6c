"""The driver side of an engine's write job: begin, commit one attempt per partition, or abort.

# NOTE [ One commit for every engine ]
# Spark retries a failed task and runs speculative copies of slow ones; Ray retries a
# task whose worker died. Two attempts at one partition may both write, and one that
# failed may have written half. So a task never writes a name that a reader sees: it
# streams each shard to an object under ``.shardstream/attempts/<job>/<partition>.<attempt>/``
# (a name no other attempt has, hidden from the readers of NOTE [ The dataset folder as
# others read it ]) and returns a message: per shard its manifest entry under its final
# name, its sidecar and where it is. The driver, given the messages of the attempts the
# engine kept, picks exactly one per partition (the engine's; where it kept two, the
# smaller attempt id), moves each chosen shard to ``part-PPPPP-shard-SSSSS`` (partition,
# sequence: the names of ``pack --part``), writes its sidecar and the part records, and
# writes the manifest last. Then it gives up the job's claim and deletes the attempts
# folder: every other attempt's objects, and uploads left in flight. A task checks the
# claim after storing each shard and deletes its own once the claim is gone, so an
# attempt that outlives the commit (a speculative copy Spark is still killing) leaves
# nothing behind either. ``abort`` deletes the attempts folder and whatever the commit
# had moved: no manifest, no files. Same rows and partitioning give the same shard
# bytes and names and so a byte-identical manifest, whichever attempts won, and the
# same as ``pack --part I/N`` of each partition's rows then ``index``. The destination
# is refused as ``pack`` refuses it: another writer's claim, or without overwrite any
# dataset or shard-named file already there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shardstream.errors import PackError, ShardstreamError, UsageError
from shardstream.folder import (
    LEGACY_MANIFEST_NAME,
    MANIFEST_NAME,
    PACK_RECORD_RE,
    PART_RECORD_RE,
    ShardResult,
    build_manifest,
    part_record_name,
    shard_name_re,
)
from shardstream.lock import lease_seconds
from shardstream.manifest import Manifest
from shardstream.pack.attempt import ATTEMPTS, AttemptMessage, WriteJob
from shardstream.pack.joblease import JobLease
from shardstream.pack.options import PackOptions
from shardstream.pack.tokenize import load_tokenizing
from shardstream.storage import Storage

_THREADS = 16  # objects moved or deleted at once on an object store
T = TypeVar("T")


def prepare_job(
    url: str,
    *,
    format: str | None = None,
    shard_size: int | str | None = None,
    samples_per_shard: int | None = None,
    compression: str | None = None,
    overwrite: bool = False,
    tokenizer: str | os.PathLike[str] | None = None,
    text_field: str | None = None,
    append_eos: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
    key_column: str | None = None,
) -> WriteJob:
    """A new job writing ``url``, with ``shardstream.pack``'s options, validated (no I/O).

    ``begin_job`` claims the destination; a task may be handed the job before or after.
    """
    if format is None:
        format = "tokens" if tokenizer is not None else "tar"
    if tokenizer is None and (text_field is not None or append_eos is not None):
        raise UsageError("text_field and append_eos say how to tokenize: pass a tokenizer too")
    options = PackOptions.create(
        format=format,
        shard_size=shard_size,
        samples_per_shard=samples_per_shard,
        compression=compression,
        overwrite=overwrite,
        tokenizing=None
        if tokenizer is None
        else load_tokenizing(tokenizer, text_field=text_field, append_eos=append_eos),
    )
    options.limits()  # a shard size too small for any sample is refused before the claim
    return WriteJob(
        url, options, secrets.token_hex(8), lease_seconds(), dict(storage_options or {}), key_column
    )


def begin_job(job: WriteJob) -> None:
    """Claim the job's destination and refuse what ``pack`` refuses (on the driver, before any task).

    With ``overwrite`` the manifest there is deleted now (no half dataset is readable
    from here on) and the old dataset's files at the commit.
    """
    with Storage(job.url, job.storage_options) as storage:
        lease = JobLease(storage, job.run, job.lease)
        lease.acquire()
        try:
            files = storage.list_files()
            if not job.options.overwrite:
                _refuse_existing(storage, files)
            else:
                for name in (MANIFEST_NAME, LEGACY_MANIFEST_NAME):
                    if name in files:
                        storage.delete(name)
            # the attempts of jobs whose driver died: no live job but this one may write here now
            _delete_all(storage, [f for f in files if f.startswith(ATTEMPTS + "/")])
            if storage.local_root is not None:  # and their empty folders
                shutil.rmtree(os.path.join(storage.local_root, ATTEMPTS), ignore_errors=True)
        except BaseException:
            lease.release()
            raise


def _refuse_existing(storage: Storage, files: list[str]) -> None:
    names = shard_name_re()
    for path in files:
        if path in (MANIFEST_NAME, LEGACY_MANIFEST_NAME) or names.match(path) or PART_RECORD_RE.match(path):
            raise UsageError(
                f"the destination holds {path}: a dataset (or shards of one) is there; shardstream "
                "replaces only with overwrite (Spark: mode('overwrite'); Ray: overwrite=True), "
                "or write another folder",
                url=storage.url,
                shard=path,
            )
        if PACK_RECORD_RE.match(path):
            raise UsageError(
                f"an unfinished pack left {path} here; rerun it, or overwrite", url=storage.url, shard=path
            )


def choose_attempts(
    run: str, messages: Iterable[AttemptMessage | None], partitions: int | None = None
) -> list[AttemptMessage]:
    """One attempt per partition ``0 .. partitions - 1``, in partition order (pure).

    Where the engine kept two attempts of a partition, the one with the smaller id wins.
    """
    chosen: dict[int, AttemptMessage] = {}
    for message in messages:
        if message is None:
            continue
        if message.run != run:
            raise PackError(f"a message of job {message.run} reached the commit of job {run}")
        held = chosen.get(message.partition)
        if held is None or message.attempt < held.attempt:
            chosen[message.partition] = message
    count = partitions if partitions is not None else max(chosen, default=-1) + 1
    missing = [p for p in range(count) if p not in chosen]
    beyond = [p for p in chosen if p >= count]
    if missing or beyond:
        what = f"partition {missing[0]} has no finished attempt" if missing else f"partition {beyond[0]}"
        raise PackError(f"cannot commit job {run}: {what} (of {count} partitions)")
    return [chosen[p] for p in range(count)]


def plan_commit(job: WriteJob, chosen: list[AttemptMessage]) -> tuple[Manifest, dict[int, Manifest]]:
    """The manifest and every partition's record, from the chosen attempts (pure)."""
    options = job.options
    tokens = None if options.tokenizing is None else options.tokenizing.info()
    results: list[ShardResult] = []
    records = {}
    for message in chosen:
        part = [shard.result for shard in message.shards]
        results += part
        records[message.partition] = build_manifest(options.format, part, tokens)
    if not results:
        raise PackError("the job wrote no samples: a dataset needs at least one", url=job.url)
    return build_manifest(options.format, results, tokens), records


def commit_job(
    job: WriteJob, messages: Iterable[AttemptMessage | None], partitions: int | None = None
) -> Manifest:
    """Commit the job (NOTE [ One commit for every engine ]); on an error, ``abort_job``."""
    with Storage(job.url, job.storage_options) as storage:
        lease = JobLease(storage, job.run, job.lease)
        try:
            lease.check()
            lease.renew()
            chosen = choose_attempts(job.run, messages, partitions)
            manifest, records = plan_commit(job, chosen)
            shards = [shard for message in chosen for shard in message.shards]
            _map(lambda s: _move(storage, s.temp, s.result.info.path), shards)
            _map(lambda s: storage.write(s.result.info.index, s.sidecar), shards)
            count = len(chosen)
            _map(lambda p: storage.write(part_record_name(p, count), records[p].to_json().encode()), records)
            if job.options.overwrite:
                _delete_all(storage, _stale(storage, manifest, count))
            if storage.needs_sync:
                storage.sync("")  # the renames into the folder (each file was made durable by its task)
            lease.check()
            storage.write_manifest(manifest)
        except BaseException:
            _abort(storage, lease, job)
            raise
        lease.release()
        _sweep(storage, job)
    return manifest


def abort_job(job: WriteJob, messages: Iterable[AttemptMessage | None] = ()) -> None:
    """Leave no dataset and no files of this job (nothing at all where it lost its claim)."""
    with Storage(job.url, job.storage_options) as storage:
        _abort(storage, JobLease(storage, job.run, job.lease), job)


def _abort(storage: Storage, lease: JobLease, job: WriteJob) -> None:
    with contextlib.suppress(ShardstreamError):
        if lease.alone():  # only the claim's holder may delete shard names; a job refused or taken over not
            names = shard_name_re()
            files = storage.list_files()
            _delete_all(storage, [f for f in files if names.match(f) or PART_RECORD_RE.match(f)])
            lease.release()
    _sweep(storage, job)


def _stale(storage: Storage, manifest: Manifest, count: int) -> list[str]:
    """What an overwritten dataset left that the new one does not name (shardstream's names only)."""
    keep = {p for s in manifest.shards for p in (s.path, s.index)}
    keep |= {part_record_name(p, count) for p in range(count)}
    names = shard_name_re()
    return [
        f
        for f in storage.list_files()
        if f not in keep and (names.match(f) or PART_RECORD_RE.match(f) or PACK_RECORD_RE.match(f))
    ]


def _move(storage: Storage, temp: str, final: str) -> None:
    root = storage.local_root
    if root is not None:
        os.replace(os.path.join(root, temp), os.path.join(root, final))
        return
    fs = storage.fs
    fs.copy(storage.full_url(temp), storage.full_url(final))  # server-side on S3
    storage.delete(temp)


def _sweep(storage: Storage, job: WriteJob) -> None:
    """Delete the job's attempts folder: every attempt's objects, and uploads left in flight."""
    with contextlib.suppress(ShardstreamError, OSError):
        root = storage.local_root
        if root is not None:
            shutil.rmtree(os.path.join(root, job.folder), ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, ATTEMPTS))  # only when no other job's folder is in it
        else:
            prefix = job.folder + "/"
            _delete_all(storage, [f for f in storage.list_files() if f.startswith(prefix)])
            _abort_uploads(storage, prefix)
    with contextlib.suppress(ShardstreamError):
        # a task renews the claim only after it saw it there; one that saw it just before the
        # release may have put it back
        JobLease(storage, job.run, job.lease).release()


def _abort_uploads(storage: Storage, prefix: str) -> None:
    """Abort the S3 multipart uploads under ``prefix`` (a task killed mid-shard leaves one)."""
    call = getattr(storage.fs, "call_s3", None)
    if call is None or not storage.url.startswith("s3://"):
        return
    bucket, _, key = storage.full_url(prefix).removeprefix("s3://").partition("/")
    found = call("list_multipart_uploads", Bucket=bucket, Prefix=key)
    for upload in found.get("Uploads", []):
        with contextlib.suppress(Exception):
            call("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])


def _delete_all(storage: Storage, paths: list[str]) -> None:
    _map(storage.delete, paths)


def _map(function: Callable[[T], object], items: Iterable[T]) -> None:
    items = list(items)
    if len(items) <= 1:
        for item in items:
            function(item)
        return
    with ThreadPoolExecutor(min(_THREADS, len(items)), thread_name_prefix="shardstream-commit") as pool:
        for _ in pool.map(function, items):
            pass
