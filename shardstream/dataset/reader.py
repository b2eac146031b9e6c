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

``WindowReader`` puts together one piece per job: ``Sidecars`` (sidecars.py),
``WindowFetcher`` (window_fetch.py: read planning and whole-shard GETs), ``ReadChecks``
(read_checks.py), ``WindowDecoder`` (window_decode.py) and ``prefetched`` (ahead.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardstream.dataset.ahead import AHEAD_THREADS, AHEAD_WINDOWS, prefetched
from shardstream.dataset.budget import ReadBudget, default_read_budget, in_pieces, piece_limit
from shardstream.dataset.fetch import READ_THREADS, ByteFetcher
from shardstream.dataset.heal import CacheHealer
from shardstream.dataset.indexes import INDEX_CACHE_SIZE, IndexCache
from shardstream.dataset.read_checks import Checked, Fetched, ReadChecks, WindowReads
from shardstream.dataset.runs import COALESCE_GAP, REMOTE_COALESCE_GAP, Read, plan_reads, run_table
from shardstream.dataset.sidecars import Sidecars
from shardstream.dataset.window_decode import WindowDecoder, report_skip
from shardstream.dataset.window_fetch import WHOLE_SHARD_SLACK, WindowFetcher
from shardstream.errors import FormatError, StorageError
from shardstream.formats import get_format
from shardstream.formats.base import Sample, SampleColumns, SampleIndex
from shardstream.manifest import Manifest
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
    "WHOLE_SHARD_SLACK",
    "Checked",
    "Fetched",
    "IndexCache",
    "Read",
    "WindowReader",
    "WindowReads",
    "plan_reads",
    "prefetched",
    "report_skip",
    "run_table",
]

Samples = SampleColumns | list[Sample | None]


