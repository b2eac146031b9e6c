"""Spark: write a DataFrame as a shardstream dataset, through a Python Data Source (pyspark 4).

    import shardstream.spark
    shardstream.spark.register(spark)
    (df.write.format("shardstream").option("format", "parquet")
       .option("samples_per_shard", 10_000).mode("overwrite").save("s3://bucket/corpus"))

Options are ``shardstream pack``'s flags with underscores: ``format``, ``shard_size``,
``samples_per_shard``, ``compression``, ``tokenizer``, ``text_field``, ``append_eos``,
and ``endpoint_url`` or ``storage_options`` (a JSON object) for the destination;
``key_column`` names the column that names samples where it is not ``__key__``. Each
column is a field (a tar member named by its extension: ``txt``, ``jpg``, ``cls``), as
in pack's Parquet and JSON Lines sources. Partition ``p``'s shards are
``part-PPPPP-shard-SSSSSS``, the shards ``pack --part p/N`` writes from the same rows.
The mode is ``error`` (the default: a dataset there is refused) or ``overwrite``.
Tasks write, the driver commits (NOTE [ One commit for every engine ] in
``shardstream.pack.commit``), so retried and speculative tasks write each row once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage

from shardstream.errors import UsageError
from shardstream.pack.attempt import AttemptMessage, WriteJob, write_partition
from shardstream.pack.commit import abort_job, begin_job, commit_job, prepare_job

__all__ = ["SparkDatasink", "register"]

_TEXT = ("format", "shard_size", "compression", "tokenizer", "text_field", "key_column")
_KNOWN = {*_TEXT, "samples_per_shard", "append_eos", "endpoint_url", "storage_options", "path"}


def register(spark: Any) -> None:
    """Make ``df.write.format("shardstream")`` write shardstream datasets in this session."""
    spark.dataSource.register(SparkDatasink)


class SparkDatasink(DataSource):
    """The ``shardstream`` format of ``DataFrameWriter`` (write only)."""

    @classmethod
    def name(cls) -> str:
        return "shardstream"

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        job = prepare_job(overwrite=overwrite, **job_options(self.options))
        begin_job(job)  # claims the destination on the driver, before any task runs
        return _Writer(job)


def job_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``prepare_job``'s keywords from Spark's options (all strings)."""
    given = {key.lower(): value for key, value in options.items()}
    unknown = sorted(set(given) - _KNOWN)
    if unknown:
        raise UsageError(
            f"unknown option {unknown[0]!r} of format shardstream: use {', '.join(sorted(_KNOWN))}"
        )
    url = given.get("path")
    if not url:
        raise UsageError("no destination: .save(url) names the dataset folder")
    kwargs: dict[str, Any] = {key: given[key] for key in _TEXT if given.get(key)}
    if "samples_per_shard" in given:
        try:
            kwargs["samples_per_shard"] = int(given["samples_per_shard"])
        except ValueError:
            raise UsageError(
                f"samples_per_shard must be a whole number, not {given['samples_per_shard']!r}"
            ) from None
    if "append_eos" in given:
        flag = given["append_eos"].strip().lower()
        if flag not in ("true", "false"):
            raise UsageError(f"append_eos is true or false, not {given['append_eos']!r}")
        kwargs["append_eos"] = flag == "true"
    storage_options: dict[str, Any] = {}
    if given.get("storage_options"):
        try:
            storage_options = json.loads(given["storage_options"])
        except ValueError as error:
            raise UsageError(f"storage_options must be a JSON object: {error}") from None
        if not isinstance(storage_options, dict):
            raise UsageError("storage_options must be a JSON object")
    if given.get("endpoint_url"):
        storage_options["endpoint_url"] = given["endpoint_url"]
    return {"url": url, "storage_options": storage_options, **kwargs}


class _Message(WriterCommitMessage):
    """A task's ``AttemptMessage``, as Spark carries it to the driver."""

    def __init__(self, attempt: AttemptMessage) -> None:
        self.attempt = attempt


class _Writer(DataSourceWriter):
    def __init__(self, job: WriteJob) -> None:
        self.job = job

    def write(self, iterator: Iterator[Any]) -> _Message:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        rows = (row.asDict(recursive=True) for row in iterator)
        return _Message(write_partition(self.job, partition, rows))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        attempts = [m.attempt for m in messages if isinstance(m, _Message)]
        commit_job(self.job, attempts, partitions=len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_job(self.job)
