"""The task side of an engine's write job: one attempt at one partition.

A task (a Spark task attempt, a Ray write task) cuts its partition's rows into shards
as ``ShardWriter`` does (NOTE [ Shard boundaries ] in ``cutter``), streams each shard
to an object of its own under the job's attempts folder, and returns an
``AttemptMessage``: every shard's manifest entry under its final name, its sidecar and
where this attempt stored it. The driver commits one attempt per partition
(``shardstream.pack.commit``, NOTE [ One commit for every engine ] there).
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import IO, Any, cast

from shardstream.errors import PackError, ShardstreamError, StorageError, UsageError
from shardstream.folder import META_FOLDER, ShardResult, part_prefix, shard_name
from shardstream.formats.base import Sample
from shardstream.pack.cutter import SampleTooLarge, ShardCutter
from shardstream.pack.joblease import JobLease
from shardstream.pack.options import PackOptions
from shardstream.pack.shard import ShardOutput
from shardstream.pack.sources.base import tar_ready
from shardstream.pack.tokenize import DocumentWriter
from shardstream.pack.writer import oversize_error
from shardstream.storage import Storage

ATTEMPTS = f"{META_FOLDER}/attempts"  # every job's attempts folder is in here
_RENEW_ROWS = 1024  # rows between looks at the clock for the claim's renewal


@dataclass(frozen=True, slots=True)
class WriteJob:
    """What every task of one engine write job needs (pickled to each)."""

    url: str
    options: PackOptions
    run: str  # the job's id: its claim and its attempts folder are named for it
    lease: float
    storage_options: dict[str, Any] = field(default_factory=dict)
    key_column: str | None = None  # the column that names samples, where not ``__key__``

    @property
    def folder(self) -> str:
        return f"{ATTEMPTS}/{self.run}"


@dataclass(frozen=True, slots=True)
class WrittenShard:
    """One shard an attempt stored: its result under its final name, where it is, its sidecar."""

    result: ShardResult
    temp: str
    sidecar: bytes


@dataclass(frozen=True, slots=True)
class AttemptMessage:
    """What a task sends the driver: its partition's shards, in order, as this attempt wrote them."""

    run: str
    partition: int
    attempt: str
    rows: int
    shards: tuple[WrittenShard, ...]


def write_partition(job: WriteJob, partition: int, rows: Iterable[Mapping[str, Any]]) -> AttemptMessage:
    """Write all of ``rows`` (one partition) as one attempt; nothing of it stays on an error."""
    writer = AttemptWriter(job, partition)
    try:
        for row in rows:
            writer.write(row)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