# NOTE [ Local copies in pieces ]
# A local folder read by copy has no read budget (its reads cost no request, so windows
# are fetched one ahead, in one thread), but its unshuffled windows are still taken in
# pieces of a quarter of ``read_budget`` (NOTE [ Unshuffled windows in pieces ] in
# budget.py): a window is whole before its first sample, so its copy (a default window
# holds four shards) was a wait at every epoch's start, and one window copied ahead of
# the one decoded held two windows' bytes. In pieces, the first samples come after one
# piece's copy, the next piece is copied while this one is decoded, and every read of a
# piece's size goes into a read buffer taken again (NOTE [ Local reads into buffers ] in
# storage/ranged.py). A mapped folder's windows stay whole: mapping them costs no copy.


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
        read_budget: int | None = None,
        read_concurrency: int = READ_THREADS,
        indexes: IndexCache | None = None,
        expected: Mapping[str, Expected] | None = None,
        columns: bool = False,
        coalesce_gap: int | None = None,
        typed_values: Mapping[str, str] | None = None,
    ) -> None:
        """``indexes``: the dataset's sidecar LRU, kept across its iterations (NOTE [ Sidecars
        across epochs ]); ``expected``: ``fetch.expectations(manifest)``, made once by the
        dataset (both made here when not given); ``columns``: windows come as
        ``SampleColumns`` where they can (for a decoder), else always as lists;
        ``coalesce_gap``: runs of a shard closer than this share a read (``plan_reads``); by
        default NOTE [ Coalescing gap ]'s, for local files or object storage; ``read_budget``
        None: ``default_read_budget``'s for the storage (NOTE [ Read budget ])."""
        self.storage = storage
        self.manifest = manifest
        self.format = get_format(manifest.format)
        self.on_error = on_error
        self.prefetch = prefetch
        self.verify_checksums = verify_checksums
        self.columns = columns
        self.coalesce_gap = coalesce_gap
        self.fields = manifest.fields  # every sample has them all: NOTE [ Missing fields ] in fields.py
        # reads are checked against the manifest
        self.bytes = ByteFetcher(
            storage, manifest, threads=read_concurrency, local_reads=local_reads, expected=expected
        )
        self.healer = CacheHealer(self.bytes)  # NOTE [ Healing the cache ] in heal.py
        # Object storage, cached too: how far ahead windows are fetched (NOTE [ Read budget ]).
        if read_budget is None:
            read_budget = default_read_budget(storage.latency())
        self.budget = ReadBudget(read_budget) if self.bytes.ahead else None  # else one window at a time
        self.read_budget = read_budget  # a local copy's pieces (NOTE [ Local copies in pieces ])
        self._prefetcher: Prefetcher[Any, Any] | None = None
        url_of = storage.full_url
        # a window's reads are checked and decoded through this reader's ``check`` and
        # ``_decode_read``, so that what wraps them (a test's spy) sees every read
        self.checks = ReadChecks(
            manifest,
            url_of,
            self.healer.read_again,
            verify=verify_checksums,
            on_error=on_error,
            check=lambda read, data, index: self.check(read, data, index),
        )
        self.sidecars = Sidecars(
            manifest,
            self.format,
            self.bytes,
            indexes if indexes is not None else IndexCache(),
            read_again=self.healer.read_again,
            named=self._storage_error,
        )
        self.fetcher = WindowFetcher(
            storage,
            manifest,
            self.bytes,
            self.sidecars,
            self.checks,
            self.budget,
            verify_checksums=verify_checksums,
            coalesce_gap=coalesce_gap,
        )
        self.decoder = WindowDecoder(
            manifest,
            self.format,
            index=self.index,
            url_of=url_of,
            on_error=on_error,
            columns=columns,
            decode_read=lambda *read: self._decode_read(*read),
            typed_values=typed_values,  # NOTE [ Typed values passed through ] in decode.py
        )

    # -- sidecars ------------------------------------------------------------------------

    def index(self, shard: int) -> SampleIndex:
        """The sample index of ``shard`` (by position in the manifest), from the LRU."""
        return self.sidecars.index(shard)

    def sidecar(self, shard: int, name: str) -> bytes:
        """The file ``name`` of the dataset folder (a sidecar of ``shard`` beside its index)."""
        return self.sidecars.sidecar(name)

    def load_indexes(self, shards: Sequence[int], tell: Tell = None) -> dict[int, SampleIndex]:
        """The sample indexes of ``shards``: from the LRU, the missing ones read all at once.

        The window keeps them: a window of more shards than the LRU holds would otherwise
        read its first sidecars again, one by one, while it is planned and decoded.
        """
        return self.sidecars.load(shards, tell)

    # -- one window ----------------------------------------------------------------------

    def fetch(
        self, window: Any, take: Callable[[int], None] | None = None, tell: Tell = None
    ) -> list[Fetched]:
        """The bytes of ``window`` (``WindowFetcher.fetch``: one ranged read per group of
        close runs of a shard, their check blocks checked)."""
        return self.fetcher.fetch(window, take, tell)

    def plan_fetch(self, runs: Sequence[Any], indexes: dict[int, SampleIndex]) -> WindowReads:
        """The reads of ``runs``, whose shards' ``indexes`` are loaded (:meth:`load_indexes`)."""
        return self.fetcher.plan_fetch(runs, indexes)

    def fetch_planned(self, planned: WindowReads, tell: Tell = None) -> list[Fetched]:
        """The bytes of :meth:`plan_fetch`'s reads, checked; ``tell(bytes)`` as they arrive."""
        return self.fetcher.fetch_planned(planned, tell)

    def check(self, read: Read, data: bytes | memoryview, index: SampleIndex) -> Checked:
        """The read's bytes and the offsets of its check blocks whose CRC fails
        (``ReadChecks.check``: with ``on_error="raise"`` a failed block raises)."""
        return self.checks.check(read, data, index)

    def decode(
        self, window: Any, fetched: list[Fetched], order: np.ndarray | None = None
    ) -> tuple[Samples, bool]:
        """The samples of ``window``'s runs from :meth:`fetch`'s bytes, and whether any is
        ``None`` (``WindowDecoder.decode``), in ``order`` or in run order."""
        return self.decoder.decode(window, fetched, order)

    def _decode_read(self, *read: Any) -> Samples:
        return self.decoder.decode_read(*read)

    def locate(self, error: FormatError, window: Any, position: int) -> FormatError:
        """``error`` about the sample at ``position`` of ``window``'s concatenated runs,
        naming its URL, shard, byte offset and key."""
        return self.decoder.locate(error, window, position)

    # -- single samples ------------------------------------------------------------------

    def single_reads(self, open_files: int) -> SingleReads:
        """Reads of single samples for :meth:`read_bytes`, from up to ``open_files`` local
        files kept open where local files are read by copy; ``close`` them when done."""
        return self.fetcher.single_reads(open_files)

    def read_bytes(self, shard: int, rng: ByteRange, reads: SingleReads) -> bytes | memoryview:
        """Bytes ``rng`` of ``shard`` by ``reads`` (:meth:`single_reads`), named as a
        window's reads are on error."""
        return self.fetcher.read_bytes(shard, rng, reads)

    def read_again(self, path: str, rng: ByteRange | None, offset: int) -> bytes | memoryview | None:
        """``path``'s bytes ``rng`` read again where the storage is a cache whose entry
        failed a check at ``offset`` (NOTE [ Healing the cache ] in heal.py), else None."""
        return self.healer.read_again(path, rng, offset)

    def decode_span(
        self, data: bytes | memoryview, rng: ByteRange, index: SampleIndex, start: int, stop: int, name: str
    ) -> list[Sample | None]:
        """Samples ``[start, stop)`` of shard ``name`` from ``data`` (the bytes of ``rng``)."""
        return self.decoder.decode_span(data, rng, index, start, stop, name)

    def _storage_error(self, error: StorageError, item: tuple[str, ByteRange | None]) -> StorageError:
        return self.fetcher.storage_error(error, item)

    # -- the stream of windows -----------------------------------------------------------

    def stream(self, windows: Iterator[Any]) -> Iterator[tuple[Any, Samples, bool]]:
        """``(window, samples, holes)`` for each window, its samples in yield order (see
        :meth:`decode`); the bytes of the next ``prefetch`` windows are read in a background
        thread meanwhile (on object storage as many as NOTE [ Read budget ] allows, in
        ``AHEAD_THREADS``)."""
        return prefetched(self, windows)

    def in_yield_order(self, window: Any, fetched: list[Fetched]) -> tuple[Samples, bool]:
        return self.decode(window, fetched, window.order)

    def in_pieces(self, windows: Iterator[Any]) -> Iterator[Any]:
        """``windows``, those in run order larger than a piece of the budget in pieces (NOTE
        [ Unshuffled windows in pieces ] in budget.py): on object storage, and from a local
        folder read by copy (NOTE [ Local copies in pieces ]); a mapped folder's as they are."""
        if self.budget is not None:
            limit = piece_limit(self.budget.limit, cached=self.storage.cached)
        elif self.bytes.local and not self.bytes.mapped:
            limit = piece_limit(self.read_budget)
        else:
            return windows
        return in_pieces(windows, self.manifest.shards, limit, head=self.short_head)

    @property
    def short_head(self) -> bool:
        """Whether an iteration's first piece begins with a short one (NOTE [ Unshuffled
        windows in pieces ] in budget.py): on object storage, not through a cache (whose
        first read fills a shard's whole entry)."""
        return not self.storage.local_files and not self.storage.cached

    def check_beside_decoding(self) -> None:
        """From now on check reads in a thread of this reader's own (NOTE [ Checks beside
        decoding ]; until ``close``)."""
        self.checks.beside_decoding()

    def hold(self, prefetcher: Prefetcher[Any, Any]) -> None:
        """Keep the stream's ``prefetcher``, closed with the reader."""
        self._prefetcher = prefetcher

    def close(self) -> None:
        if self.budget is not None:
            self.budget.close()  # fetches waiting for room give up, so the threads join
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            prefetcher.close()  # its fetches are done: none submits a check any more
        self.checks.close()
        self.bytes.close()
