"""Ray: write a Ray Dataset as a shardstream dataset.

    import shardstream.ray
    ds.write_datasink(shardstream.ray.Datasink("s3://bucket/corpus", format="parquet",
                                               samples_per_shard=10_000))

The keywords are ``shardstream.pack``'s (``format``, ``shard_size``,
``samples_per_shard``, ``compression``, ``overwrite``, ``storage_options``,
``tokenizer``, ``text_field``, ``append_eos``); ``key_column`` names the column that
names samples where it is not ``__key__``. Each column is a field, as in pack's
Parquet source; write task ``i``'s shards are ``part-IIIII-shard-SSSSSS``, as ``pack
--part i/N`` names them. Tasks write, the driver commits (NOTE [ One commit for every
engine ] in ``shardstream.pack.commit``): a task retried after its worker died writes
its rows once, and a failed write leaves no dataset and no files.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ray.data import Datasink as _RayDatasink
from ray.data.block import BlockAccessor

from shardstream.manifest import Manifest
from shardstream.pack.attempt import AttemptMessage, write_partition
from shardstream.pack.commit import abort_job, begin_job, commit_job, prepare_job

__all__ = ["Datasink"]


class Datasink(_RayDatasink):  # type: ignore[misc]
    """A shardstream dataset at ``url`` (any fsspec URL), for ``Dataset.write_datasink``.

    The options are checked here, the destination claimed when the write starts (one
    writer per destination; without ``overwrite`` a dataset there is refused).
    ``manifest`` is the dataset's manifest once the write completed.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        format: str | None = None,
        shard_size: int | str | None = None,
        samples_per_shard: int | None = None,
        compression: str | None = None,
        overwrite: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        tokenizer: str | os.PathLike[str] | None = None,
        text_field: str | None = None,
        append_eos: bool | None = None,
        key_column: str | None = None,
    ) -> None:
        # the job (its id) is made here, in the driver, so every task is handed the same one
        self.job = prepare_job(
            os.fspath(url),
            format=format,
            shard_size=shard_size,
            samples_per_shard=samples_per_shard,
            compression=compression,
            overwrite=overwrite,
            storage_options=storage_options,
            tokenizer=tokenizer,
            text_field=text_field,
            append_eos=append_eos,
            key_column=key_column,
        )
        self.manifest: Manifest | None = None
        self._begun = False

    def get_name(self) -> str:
        return "Shardstream"

    def on_write_start(self, schema: Any = None) -> None:
        begin_job(self.job)
        self._begun = True

    def write(self, blocks: Iterable[Any], ctx: Any) -> AttemptMessage:
        return write_partition(self.job, ctx.task_idx, _rows(blocks))

    def on_write_complete(self, write_result: Any) -> None:
        self.manifest = commit_job(self.job, write_result.write_returns)

    def on_write_failed(self, error: Exception) -> None:
        if self._begun:  # a job refused at its start holds nothing to undo
            abort_job(self.job)


def _rows(blocks: Iterable[Any]) -> Iterator[dict[str, Any]]:
    for block in blocks:
        table = BlockAccessor.for_block(block).to_arrow()
        for batch in table.to_batches(max_chunksize=1024):
            yield from batch.to_pylist()
