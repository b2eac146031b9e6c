"""Reading the windows of an epoch plan: ranged reads, coalesced, prefetched.

A window is a few runs of consecutive samples (``Run(shard, start, stop)``). For each run
the reader asks the shard's sample index for the byte range of those samples, grown to
whole check blocks (NOTE [ Checksummed reads ] in formats/checks.py), reads it with one
ranged read and checks its blocks' CRCs before decoding; close runs of one shard share a
read, whose runs are decoded in one format call (NOTE [ One call per read ] in runs.py).
The sample indexes (sidecars) are loaded when first needed and kept in a small LRU. While
the dataset decodes and yields one window, the bytes of the next one are read in a background
thread (see NOTE [ Getting the bytes ] in fetch.py), so a worker holds at most its current
window and what it prefetches, whatever the dataset's size.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from typing import Any, cast

import numpy as np

from shardstream.dataset.budget import (
    DEFAULT_READ_BUDGET,
    ReadBudget,
    fetch_in_turn,
    fetched_in_order,
    in_pieces,
)
from shardstream.dataset.fetch import READ_THREADS, ByteFetcher
from shardstream.dataset.fields import with_all_fields
from shardstream.dataset.heal import CacheHealer
from shardstream.dataset.indexes import INDEX_CACHE_SIZE, IndexCache
from shardstream.dataset.runs import (
    COALESCE_GAP,
    REMOTE_COALESCE_GAP,
    Read,
    plan_reads,
    run_table,
    taken_from_reads,
)
from shardstream.errors import FormatError, StorageError
from shardstream.formats import get_format
from shardstream.formats.base import Sample, SampleColumns, SampleIndex
from shardstream.formats.checks import BLOCK, ShardChecks
from shardstream.manifest import Manifest, ShardInfo
from shardstream.storage import Expected, Prefetcher, Storage
from shardstream.storage.parts import Tell
from shardstream.storage.ranged import SingleReads
from shardstream.types import ByteRange

__all__ = [
    "AHEAD_THREADS",
    "AHEAD_WINDOWS",
    "COALESCE_GAP",
    "INDEX_CACHE_SIZE",
    "REMOTE_COALESCE_GAP",
    "IndexCache",
    "WHOLE_SHARD_SLACK",
    "Read",
    "WindowReader",
    "WindowReads",
    "plan_reads",
    "report_skip",
    "run_table",
]

_log = logging.getLogger("shardstream.dataset")
# NOTE [ Whole shards ]
# A read that starts at a shard's first byte and leaves at most this many of its bytes
# (tar's end-of-archive blocks, padding to a 10 KiB record, a Parquet footer) is a plain
# GET of the whole object rather than a ranged one: the same bytes, give or take the
# trailer, and no server work to cut a range. moto, for one, copies the whole object and
# then slices it for every ranged GET, which costs large shards much of their throughput.
# A run of a window that takes a whole shard (the usual case for large samples) is one.
WHOLE_SHARD_SLACK = 64 * 1024

# NOTE [ Whole shards at once ]
# A window's reads are planned from its shards' sidecars, so on object storage the first
# window would wait for three round trips in a row: the manifest, the sidecars, the shards.
# Where the plan knows a window's runs up front (``Window.known_runs``: ``shuffle=False``,
# or a dataset no larger than a window), the runs that are all of their shard, as the
# manifest counts them, need no sidecar to be read: those shards' GETs (whole objects, as
# NOTE [ Whole shards ] makes such reads) go out with the sidecars' GETs, and each planned
# read in them takes its bytes from its shard's. The window's other runs (a window cut
# inside a shard, as ``shuffle=False`` cuts one at each end) are read once the sidecars
# say where they lie. The sidecars are still read and checked (counts, the shard they
# index) before the window is laid out or anything decoded. The window takes its budget
# (NOTE [ Read budget ]) before any GET, counting a part of a shard as all of it (its
# bytes are not known yet). Only while the whole shards' manifest sizes fit in the
# budget, so a manifest that lies about a shard cannot make the reader allocate more than
# the budget before its sidecar is checked; only where some sidecar is not in the LRU yet
# (else there is no round trip to save); and only while no earlier window holds bytes of
# the budget (the first window of an epoch, or a reader whose consumer caught up): behind
# a window still being fetched the sidecars' round trip is hidden anyway, and a shard GET
# sent early would only take connections from the window needed first.
# tools/bench_wan.py measures cold epochs through a remote wire.

# NOTE [ Checks beside decoding ]
# In a stream (``prefetched``) a window's block checks (NOTE [ Checksummed reads ]) run in
# a thread of the reader's own, read by read in window order, and ``decode`` waits for
# each read's check just before it decodes that read: the first read is decoded while the
# others are checked. Checking them all at the end of the fetch would make a window's
# first read wait for every read's check; where fetching costs nothing (local files
# mapped, a warm cache) that puts a whole window's CRCs between the caller and its
# samples: the epoch's first window, and any window the caller catches up with. Every read
# is still checked before any of its bytes is decoded, a failed check is the same error,
# raised where the window is decoded, and a window's samples come only once all its reads
# are decoded. ``MapDataset``'s batches check inline (no thread kept between batches:
# NOTE [ Batch fetches ] in random_access.py). tools/bench_stream.py --only small measures
# checked against unchecked epochs (docs/benchmarks.md, claim checks-cost).

# On object storage, windows fetched ahead at most, and the threads fetching them (their
# GETs share the worker's read_concurrency; NOTE [ Read budget ] bounds their bytes).
AHEAD_WINDOWS = 8
AHEAD_THREADS = 4


# What a window's fetch gives per read: the read, its bytes, the shard's index, and the
# offsets of check blocks that failed (left for decode to skip with on_error="skip"), or
# the future of the bytes (read again where a cache entry failed: NOTE [ Healing the
# cache ] in heal.py) and those offsets.
Checked = tuple["bytes | memoryview", "tuple[int, ...]"]
Fetched = tuple["Read", "bytes | memoryview", SampleIndex, "tuple[int, ...] | Future[Checked]"]


@dataclass(frozen=True, slots=True)
class WindowReads:
    """A window's reads before any byte is read: the reads, what each asks storage for,
    and the sample indexes of their shards."""

    reads: list[Read]
    items: list[tuple[str, ByteRange | None]]
    indexes: dict[int, SampleIndex]

    @property
    def bytes(self) -> int:
        """What the reads hold (a whole-shard read its trailer too: at most WHOLE_SHARD_SLACK more)."""
        return sum(read.rng.length for read in self.reads)


class WindowReader:
    """Fetches the samples of plan windows from one dataset, for one worker.

    With ``on_error="skip"``, samples a shard format cannot decode come back as ``None``
    (the caller counts and skips them); with ``"raise"`` the ``FormatError`` propagates.
    """

    def __init__(
        self,
        storage: Storage,
        manifest: Manifest,
        *,
        on_error: str = "raise",
        prefetch: int = 1,
        verify_checksums: bool = True,
        local_reads: str = "auto",
        read_budget: int = DEFAULT_READ_BUDGET,
        read_concurrency: int = READ_THREADS,
        indexes: IndexCache | None = None,
        expected: Mapping[str, Expected] | None = None,
        columns: bool = False,
        coalesce_gap: int | None = None,
    ) -> None:
        """``indexes``: the dataset's sidecar LRU, kept across its iterations (NOTE [ Sidecars
        across epochs ]); ``expected``: ``fetch.expectations(manifest)``, made once by the
        dataset (both made here when not given); ``columns``: windows come as
        ``SampleColumns`` where they can (for a decoder), else always as lists;
        ``coalesce_gap``: runs of a shard closer than this share a read (``plan_reads``); by
        default NOTE [ Coalescing gap ]'s, for local files or object storage."""
        self.storage = storage
        self.manifest = manifest
        self.format = get_format(manifest.format)
        self.on_error = on_error
        self.prefetch = prefetch
        self.verify_checksums = verify_checksums
        self.columns = columns
        self.coalesce_gap = coalesce_gap
        self._holes = 0  # samples the format could not decode, replaced by None
        self._indexes = indexes if indexes is not None else IndexCache()
        # sidecars being read, by shard, for the windows fetched at once (NOTE [ One read per sidecar ])
        self._loading: dict[int, Future[SampleIndex]] = {}
        self._loading_lock = threading.Lock()
        self._prefetcher: Prefetcher[Any, tuple[list[Fetched], int]] | None = None
        # a stream's block checks, read by read beside decoding (NOTE [ Checks beside decoding ])
        self._checker: ThreadPoolExecutor | None = None
        self.healer = CacheHealer()  # NOTE [ Healing the cache ] in heal.py
        self.fields = manifest.fields  # every sample has them all: NOTE [ Missing fields ] in fields.py
        # reads are checked against the manifest
        self.bytes = ByteFetcher(
            storage, manifest, threads=read_concurrency, local_reads=local_reads, expected=expected
        )
        # Object storage, cached too: how far ahead windows are fetched (NOTE [ Read budget ]).
        self.budget = ReadBudget(read_budget) if self.bytes.ahead else None  # else one window at a time

    # -- indexes -------------------------------------------------------------------------

    def index(self, shard: int) -> SampleIndex:
        """The sample index of ``shard`` (by position in the manifest), from the LRU."""
        found = self._cached_index(shard)
        if found is not None:
            return found
        info = self.manifest.shards[shard]
        return self._keep_index(shard, self.bytes.read(info.index, None))

    def sidecar(self, shard: int, name: str) -> bytes:
        """The file ``name`` of the dataset folder (a sidecar of ``shard`` beside its index)."""
        return bytes(self.bytes.read(name, None))

    def _cached_index(self, shard: int) -> SampleIndex | None:
        info = self.manifest.shards[shard]
        index = self._indexes.get(info)
        if index is not None and index.checks is not None:  # kept by an earlier iteration's reader
            self.bytes.know_checks(info.path, index.checks.whole_crc)
        return index

    def _keep_index(self, shard: int, data: bytes | memoryview) -> SampleIndex:
        info = self.manifest.shards[shard]
        try:
            index = self._checked_index(info, data)
        except FormatError as error:
            if not self.storage.cached:
                raise
            data = self.healer.read_again(
                self.bytes, info.index, None, error.offset or 0
            )  # NOTE [ Healing the cache ]
            index = self._checked_index(info, data)
        if index.checks is not None:  # what the shard's cache fill is checked against
            self.bytes.know_checks(info.path, index.checks.whole_crc)
        self._indexes.put(info, index)
        return index

    def _checked_index(self, info: ShardInfo, data: bytes | memoryview) -> SampleIndex:
        """The sample index in ``data`` (a sidecar's bytes), checked against ``info``."""
        index = self.format.load_index(bytes(data), name=info.path)
        # Before any window lays out this shard's samples: a manifest that claims more
        # samples than the shard holds must not size anything (see Window.shards).
        if index.num_samples != info.samples:
            raise FormatError(
                f"sample index has {index.num_samples} samples, the manifest says {info.samples}",
                url=self.storage.full_url(info.index),
                shard=info.path,
            )
        other = index.checks.other_shard(info.bytes, info.sha256) if index.checks is not None else None
        if other is not None:
            raise FormatError(other, url=self.storage.full_url(info.index), shard=info.path)
        return index

    def load_indexes(self, shards: Sequence[int], tell: Tell = None) -> dict[int, SampleIndex]:
        """The sample indexes of ``shards``: from the LRU, the missing ones read all at once.

        The window keeps them: a window of more shards than the LRU holds would otherwise
        read its first sidecars again, one by one, while it is planned and decoded.
        """
        # NOTE [ One read per sidecar ]
        # On object storage the first windows of an epoch are fetched at once (AHEAD_THREADS),
        # and each reads the sidecars of its shards that are not in the LRU yet: where two
        # windows share shards, as every window of order="global" shares all of a worker's,
        # both would read them, each sidecar read (and parsed) twice per worker and epoch.
        # So a sidecar being read is a Future that the other windows wait for; a failed read
        # fails them all.
        found: dict[int, SampleIndex | Future[SampleIndex] | None] = {
            shard: self._cached_index(shard) for shard in dict.fromkeys(shards)
        }
        with self._loading_lock:  # NOTE [ One read per sidecar ]
            for shard in [shard for shard, index in found.items() if index is None]:
                found[shard] = self._loading.get(shard) or self._cached_index(shard)
            mine = [shard for shard, index in found.items() if index is None]
            loading = {shard: self._loading.setdefault(shard, Future()) for shard in mine}
        found.update(loading)
        items: list[tuple[str, ByteRange | None]] = [
            (self.manifest.shards[shard].index, None) for shard in mine
        ]
        try:
            for shard, data in zip(mine, self.bytes.read_all(items, self._storage_error, tell), strict=True):
                loading[shard].set_result(self._keep_index(shard, data))
        except BaseException as error:
            for future in loading.values():
                if not future.done():
                    future.set_exception(error)
            raise
        finally:
            with self._loading_lock:
                for shard in mine:
                    del self._loading[shard]
        return {
            shard: got.result() if isinstance(got, Future) else cast(SampleIndex, got)
            for shard, got in found.items()
        }

    # -- one window ----------------------------------------------------------------------

    def fetch(
        self, window: Any, take: Callable[[int], None] | None = None, tell: Tell = None
    ) -> list[Fetched]:
        """The bytes of ``window``, one ranged read per group of close runs of a shard,
        their check blocks checked.

        Only I/O, sidecars and CRCs: it runs in the prefetch thread, where reading and the
        CRC release the GIL, while the caller decodes the previous window
        (:meth:`decode`). The window's sidecars are loaded (and their counts checked)
        before its runs are laid out (``Window.shards``). ``take(bytes)`` is called with
        the bytes its reads will hold before any is asked for, ``tell(bytes)`` as they
        arrive (NOTE [ Read budget ]).
        A mixture's reader takes these steps itself, for all its streams at once.
        """
        whole = self._whole_shards(window)
        if whole:
            return self._fetch_whole(window, whole, take, tell)
        indexes = self.load_indexes(list(window.shards))  # before window.runs lays anything out
        planned = self.plan_fetch(window.runs, indexes)
        if take is not None:
            take(planned.bytes)
        return self.fetch_planned(planned, tell)

    def _whole_shards(self, window: Any) -> list[int]:
        """The shards of ``window`` to GET whole while their sidecars are read (NOTE [ Whole
        shards at once ]), or none."""
        runs = getattr(window, "known_runs", None)  # a MapDataset batch has none
        if self.budget is None or self.budget.held or not runs:
            return []
        shards = [run.shard for run in runs]
        if len(set(shards)) != len(shards) or all(self._cached_index(shard) is not None for shard in shards):
            return []
        infos = self.manifest.shards
        whole = [run.shard for run in runs if not run.start and run.stop == infos[run.shard].samples]
        if not whole or sum(infos[shard].bytes for shard in whole) > self.budget.limit:
            return []
        return whole

    def _fetch_whole(
        self, window: Any, shards: list[int], take: Callable[[int], None] | None, tell: Tell
    ) -> list[Fetched]:
        """:meth:`fetch` of a window that reads all of each of ``shards``: their GETs and
        their sidecars' at once; each read in them then takes its bytes from its shard's,
        and the window's runs of part of a shard are read once the sidecars are in."""
        claimed = sum(self.manifest.shards[run.shard].bytes for run in window.known_runs)
        if take is not None:  # what the reads hold at most: the parts of shards as if whole
            take(claimed)
        paths = [self.manifest.shards[shard].path for shard in shards]
        reads = self.bytes.start([(path, None) for path in paths], self._storage_error, tell)
        others = None
        try:
            indexes = self.load_indexes(list(window.shards), tell)
            planned = self.plan_fetch(window.runs, indexes)
            partial = [read for read in planned.reads if read.shard not in shards]
            # the parts of shards taken as if whole: bytes no read brings (NOTE [ Read budget ])
            unread = sum(self.manifest.shards[shard].bytes for shard in {read.shard for read in partial})
            if tell is not None:
                tell(max(0, unread - sum(read.rng.length for read in partial)))
            rest = [i for i, read in enumerate(planned.reads) if read.shard not in shards]
            others = self.bytes.start([planned.items[i] for i in rest], self._storage_error, tell)
            objects = dict(zip(shards, reads.result(), strict=True))
            own = dict(zip(rest, others.result(), strict=True))  # reads of part of a shard
        except BaseException:
            reads.cancel()
            if others is not None:
                others.cancel()
            raise
        fetched: list[bytes | memoryview] = []
        for i, (read, item) in enumerate(zip(planned.reads, planned.items, strict=True)):
            data = own[i] if i in own else objects[read.shard]
            if (item[1] is None or i not in own) and len(data) < read.rng.end:
                self._too_short(read, len(data))
            if i not in own and item[1] is not None:  # its range of the shard's bytes
                data = memoryview(data)[read.rng.start : read.rng.end]
            fetched.append(data)
        return self._checked(planned, fetched)

    def plan_fetch(self, runs: Sequence[Any], indexes: dict[int, SampleIndex]) -> WindowReads:
        """The reads of ``runs``, whose shards' ``indexes`` are loaded (:meth:`load_indexes`)."""
        gap = self.coalesce_gap
        if gap is None:  # NOTE [ Coalescing gap ]
            gap = COALESCE_GAP if self.bytes.local else REMOTE_COALESCE_GAP
        reads = plan_reads(runs, lambda shard, a, b: self._read_ranges(indexes[shard], a, b), gap=gap)
        return WindowReads(reads, [self._item(read) for read in reads], indexes)

    def fetch_planned(self, planned: WindowReads, tell: Tell = None) -> list[Fetched]:
        """The bytes of :meth:`plan_fetch`'s reads, checked; ``tell(bytes)`` as they arrive."""
        fetched = self.bytes.read_all(planned.items, self._storage_error, tell)
        for read, item, data in zip(planned.reads, planned.items, fetched, strict=True):
            if item[1] is None and len(data) < read.rng.end:
                self._too_short(read, len(data))
        return self._checked(planned, fetched)

    def _checked(self, planned: WindowReads, fetched: list[bytes | memoryview]) -> list[Fetched]:
        """Each read with its bytes, its shard's index and its failed check blocks (in a
        stream, a future of them: NOTE [ Checks beside decoding ])."""
        reads, indexes = planned.reads, planned.indexes
        checker = self._checker if len(reads) > 1 else None
        out: list[Fetched] = []
        for read, data in zip(reads, fetched, strict=True):
            index = indexes[read.shard]
            if checker is None:
                data, bad = self.check(read, data, index)
                out.append((read, data, index, bad))
            else:
                out.append((read, data, index, checker.submit(self.check, read, data, index)))
        return out

    def _read_range(self, index: SampleIndex, start: int, stop: int) -> ByteRange:
        return index.read_range(start, stop) if self.verify_checksums else index.byte_range(start, stop)

    def _read_ranges(
        self, index: SampleIndex, starts: np.ndarray, stops: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        return index.read_ranges(starts, stops) if self.verify_checksums else index.byte_ranges(starts, stops)

    def check(self, read: Read, data: bytes | memoryview, index: SampleIndex) -> Checked:
        """The read's bytes and the offsets of its check blocks whose CRC fails; bytes from
        the cache that fail are read again, once (NOTE [ Healing the cache ] in heal.py).
        With ``on_error="raise"`` a block still failing is a ``FormatError`` here, before
        anything is decoded."""
        bad = self._failed_blocks(read, data, index)
        if bad and self.storage.cached:
            path = self.manifest.shards[read.shard].path
            data = self.healer.read_again(self.bytes, path, read.rng, bad[0])
            bad = self._failed_blocks(read, data, index)
        if bad and self.on_error != "skip":
            checks = cast(ShardChecks, index.checks)
            path = self.manifest.shards[read.shard].path
            raise FormatError(
                f"checksum mismatch in bytes [{bad[0]}, {min(bad[0] + checks.block, checks.size)}): the "
                "shard's bytes differ from those it was indexed with (corrupt, or rewritten)",
                url=self.storage.full_url(path),
                shard=path,
                offset=bad[0],
            )
        return data, tuple(bad)

    def _failed_blocks(self, read: Read, data: bytes | memoryview, index: SampleIndex) -> list[int]:
        """Offsets of the read's check blocks whose CRC fails."""
        checks = index.checks
        if checks is None or not self.verify_checksums or not read.rng.length:
            return []
        if read.spans:  # only the blocks its runs take (runs.Read)
            view, start = memoryview(data), read.rng.start
            bad = [
                offset
                for lo, hi in read.spans
                for offset in checks.bad_blocks(view[lo - start : hi - start], ByteRange(lo, hi))
            ]
        else:
            bad = checks.bad_blocks(data, read.rng)
        return bad

    def _item(self, read: Read) -> tuple[str, ByteRange | None]:
        """What to read for ``read``: the whole object where the read covers all of a shard
        on object storage but its trailer (see NOTE [ Whole shards ])."""
        info = self.manifest.shards[read.shard]
        if not self.bytes.local and read.rng.start == 0 and info.bytes - read.rng.end <= WHOLE_SHARD_SLACK:
            return info.path, None
        return info.path, read.rng

    def single_reads(self, open_files: int) -> SingleReads:
        """Reads of single samples for :meth:`read_bytes`, from up to ``open_files`` local
        files kept open where local files are read by copy; ``close`` them when done."""
        return self.bytes.single_reads(open_files)

    def read_bytes(self, shard: int, rng: ByteRange, reads: SingleReads) -> bytes | memoryview:
        """Bytes ``rng`` of ``shard`` by ``reads`` (:meth:`single_reads`), as a window's read
        would ask for them (all of the shard, cut, where NOTE [ Whole shards ] says so);
        a ``StorageError`` names the shard and the bytes, as a window's reads do."""
        read = Read(shard, rng, (0,))
        path, asked = self._item(read)
        info = self.manifest.shards[shard]
        data = reads.read(
            path, rng, self.bytes.expected(info.path), self._storage_error, whole_object=asked is None
        )
        if len(data) != rng.length:
            self._too_short(read, rng.start + len(data))
        return data

    def read_again(self, path: str, rng: ByteRange | None, offset: int) -> bytes | memoryview | None:
        """``path``'s bytes ``rng`` read again where the storage is a cache whose entry
        failed a check at ``offset`` (NOTE [ Healing the cache ] in heal.py), else None."""
        if not self.storage.cached:
            return None
        return self.healer.read_again(self.bytes, path, rng, offset)

    def _too_short(self, read: Read, got: int) -> None:
        path = self.manifest.shards[read.shard].path
        raise StorageError(
            f"bytes [{read.rng.start}, {read.rng.end}) are past the end of the object ({got} bytes)",
            url=self.storage.full_url(path),
            shard=path,
            offset=read.rng.start,
        )

    def decode(
        self, window: Any, fetched: list[Fetched], order: np.ndarray | None = None
    ) -> tuple[SampleColumns | list[Sample | None], bool]:
        """The samples of ``window``'s runs from :meth:`fetch`'s bytes, and whether any is
        ``None`` (skipped as corrupt). They come in ``order`` (positions in the
        concatenation of the runs' samples, as ``Window.order`` gives the yield order), or
        in run order; as ``SampleColumns`` where the reader keeps ``columns`` and every read
        decoded to columns of the same fields, else as a list. Each read's runs are decoded
        in one format call and its bytes let go as soon as they are; everything else is
        array work, none of it per run (NOTE [ One call per read ])."""
        table, holes = run_table(window.runs), self._holes
        fetched.reverse()
        parts: list[SampleColumns | list[Sample | None]] = []
        numbers: list[tuple[int, ...]] = []
        while fetched:
            read, data, index, bad = fetched.pop()
            if isinstance(bad, Future):
                data, bad = bad.result()  # its check is done before its bytes are decoded
            mine = table[list(read.runs)]
            part = with_all_fields(
                self._decode_read(read, data, index, bad, mine[:, 1], mine[:, 2]), self.fields
            )
            # samples built while their values are in the CPU cache, unless a decoder takes columns
            parts.append(
                cast(list[Sample | None], part.samples())
                if not self.columns and isinstance(part, SampleColumns)
                else part
            )
            numbers.append(read.runs)
            del data
        moved = taken_from_reads(table, numbers, order)
        if all(isinstance(part, SampleColumns) for part in parts):
            columns = SampleColumns.joined(cast(list[SampleColumns], parts))
            if columns is not None:
                return (columns if moved is None else columns.take(moved)), self._holes != holes
        samples = list(chain.from_iterable(p.samples() if isinstance(p, SampleColumns) else p for p in parts))
        return (samples if moved is None else list(map(samples.__getitem__, moved))), self._holes != holes

    def _decode_read(
        self,
        read: Read,
        data: bytes | memoryview,
        index: SampleIndex,
        bad: tuple[int, ...],
        starts: np.ndarray,
        stops: np.ndarray,
    ) -> SampleColumns | list[Sample | None]:
        """The samples of ``read``'s runs (``starts``, ``stops``) in one format call; run by
        run, as ever, where a check block failed or that call raised (NOTE [ One call per read ])."""
        name = self.manifest.shards[read.shard].path
        if not bad:
            try:
                got = self.format.decode_runs(data, read.rng, index, starts, stops, name=name)
            except FormatError:
                got = None
            if got is not None and len(got) == int((stops - starts).sum()):
                return cast("SampleColumns | list[Sample | None]", got)
        out: list[Sample | None] = []
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
            if bad:  # on_error="skip": the samples of failed blocks are left out (bad implies checks)
                block = cast(ShardChecks, index.checks).block
                out += self._read_one_by_one(data, read.rng, index, start, stop, name, (bad, block))
            else:
                out += self.decode_span(data, read.rng, index, start, stop, name)
        return out

    def _storage_error(self, error: StorageError, item: tuple[str, ByteRange | None]) -> StorageError:
        path, rng = item
        where = f" (bytes [{rng.start}, {rng.end}))" if rng is not None else ""
        shard = next((s.path for s in self.manifest.shards if path in (s.path, s.index)), path)
        return type(error)(
            f"{error.message}{where}",
            url=error.url or self.storage.full_url(path),
            shard=shard,
            offset=rng.start if rng is not None else error.offset,
        )

    def decode_span(
        self, data: bytes | memoryview, rng: ByteRange, index: SampleIndex, start: int, stop: int, name: str
    ) -> list[Sample | None]:
        """Samples ``[start, stop)`` of shard ``name`` from ``data`` (the bytes of ``rng``);
        with ``on_error="skip"`` one by one, ``None`` for each that fails."""
        try:
            samples: list[Sample | None] = list(self.format.decode(data, rng, index, start, stop, name=name))
        except FormatError as error:
            if self.on_error != "skip":
                raise self._named(error, name, rng) from error
            return self._read_one_by_one(data, rng, index, start, stop, name)
        if len(samples) != stop - start:
            wrong = FormatError(f"decoded {len(samples)} samples, expected {stop - start}", offset=rng.start)
            raise self._named(wrong, name, rng)
        return samples

    def _read_one_by_one(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        start: int,
        stop: int,
        name: str,
        bad: tuple[tuple[int, ...], int] = ((), BLOCK),
    ) -> list[Sample | None]:
        """``on_error="skip"``: decode sample by sample, ``None`` for each that fails or
        has bytes in a check block of ``bad`` (its offsets, the block size)."""
        view = memoryview(data)
        out: list[Sample | None] = []
        for i in range(start, stop):
            one = index.byte_range(i, i + 1)
            try:
                _check_blocks(one, *bad)
                part = view[one.start - rng.start : one.end - rng.start]
                out.extend(self.format.decode(part, one, index, i, i + 1, name=name))
            except FormatError as error:
                out.append(None)
                self._holes += 1
                report_skip(self._named(error, name, one))
        return out

    def _named(self, error: FormatError, shard: str, rng: ByteRange) -> FormatError:
        return FormatError(
            error.message,
            url=error.url or self.storage.full_url(shard),
            shard=error.shard or shard,
            offset=error.offset if error.offset is not None else rng.start,
        )

    def locate(self, error: FormatError, window: Any, position: int) -> FormatError:
        """``error`` about the sample at ``position`` of ``window``'s concatenated runs,
        naming its URL, shard, byte offset and key."""
        for run in window.runs:
            shard, start, stop = run.shard, run.start, run.stop
            if position < stop - start:
                info = self.manifest.shards[shard]
                index = self.index(shard)
                i = start + position
                key = index.keys[i]
                message = error.message if key in error.message else f"{error.message} [sample {key!r}]"
                return type(error)(
                    message,
                    url=self.storage.full_url(info.path),
                    shard=info.path,
                    offset=index.byte_range(i, i + 1).start,
                )
            position -= stop - start
        return error

    # -- the stream of windows -----------------------------------------------------------

    def check_beside_decoding(self) -> None:
        """From now on check reads in a thread of this reader's own (NOTE [ Checks beside
        decoding ]; until ``close``)."""
        if self.verify_checksums and self._checker is None:
            self._checker = ThreadPoolExecutor(1, thread_name_prefix="shardstream-check")

    def stream(
        self, windows: Iterator[Any]
    ) -> Iterator[tuple[Any, SampleColumns | list[Sample | None], bool]]:
        """``(window, samples, holes)`` for each window, its samples in yield order (see
        :meth:`decode`); the bytes of the next ``prefetch`` windows are read in a background
        thread meanwhile (on object storage as many as NOTE [ Read budget ] allows, in
        ``AHEAD_THREADS``)."""
        return prefetched(self, windows)

    def _in_yield_order(
        self, window: Any, fetched: list[Fetched]
    ) -> tuple[SampleColumns | list[Sample | None], bool]:
        return self.decode(window, fetched, window.order)

    def close(self) -> None:
        if self.budget is not None:
            self.budget.close()  # fetches waiting for room give up, so the threads join
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            prefetcher.close()  # its fetches are done: none submits a check any more
        checker, self._checker = self._checker, None
        if checker is not None and not sys.is_finalizing():  # at exit its thread is joined already
            checker.shutdown(wait=False, cancel_futures=True)
        self.bytes.close()


def prefetched(reader: Any, windows: Iterator[Any]) -> Iterator[Any]:
    """``reader.stream(windows)`` for a ``WindowReader`` or a ``MixtureReader``: each window
    fetched (``reader.fetch``) ahead in background threads within ``reader.budget``, then
    put in yield order (``reader._in_yield_order``); the reader is closed at the end."""
    if reader.prefetch < 1:
        for window in windows:
            yield (window, *reader._in_yield_order(window, reader.fetch(window)))
        return
    reader.check_beside_decoding()
    budget = reader.budget
    ahead = reader.prefetch if budget is None else max(reader.prefetch, AHEAD_WINDOWS)
    prefetcher: Prefetcher[Any, tuple[Any, int]] = Prefetcher(
        lambda job: fetch_in_turn(reader.fetch, budget, *job),
        threads=1 if budget is None else AHEAD_THREADS,
        max_pending=ahead,
    )
    reader._prefetcher = prefetcher
    if budget is not None and isinstance(reader, WindowReader):  # NOTE [ Unshuffled windows in pieces ]
        windows = in_pieces(windows, reader.manifest.shards, budget.limit)
    try:
        yield from fetched_in_order(windows, prefetcher, ahead, budget, reader._in_yield_order)
    finally:
        reader.close()


def _check_blocks(rng: ByteRange, bad: tuple[int, ...], block: int) -> None:
    for offset in bad:
        if offset < rng.end and rng.start < offset + block:
            raise FormatError(f"checksum mismatch in bytes [{offset}, {offset + block})", offset=offset)


_SKIPPED: collections.Counter[str] = collections.Counter()  # per shard URL, in this process


def report_skip(error: FormatError) -> None:
    """Count a sample skipped with ``on_error="skip"``; log the first of each shard."""
    shard = error.url or error.shard or ""
    _SKIPPED[shard] += 1
    if _SKIPPED[shard] == 1:
        _log.warning("skipping corrupt samples (on_error='skip'); the first in this shard: %s", error)