class AttemptWriter:
    """One attempt at partition ``partition``: ``write`` rows, then ``close`` (or ``abort``)."""

    def __init__(self, job: WriteJob, partition: int) -> None:
        if partition < 0:
            raise UsageError(f"partition {partition}: partitions count from 0")
        self.job = job
        self.partition = partition
        self.attempt = secrets.token_hex(8)
        self.options = job.options
        self._fmt = self.options.fmt
        self._cut = ShardCutter(*self.options.limits())
        self._size = self._fmt.sample_size if self.options.shard_size is not None else None
        self._storage = Storage(job.url, job.storage_options)
        self._lease = JobLease(self._storage, job.run, job.lease)
        self._renewed = -float("inf")  # the first shard stored renews the job's claim
        self._stream = _AttemptStorage(self._storage, f"{job.folder}/{partition:05d}.{self.attempt}")
        self._output: ShardOutput | None = None
        self._documents: DocumentWriter | None = None
        self._shards: list[WrittenShard] = []
        self.rows = 0

    def write(self, row: Mapping[str, Any]) -> None:
        sample = self._sample(row)
        size = self._size(sample) if self._size is not None else 0
        if size > self._cut.room:  # the rule of NOTE [ Shard boundaries ]: it begins the next shard
            try:
                self._cut.check(size)
            except SampleTooLarge as error:
                raise oversize_error(sample["__key__"], size, self.options, error.budget) from None
            self._finish_shard()
            self._begin_shard()
        self._cut.keep(size)
        try:
            if self._documents is not None:
                self._documents.add(sample)
            elif self._output is not None:
                self._output.write(sample)
        except ShardstreamError as error:
            raise PackError(
                f"partition {self.partition}, sample {sample['__key__']!r}: {error.message}",
                url=self.job.url,
                shard=error.shard,
            ) from None
        self.rows += 1
        if self.rows % _RENEW_ROWS == 0 and time.monotonic() - self._renewed > self.job.lease / 4:
            self._keep_alive()  # a shard that takes long to fill must not let the claim run out

    def _sample(self, row: Mapping[str, Any]) -> Sample:
        """A row as pack's sources give a sample: fields by column, ``__key__`` last."""
        sample = {k: bytes(v) if isinstance(v, bytearray) else v for k, v in row.items()}
        key = sample.pop(self.job.key_column or "__key__", None)
        if self.job.key_column is not None:
            sample.pop("__key__", None)
        sample["__key__"] = f"{self.partition:05d}-{self.rows:09d}" if key is None else str(key)
        if self._fmt.stores_bytes and self.options.tokenizing is None:
            sample = tar_ready(sample, self.job.url, None)
        return sample

    def _begin_shard(self) -> None:
        name = shard_name(part_prefix(self.partition), len(self._shards), self._fmt.suffix)
        output = ShardOutput(
            cast(Storage, self._stream), self._fmt, name, compression=self.options.compression
        )
        self._output = output
        if self.options.tokenizing is not None:
            self._documents = DocumentWriter(output.write, self.options.tokenizing, self._fmt)
        self._cut.begin()

    def _finish_shard(self) -> None:
        output, documents = self._output, self._documents
        self._output = self._documents = None
        if output is None:
            return
        try:
            if documents is not None:
                documents.flush()
        except BaseException:
            output.abort()
            raise
        result = output.finish()
        if documents is not None and result.info.tokens is None:  # as pack's write_job counts them
            result = replace(result, info=replace(result.info, tokens=documents.tokens))
        temp = self._stream.temp(output.name)
        self._shards.append(WrittenShard(result, temp, self._stream.sidecars.pop(result.info.index)))
        self._keep_alive()

    def _keep_alive(self) -> None:
        """Renew the job's claim; stop (deleting what this attempt stored) once the job is over.

        The claim goes before the driver's last sweep of the attempts folder, so a shard
        stored after that sweep's listing is seen here, and deleted by this attempt.
        """
        if not self._lease.held():
            self.abort()
            raise PackError(
                f"the write job {self.job.run} is over (committed or aborted): partition "
                f"{self.partition}'s attempt {self.attempt} stops",
                url=self.job.url,
            )
        if time.monotonic() - self._renewed > self.job.lease / 4:
            self._lease.renew()
            self._renewed = time.monotonic()

    def close(self) -> AttemptMessage:
        """Finish the last shard; the message for the driver."""
        self._finish_shard()
        self._storage.close()
        return AttemptMessage(self.job.run, self.partition, self.attempt, self.rows, tuple(self._shards))

    def abort(self) -> None:
        """Drop the open shard and delete the shards this attempt stored."""
        output, self._output, self._documents = self._output, None, None
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(self._storage.close)
            if output is not None:
                cleanup.callback(output.abort)
            for shard in self._shards:
                with contextlib.suppress(ShardstreamError):
                    self._storage.delete(shard.temp)
            self._shards = []


class _AttemptStorage:
    """What ``ShardOutput`` writes through for an attempt: a shard streams to its
    attempt's temporary object (a multipart upload on S3, no local copy), its sidecar is
    kept for the message, and nothing is ever there to reuse."""

    def __init__(self, storage: Storage, folder: str) -> None:
        self._storage = storage
        self.folder = folder
        self.url = storage.url
        self.sidecars: dict[str, bytes] = {}

    def temp(self, name: str) -> str:
        return f"{self.folder}/{name}"

    @contextlib.contextmanager
    def writer(self, name: str, *, durable: bool = True) -> Iterator[IO[bytes]]:
        path = self.temp(name)
        f = open_stream(self._storage, path)
        try:
            yield f
        except BaseException:
            discard_stream(self._storage, path, f)
            raise
        close_stream(f)

    def write(self, path: str, data: bytes, *, durable: bool = True) -> None:
        self.sidecars[path] = data

    def size(self, path: str) -> int:
        raise StorageError("an attempt's shard is new", url=self.url, shard=path)

    def exists(self, path: str) -> bool:
        return False


def open_stream(storage: Storage, path: str) -> IO[bytes]:
    """``path`` opened for a streamed write: a local file, or the file system's own
    upload stream (s3fs: a multipart upload, a part at a time from memory)."""
    root = storage.local_root
    if root is not None:
        target = os.path.join(root, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        return open(target, "wb")
    return cast(IO[bytes], storage.fs.open(storage.full_url(path), "wb"))


def close_stream(f: IO[bytes]) -> None:
    """Complete the object (local: durable before the manifest can name it)."""
    if isinstance(f, io.BufferedWriter):
        f.flush()
        os.fsync(f.fileno())
    f.close()


def discard_stream(storage: Storage, path: str, f: IO[bytes]) -> None:
    """Drop a stream: nothing of it may become an object (an S3 multipart upload is aborted)."""
    from fsspec.spec import AbstractBufferedFile

    with contextlib.suppress(Exception):
        if isinstance(f, AbstractBufferedFile):
            f.discard()
            f.closed = True  # discarded: it must not upload at its garbage collection
        else:
            f.close()
    with contextlib.suppress(ShardstreamError):
        storage.delete(path)
