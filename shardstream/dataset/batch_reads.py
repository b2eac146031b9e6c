"""A ``MapDataset`` batch's reads on object storage: all at once, each decoded as it lands.

``BatchReads.read`` takes a batch as the reader takes a window (runs of consecutive
samples, in index order), plans its reads as a window's are (``WindowReader.plan_fetch``:
the runs of a shard within ``BATCH_GAP`` of each other share one ranged read, NOTE
[ Batch fetches ] in random_access.py), and sends every read at once into an
``IdlePool`` that grows to the batch's reads (NOTE [ Threads that linger ]). Each read is
checked in its own thread (the CRC lets the GIL go) and decoded in the caller's thread as
soon as it is in, while the slower reads are still on the wire (NOTE [ Decoding as reads
land ]). Local files are read as before: in the caller's thread, one read after another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future, as_completed, wait
from dataclasses import dataclass
from typing import cast

from shardstream.dataset.read_checks import Checked
from shardstream.dataset.reader import Read, WindowReader
from shardstream.errors import StorageError
from shardstream.formats.base import Sample, SampleIndex
from shardstream.plan import Run
from shardstream.storage.idle_pool import IdlePool
from shardstream.types import ByteRange

__all__ = ["IDLE_SECONDS", "BatchReads"]

IDLE_SECONDS = 1.0  # how long a batch's read thread waits for the next batch (NOTE [ Threads that linger ])

# NOTE [ Decoding as reads land ]
# A batch of random indices reads each shard it touches at once, and waits for the
# slowest of those GETs. Decoding after the last one arrives would add all the decoding
# to that wait; decoding each read in the caller's thread as it lands hides all but the
# last read's behind the others (the GIL is free while they wait on sockets). Every read
# is still checked (in its own thread, before its bytes are decoded), a failed check or
# read is the same error as a window's, and the samples come back in the batch's order.


@dataclass(frozen=True, slots=True)
class _Window:
    """Runs as ``WindowReader.fetch`` and ``decode`` take a window's."""

    runs: tuple[Run, ...]
    shards: tuple[int, ...]


class BatchReads:
    """Reads of ``MapDataset`` batches through ``reader`` (this process's), in up to
    ``threads`` threads that linger ``idle`` seconds between batches."""

    def __init__(self, reader: WindowReader, threads: int, idle: float = IDLE_SECONDS) -> None:
        self.reader = reader
        # reads go over a wire: at once, in threads; else in the caller's, as a window's are
        self.pool = IdlePool(threads, idle, "shardstream-batch") if reader.bytes.ahead else None

    def read(self, runs: Sequence[Run], shards: Sequence[int]) -> list[Sample | None]:
        """The samples of ``runs`` (of ``shards``), in run order, checked and decoded."""
        reader = self.reader
        if self.pool is None:
            window = _Window(tuple(runs), tuple(shards))
            got, _ = reader.decode(window, reader.fetch(window))
            return cast(list[Sample | None], got)  # a list: the reader is made without columns=True
        planned = reader.plan_fetch(runs, reader.load_indexes(list(shards)))
        futures: dict[Future[Checked], Read] = {
            self.pool.submit(self._fetch, read, item, planned.indexes[read.shard]): read
            for read, item in zip(planned.reads, planned.items, strict=True)
        }
        starts = [0] * (len(runs) + 1)  # where each run's samples start among the batch's
        for n, run in enumerate(runs):
            starts[n + 1] = starts[n] + run.stop - run.start
        out: list[Sample | None] = [None] * starts[-1]
        try:
            for future in as_completed(futures):
                read = futures[future]
                data, bad = future.result()
                self._place(out, starts, runs, read, data, planned.indexes[read.shard], bad)
        except BaseException:
            for future in futures:
                future.cancel()
            wait(futures)  # no thread still reads into what is dropped
            raise
        return out

    def _fetch(self, read: Read, item: tuple[str, ByteRange | None], index: SampleIndex) -> Checked:
        """``read``'s bytes (``item`` of storage), checked (in a thread of the pool)."""
        reader = self.reader
        try:
            data = reader.bytes.read(*item)
        except StorageError as error:
            raise reader.fetcher.storage_error(error, item) from error
        if item[1] is None and len(data) < read.rng.end:  # the whole object, shorter than said
            reader.fetcher.too_short(read, len(data))
        return reader.check(read, data, index)

    def _place(
        self,
        out: list[Sample | None],
        starts: list[int],
        runs: Sequence[Run],
        read: Read,
        data: bytes | memoryview,
        index: SampleIndex,
        bad: tuple[int, ...],
    ) -> None:
        """Decode ``read`` (its runs in its byte order) into ``out``, each run where it starts."""
        window = _Window(tuple(runs[n] for n in read.runs), (read.shard,))
        alone = dataclasses.replace(read, runs=tuple(range(len(read.runs))))
        got, _ = self.reader.decode(window, [(alone, data, index, bad)])
        samples = cast(list[Sample | None], got)
        at = 0
        for n in read.runs:
            length = runs[n].stop - runs[n].start
            out[starts[n] : starts[n] + length] = samples[at : at + length]
            at += length

    def close(self) -> None:
        """End the pool's threads now (not waiting out their idle time)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
