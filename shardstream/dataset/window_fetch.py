"""A window's bytes: its sidecars, its reads planned, coalesced and read, then checked.

The reads of a window's runs are planned from their shards' sample indexes
(``plan_reads``: close runs of a shard share a read, grown to whole check blocks), read
at once (``ByteFetcher``) and checked (``ReadChecks``). A window that takes whole shards
sends their GETs beside its sidecars' (NOTE [ Whole shards at once ]).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from shardstream.dataset.budget import ReadBudget
from shardstream.dataset.fetch import ByteFetcher
from shardstream.dataset.read_checks import Fetched, ReadChecks, WindowReads
from shardstream.dataset.runs import COALESCE_GAP, REMOTE_COALESCE_GAP, Read, plan_reads
from shardstream.dataset.sidecars import Sidecars
from shardstream.errors import StorageError
from shardstream.formats.base import SampleIndex
from shardstream.manifest import Manifest, ShardInfo
from shardstream.storage import Storage
from shardstream.storage.parts import Tell
from shardstream.storage.ranged import SingleReads
from shardstream.types import ByteRange

__all__ = ["WHOLE_SHARD_SLACK", "WindowFetcher"]

# NOTE [ Whole shards ]
# A read that starts at a shard's first byte and leaves at most this many of its bytes
# (tar's end-of-archive blocks, padding to a 10 KiB record, a Parquet footer) is a plain
# GET of the whole object rather than a ranged one: the same bytes, give or take the
# trailer, and no server work to cut a range. moto, for one, copies the whole object and
# then slices it for every ranged GET, which costs large shards much of their throughput.
# A run of a window that takes a whole shard (the usual case for large samples) is one.
WHOLE_SHARD_SLACK = 64 * 1024

# NOTE [ Checks as reads land ]
# Where a window's reads run one after another (local files: no pool), each read's check
# (NOTE [ Checks beside decoding ] in read_checks.py) is handed to the checker's thread as
# soon as its bytes are in, not once the last read is: a copy of a read and the CRC of the
# one before run at once, and the window's last check ends about when its last read does.
# Where the reads run at once in a pool (object storage), they land together anyway.

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


class WindowFetcher:
    """Fetches the bytes of plan windows of one dataset (``manifest`` on ``storage``):
    sidecars by ``sidecars``, reads by ``fetcher``, checked by ``checks``; ``budget``
    (None: one window at a time) says whether whole shards may go out early."""

    def __init__(
        self,
        storage: Storage,
        manifest: Manifest,
        fetcher: ByteFetcher,
        sidecars: Sidecars,
        checks: ReadChecks,
        budget: ReadBudget | None,
        *,
        verify_checksums: bool,
        coalesce_gap: int | None,
    ) -> None:
        self.storage, self.manifest, self.bytes = storage, manifest, fetcher
        self.sidecars, self.checks, self.budget = sidecars, checks, budget
        self.verify_checksums, self.coalesce_gap = verify_checksums, coalesce_gap

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
        indexes = self.sidecars.load(list(window.shards))  # before window.runs lays anything out
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
        if len(set(shards)) != len(shards) or all(
            self.sidecars.cached(shard) is not None for shard in shards
        ):
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
        reads = self.bytes.start([(path, None) for path in paths], self.storage_error, tell)
        others = None
        try:
            indexes = self.sidecars.load(list(window.shards), tell)
            planned = self.plan_fetch(window.runs, indexes)
            partial = [read for read in planned.reads if read.shard not in shards]
            # the parts of shards taken as if whole: bytes no read brings (NOTE [ Read budget ])
            unread = sum(self.manifest.shards[shard].bytes for shard in {read.shard for read in partial})
            if tell is not None:
                tell(max(0, unread - sum(read.rng.length for read in partial)))
            rest = [i for i, read in enumerate(planned.reads) if read.shard not in shards]
            others = self.bytes.start([planned.items[i] for i in rest], self.storage_error, tell)
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
                self.too_short(read, len(data))
            if i not in own and item[1] is not None:  # its range of the shard's bytes
                data = memoryview(data)[read.rng.start : read.rng.end]
            fetched.append(data)
        return self.checks.checked(planned, fetched)

    def plan_fetch(self, runs: Sequence[Any], indexes: dict[int, SampleIndex]) -> WindowReads:
        """The reads of ``runs``, whose shards' ``indexes`` are loaded (:meth:`load_indexes`)."""
        gap = self.coalesce_gap
        if gap is None:  # NOTE [ Coalescing gap ]
            gap = COALESCE_GAP if self.bytes.local else REMOTE_COALESCE_GAP
        reads = plan_reads(runs, lambda shard, a, b: self._read_ranges(indexes[shard], a, b), gap=gap)
        return WindowReads(reads, [self.item(read) for read in reads], indexes)

    def fetch_planned(self, planned: WindowReads, tell: Tell = None) -> list[Fetched]:
        """The bytes of :meth:`plan_fetch`'s reads, checked; ``tell(bytes)`` as they arrive.
        Where reads run one after another (local files), each is read as the one before is
        handed to its check (NOTE [ Checks as reads land ]); else all at once in the pool."""
        items, alone = planned.items, len(planned.reads) < 2
        if self.bytes.ahead:
            fetched: Iterable[bytes | memoryview] = self.bytes.read_all(items, self.storage_error, tell)
        else:
            fetched = (self.bytes.read_all([item], self.storage_error, tell)[0] for item in items)
        out = []
        for read, item, data in zip(planned.reads, items, fetched, strict=True):
            if item[1] is None and len(data) < read.rng.end:
                self.too_short(read, len(data))
            out.append(self.checks.later(read, data, planned.indexes[read.shard], alone=alone))
        return out

    def _read_ranges(
        self, index: SampleIndex, starts: np.ndarray, stops: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        return index.read_ranges(starts, stops) if self.verify_checksums else index.byte_ranges(starts, stops)

    def item(self, read: Read) -> tuple[str, ByteRange | None]:
        """What to read for ``read``: the whole object where the read covers all of a shard
        on object storage but its trailer (see NOTE [ Whole shards ])."""
        info = self.manifest.shards[read.shard]
        return info.path, None if self._whole(info, read.rng) else read.rng

    def _whole(self, info: ShardInfo, rng: ByteRange) -> bool:
        """Whether ``rng`` of a shard is read as all of it (NOTE [ Whole shards ])."""
        return not self.bytes.local and rng.start == 0 and info.bytes - rng.end <= WHOLE_SHARD_SLACK

    def single_reads(self, open_files: int) -> SingleReads:
        """Reads of single samples for :meth:`read_bytes`, from up to ``open_files`` local
        files kept open where local files are read by copy; ``close`` them when done."""
        return self.bytes.single_reads(open_files)

    def read_bytes(self, shard: int, rng: ByteRange, reads: SingleReads) -> bytes | memoryview:
        """Bytes ``rng`` of ``shard`` by ``reads`` (:meth:`single_reads`), as a window's read
        would ask for them (all of the shard, cut, where NOTE [ Whole shards ] says so);
        a ``StorageError`` names the shard and the bytes, as a window's reads do."""
        info = self.manifest.shards[shard]  # no Read made: this runs once per sample of a MapDataset
        data = reads.read(
            info.path,
            rng,
            self.bytes.expected(info.path),
            self.storage_error,
            whole_object=self._whole(info, rng),
        )
        if len(data) != rng.length:
            self.too_short(Read(shard, rng, (0,)), rng.start + len(data))
        return data

    def too_short(self, read: Read, got: int) -> None:
        path = self.manifest.shards[read.shard].path
        raise StorageError(
            f"bytes [{read.rng.start}, {read.rng.end}) are past the end of the object ({got} bytes)",
            url=self.storage.full_url(path),
            shard=path,
            offset=read.rng.start,
        )

    def storage_error(self, error: StorageError, item: tuple[str, ByteRange | None]) -> StorageError:
        path, rng = item
        where = f" (bytes [{rng.start}, {rng.end}))" if rng is not None else ""
        shard = next((s.path for s in self.manifest.shards if path in (s.path, s.index)), path)
        return type(error)(
            f"{error.message}{where}",
            url=error.url or self.storage.full_url(path),
            shard=shard,
            offset=rng.start if rng is not None else error.offset,
        )
