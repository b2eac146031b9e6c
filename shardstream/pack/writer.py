"""``ShardWriter``: a program hands it samples, it leaves a dataset (shards, sidecars, manifest).

    with shardstream.ShardWriter("s3://bucket/generated", format="tar", samples_per_shard=10_000) as w:
        for i, (text, label) in enumerate(generate()):
            w.write({"__key__": f"{i:09d}", "txt": text, "cls": label})

It writes the same shards and manifest as ``shardstream.pack`` given the same samples
and options: both cut shards with ``ShardCutter`` (NOTE [ Shard boundaries ] in
``cutter``) and write them with ``ShardOutput``.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any

from shardstream.errors import PackError
from shardstream.formats.base import Sample
from shardstream.manifest import Manifest
from shardstream.pack.cutter import SampleTooLarge, ShardCutter
from shardstream.pack.dest import DatasetTarget
from shardstream.pack.durable import ShardSync
from shardstream.pack.options import PackOptions, Part
from shardstream.pack.shard import ShardOutput, ShardResult
from shardstream.pack.sizing import sample_sizer
from shardstream.storage import Storage


def oversize_error(key: Any, size: int, options: PackOptions, budget: int) -> PackError:
    return PackError(
        f"sample {key!r} takes {size} bytes in a {options.format} shard, more than a shard of "
        f"{options.shard_size} bytes can hold ({budget} bytes of samples); raise shard_size (--shard-size)"
    )


class ShardWriter:
    """Write samples into shards at ``dest`` (any fsspec URL); ``close`` writes the manifest.

    A sample is a dict with ``"__key__"`` (str) and its fields: for tar, bytes, str or
    int values keyed by extension (``"txt"``, ``"jpg"``, ``"cls"``); for Parquet,
    Python values keyed by column. Used as a context manager, an exception inside the
    ``with`` block leaves no manifest (the whole shards written so far stay, and a rerun
    reuses them). From construction to ``close`` (or ``abort``) the writer holds a lease
    on ``dest``: another writer or pack there is refused (NOTE [ One pack per
    destination ] in ``lock``).
    """

    def __init__(
        self,
        dest: str | os.PathLike[str] | Storage,
        *,
        format: str = "tar",
        shard_size: int | str | None = None,
        samples_per_shard: int | None = None,
        compression: str | None = None,
        storage_options: dict[str, Any] | None = None,
        overwrite: bool = False,
        part: str | tuple[int, int] | Part | None = None,
    ) -> None:
        self.options = PackOptions.create(
            format=format,
            shard_size=shard_size,
            samples_per_shard=samples_per_shard,
            compression=compression,
            part=part,
            overwrite=overwrite,
        )
        self._cut = ShardCutter(*self.options.limits())  # bad limits are refused before any lease is taken
        self._fmt = self.options.fmt
        self._size = sample_sizer(self._fmt) if self.options.shard_size is not None else None
        self._own_storage = not isinstance(dest, Storage)
        self._storage = Storage(os.fspath(dest), storage_options) if not isinstance(dest, Storage) else dest
        try:
            self._target = DatasetTarget(self._storage, self.options)
            self._target.prepare()  # releases the lease itself if it fails
        except BaseException:
            if self._own_storage:
                self._storage.close()
            raise
        # A writer dropped without close or abort: its lease must not renew for ever.
        self._finalizer = weakref.finalize(self, _release, self._target)
        self._results: list[ShardResult] = []
        self._output: ShardOutput | None = None
        self._sync = ShardSync(self._storage)
        self._put: Callable[[Sample, int], int] = self._closed_put
        self._done = 0  # samples of the shards finished
        self._closed = False
        self.manifest: Manifest | None = None

    @property
    def url(self) -> str:
        return self._storage.url

    @property
    def num_samples(self) -> int:
        """Samples written so far."""
        return self._done + (self._cut.count if self._output is not None else 0)

    @property
    def num_shards(self) -> int:
        """Shards finished or open so far."""
        return len(self._results) + (self._output is not None)

    def write(self, sample: Sample) -> None:
        """Add one sample (see NOTE [ Shard boundaries ] in ``cutter``)."""
        cut = self._cut
        room = cut.room  # -1 before the first shard, and when the shard holds samples_per_shard
        if room < 0:
            self._next_shard(sample, None)
            return
        size = self._put(sample, room)  # writes the sample only if its size is at most room
        if size <= room:
            cut.keep(size)
            return
        self._next_shard(sample, size)

    def _next_shard(self, sample: Sample, size: int | None) -> None:
        if self._closed:
            self._closed_write(sample)
        if size is None and self._size is not None:  # not sized yet: refuse it before the cut
            size = self._size(sample)
        if size is not None:
            try:
                self._cut.check(size)
            except SampleTooLarge as error:
                raise oversize_error(sample.get("__key__"), size, self.options, error.budget) from None
        self._finish_shard()
        name = self.options.shard_name(len(self._results))
        output = self._output = ShardOutput(
            self._storage,
            self._fmt,
            name,
            compression=self.options.compression,
            expected=self._target.expected(name),
            on_stored=self._sync.add,
        )
        self._put = output.write_within if output.write_within is not None else self._sized_put
        self._cut.begin()
        self.write(sample)

    def _sized_put(self, sample: Sample, room: int) -> int:
        """``write_within`` for a format whose encoder has none: size by the format, then write."""
        size = self._size(sample) if self._size is not None else 0
        if size <= room and self._output is not None:
            self._output.write(sample)
        return size

    def _finish_shard(self) -> None:
        output, self._output = self._output, None
        if output is not None:
            self._put = self._closed_put
            self._target.fence()
            self._results.append(output.finish())
            self._done += self._cut.count

    def _closed_write(self, sample: Sample) -> None:
        raise PackError("write to a ShardWriter that is closed", url=self._storage.url)

    def _closed_put(self, sample: Sample, room: int) -> int:
        self._closed_write(sample)
        return 0

    def close(self) -> Manifest:
        """Finish the last shard, write the manifest (or the part's record) and return it."""
        if self.manifest is not None:
            return self.manifest
        if self._closed:
            raise PackError("close of a ShardWriter that was aborted", url=self._storage.url)
        self._closed = True
        with contextlib.ExitStack() as cleanup:
            if self._own_storage:
                cleanup.callback(self._storage.close)
            cleanup.callback(self._sync.close)
            try:
                self._finish_shard()
                if not self._results and self.options.part is None:
                    raise PackError(
                        "no samples were written: a dataset needs at least one", url=self._storage.url
                    )
                self.manifest = self._target.finish(self._results, self._sync)
            except BaseException:
                self.abort()
                raise
            self._finalizer.detach()
        return self.manifest

    def abort(self) -> None:
        """Stop without a manifest: drop the open shard (whole shards already stored stay)."""
        output, self._output = self._output, None
        self._put = self._closed_put
        self._closed = True
        self._finalizer.detach()
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(self._sync.close)
            # the lease; the record of the pack in progress stays for a rerun
            cleanup.callback(self._target.close, cleanup=True)
            if output is not None:
                output.abort()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            with contextlib.ExitStack() as cleanup:
                if self._own_storage:
                    cleanup.callback(self._storage.close)
                self.abort()


def _release(target: DatasetTarget) -> None:
    """The lease of a writer that was never closed (at its garbage collection, or at exit)."""
    target.close(cleanup=True)
