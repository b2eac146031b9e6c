"""``MapDataset``: a map-style torch ``Dataset`` over a shardstream dataset folder.

``dataset[i]`` is sample ``i`` of the dataset in manifest order (the order a
``StreamingDataset(url, shuffle=False)`` epoch yields, and the global index a
``ShardSampler`` over the manifest's shard sizes gives): the shard holding ``i`` is found
by bisecting the prefix sums of the shards' sample counts, the sample's byte range by
its shard's sample index (sidecar, kept in the reader's LRU), and the bytes come with
one ranged read, CRC-checked as a streamed read is (NOTE [ Checksummed reads ]; NOTE
[ Checked single reads ] for how little one sample reads). See NOTE [ Batch fetches ]
for many indices at once.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from torch.utils.data import Dataset

from shardstream.counts import check_int
from shardstream.dataset.batch_reads import BatchReads
from shardstream.dataset.bulk import decode_samples
from shardstream.dataset.config import DatasetConfig
from shardstream.dataset.indexes import INDEX_CACHE_SIZE, IndexCache
from shardstream.dataset.keys import KeyFinder
from shardstream.dataset.options import PLAN_OPTIONS, TOKEN_OPTIONS
from shardstream.dataset.reader import COALESCE_GAP, WindowReader
from shardstream.dataset.sample_reads import SampleReads
from shardstream.dataset.source import DatasetSource
from shardstream.dataset.startup import share_detected
from shardstream.errors import FormatError, ShardstreamError
from shardstream.manifest import Manifest
from shardstream.plan import Run
from shardstream.sampler import ShardSampler
from shardstream.storage import Storage
from shardstream.topology import Detector

__all__ = ["BATCH_GAP", "BATCH_READ_THREADS", "SIDECAR_BYTES", "MapDataset"]

# NOTE [ Batch fetches ]
# ``get_many(indices)`` (what torch's DataLoader calls, as ``__getitems__``, with a
# batch's indices) reads each distinct sample once: the indices are sorted, consecutive
# samples of a shard become one run, and runs of a shard share one ranged read where their
# bytes lie within a gap of each other: ``BATCH_GAP`` on object storage,
# NOTE [ Coalescing gap ]'s ``COALESCE_GAP`` (runs.py) on local files and the cache. A batch
# of random indices is a few samples per shard, scattered, and on object storage a request
# costs more than megabytes of its bytes (a ranged GET costs about what a small whole one
# does, and S3 gives a connection its full rate only after tens of ms to the first byte),
# so the batch reads each shard it touches once, holes and all (a small shard whole),
# instead of once per stretch of samples: its floor is one ranged GET per touched shard,
# from its first wanted byte to its last, all at once. Only the check blocks of the
# samples are checked and decoded (runs.Read.spans), not those of the holes. The reads are
# sent at once, in a pool that grows to the batch's reads (``read_threads`` at most) and
# whose threads wait a while for the next batch, then end (NOTE [ Threads that linger ] in
# storage/idle_pool.py): a dataset held by a DataLoader worker, or a test, keeps none once
# its batches stop. Each read is decoded as it lands (NOTE [ Decoding as reads land ] in
# batch_reads.py), the samples' fields decoded together (NOTE [ Bulk decode ]) and
# returned in the caller's order, duplicates as copies. Batches of one dataset from
# several threads take turns. tools/bench_access.py measures it against that floor
# (docs/benchmarks.md, claim random-access).
# ``read_threads``: a batch touching more shards than this sends its GETs in waves; as
# many as a process's S3 clients keep connections (NOTE [ Connections kept ] in s3read.py).
BATCH_READ_THREADS = 64
BATCH_GAP = 4 * 1024 * 1024

# NOTE [ Sidecars of random batches ]
# A batch of random indices touches shards all over the dataset, and the next batch
# others, so a sidecar LRU sized for a streamed window (``INDEX_CACHE_SIZE``) evicts what
# the next batches need: on a dataset of more shards than it holds, every batch would read
# again the sidecars of most shards it touches, one GET each, and wait for them before it
# can send its data GETs (a round trip more on the critical path). A ``MapDataset`` keeps
# as many sidecars as ``SIDECAR_BYTES`` of them hold (by the sizes the manifest gives;
# all of a dataset whose sidecars fit), never fewer than that LRU.
SIDECAR_BYTES = 32 * 1024 * 1024
# What a MapDataset does not take of StreamingDataset's options: an index gives its sample
# (no on_error), in the manifest's order (no plan), with its own read threads.
_NOT_MAPPED = (
    PLAN_OPTIONS
    | TOKEN_OPTIONS
    | {
        "on_error",
        "local_reads",
        "read_budget",
        "read_concurrency",
        "prefetch_windows",
    }
)


@dataclass(frozen=True, slots=True)
class _Opened:
    """What a process reads a dataset with, besides its source's storage."""

    reader: WindowReader
    finder: KeyFinder
    singles: SampleReads
    batches: BatchReads
    lock: threading.Lock  # batches of one dataset from several threads take turns


@dataclass(frozen=True, slots=True)
class _Batch:
    """The runs a batch reads, as a plan window gives them to the reader."""

    runs: tuple[Run, ...]
    shards: tuple[int, ...]


class MapDataset(Dataset):
    """Random access to the samples of the dataset at ``url``: ``dataset[i]``, ``len()``.

    Samples are dicts with ``__key__`` and their fields, decoded by extension as
    :class:`StreamingDataset` does (``decode``, ``decoders``, ``allow_pickle``,
    ``transform``), read through the same storage (``storage_options``, ``cache_dir``,
    ``cache_limit``) and checks (``verify_checksums``). An index out of range is an
    ``IndexError``; negative indices count from the end, as for a Python list. A sample
    that cannot be read or decoded is a ``ShardstreamError`` naming the index, the shard,
    its URL and the byte offset (there is no ``on_error="skip"``: an index must give its
    sample). The dataset pickles as its configuration (and the manifest), so DataLoader
    workers started by fork, spawn or forkserver each open their own storage.
    The manifest is read when the dataset is made, once per job as a
    ``StreamingDataset``'s is: with torch.distributed initialised, rank 0 reads it and
    broadcasts it, so every rank must make the dataset at the same point of its program;
    without a process group the ranks of a node (``WORLD_SIZE`` > 1) share one read.
    ``share_manifest=False`` for a dataset made on some ranks only (an evaluation set on
    rank 0): each reads its own (NOTE [ One manifest read per job ] in startup.py).
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        read_threads: int = BATCH_READ_THREADS,
        share_manifest: bool = True,
        **options: Any,
    ) -> None:
        """``options``: ``ReadOptions``' storage and checks, ``DecodeOptions``."""
        self.config = DatasetConfig.build(os.fspath(url), options, owner="MapDataset", refused=_NOT_MAPPED)
        self.read_threads = check_int(read_threads, "read_threads", minimum=1, url=self.url)
        self.source = DatasetSource(self.config.url, self.config.read)
        self._ends: list[int] | None = None  # prefix sums of the shards' sample counts
        self._starts: list[int] | None = None  # the index of each shard's first sample
        self._length: int | None = None
        if share_manifest:
            share_detected([self.source], Detector())  # NOTE [ One manifest read per job ]
        _ = self.source.manifest  # read now: a URL that is not a dataset fails here

    # -- what the dataset is -------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def manifest(self) -> Manifest:
        """The dataset's manifest, read once (and carried to workers with the dataset)."""
        return self.source.manifest

    @property
    def shard_sizes(self) -> list[int]:
        """Samples per shard, in manifest order: what a ``ShardSampler`` takes."""
        return self.manifest.shard_sizes

    def _opened(self) -> _Opened:
        """This process's reader, key finder and single-sample reads (made once per process)."""
        return self.source.in_process("map", self._open)

    def _open(self) -> _Opened:
        storage = self.source.storage
        reader = self.source.window_reader(
            prefetch=0,
            read_concurrency=self.read_threads,
            coalesce_gap=BATCH_GAP if not storage.local_files else COALESCE_GAP,
            indexes=IndexCache(self._sidecars_kept()),
        )
        finder = KeyFinder(reader, self._offsets())
        batches = BatchReads(reader, self.read_threads)
        return _Opened(reader, finder, SampleReads(reader, self.config.decoder), batches, threading.Lock())

    def _sidecars_kept(self) -> int:
        """How many sidecars this process keeps (NOTE [ Sidecars of random batches ])."""
        shards = self.manifest.shards
        sizes = [info.index_bytes for info in shards if info.index_bytes]
        if not sizes:  # a manifest from before sidecars were sized
            return INDEX_CACHE_SIZE
        fit = SIDECAR_BYTES * len(sizes) // sum(sizes)
        return max(INDEX_CACHE_SIZE, min(len(shards), fit))

    @property
    def storage(self) -> Storage:
        """This process's storage client."""
        return self.source.storage

    def _offsets(self) -> list[int]:
        if self._starts is None:
            ends = self._shard_ends()
            self._starts = [0, *ends[:-1]]
        return self._starts

    def _shard_ends(self) -> list[int]:
        if self._ends is None:
            self._ends = list(itertools.accumulate(self.manifest.shard_sizes))
        return self._ends

    def __len__(self) -> int:
        if self._length is None:
            self._length = self.manifest.num_samples
        return self._length

    def sampler(self, **options: Any) -> ShardSampler:
        """A ``ShardSampler`` over this dataset (``shuffle``, ``seed``, ``num_replicas``,
        ``rank``, ``drop_last``, ``shuffle_window`` and ``order``'s options as its own):
        indices in shard-local runs, so a DataLoader's batches coalesce into few reads. It
        is told the manifest's bytes, so order="global" has ``StreamingDataset``'s default
        window and batches (NOTE [ Global window ])."""
        options.setdefault("dataset_bytes", self.manifest.num_bytes)
        return ShardSampler(self.shard_sizes, **options)

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard, index in shard)`` of sample ``index`` (shard by manifest position)."""
        i = self._normalise(index)
        ends = self._shard_ends()
        shard = bisect.bisect_right(ends, i)
        return shard, i - (ends[shard - 1] if shard else 0)

    def _normalise(self, index: Any) -> int:
        n = self._length if self._length is not None else len(self)
        if type(index) is int and 0 <= index < n:  # the usual case, first
            return index
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"MapDataset indices must be integers, not {type(index).__name__}") from None
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} samples ({self.url})")
        return i

    # -- reading -------------------------------------------------------------------------

    def __getitem__(self, index: int) -> Any:
        """Sample ``index``: one ranged read, checked, decoded (NOTE [ Checked single reads ])."""
        i = self._normalise(index)
        ends = self._ends if self._ends is not None else self._shard_ends()
        shard = bisect.bisect_right(ends, i)
        try:
            opened = self.source.in_process("map", self._open)  # _opened(), a call fewer per sample
            sample = opened.singles.sample(shard, i - ends[shard - 1] if shard else i)
        except ShardstreamError as error:
            raise _with_index(error, i) from error
        transform = self.config.transform
        return sample if transform is None else transform(sample)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """What torch's DataLoader calls with a batch's indices: :meth:`get_many`."""
        return self.get_many(indices)

    def get_many(self, indices: Iterable[int]) -> list[Any]:
        """The samples at ``indices``, in that order (see NOTE [ Batch fetches ])."""
        wanted = [self._normalise(index) for index in indices]
        if not wanted:
            return []
        distinct = sorted(set(wanted))
        samples = self._read(distinct)
        by_index = dict(zip(distinct, samples, strict=True))
        transform, out, seen = self.config.transform, [], set()
        for i in wanted:
            sample = by_index[i]
            if i in seen:  # a repeated index gets its own dict, as another call would
                sample = dict(sample)
            seen.add(i)
            out.append(sample if transform is None else transform(sample))
        return out

    def _read(self, distinct: list[int]) -> list[Any]:
        """The samples at ``distinct`` (sorted, no repeats), decoded, in that order."""
        opened = self._opened()
        reader, batch = opened.reader, self._batch(distinct)
        with opened.lock:
            try:
                raw = cast(list[Any], opened.batches.read(batch.runs, batch.shards))
            except ShardstreamError as error:
                raise self._named(error, distinct, batch) from error
            finally:
                reader.bytes.close()  # the parts of long reads: no threads kept between batches
        decoder = self.config.decoder
        if decoder is None:
            return raw
        decoded, errors = decode_samples(decoder, raw, url=self.url)
        if errors:
            position, failure = min(errors.items())
            if not isinstance(failure, FormatError):
                raise failure
            located = reader.locate(failure, batch, position)
            raise _with_index(located, distinct[position]) from failure
        return decoded

    def _batch(self, distinct: list[int]) -> _Batch:
        """Runs of consecutive samples of one shard, in index order."""
        ends, offsets = self._shard_ends(), self._offsets()
        runs: list[list[int]] = []
        for i in distinct:
            shard = bisect.bisect_right(ends, i)
            local = i - offsets[shard]
            if runs and runs[-1][0] == shard and runs[-1][2] == local:
                runs[-1][2] += 1
            else:
                runs.append([shard, local, local + 1])
        made = tuple(Run(shard, start, stop) for shard, start, stop in runs)
        return _Batch(made, tuple(dict.fromkeys(run.shard for run in made)))

    def _named(self, error: ShardstreamError, distinct: list[int], batch: _Batch) -> ShardstreamError:
        """``error`` of a batch's read, naming the dataset indices it was reading."""
        shown = (
            distinct[0] if len(distinct) == 1 else f"{distinct[0]}..{distinct[-1]} ({len(distinct)} samples)"
        )
        return _with_index(error, shown)

    # -- keys ----------------------------------------------------------------------------

    def index_of(self, key: str) -> int:
        """The index of the sample whose ``__key__`` is ``key`` (if none, a ``KeyNotFoundError``,
        which is a ``ShardstreamError`` and a ``KeyError``);
        see :class:`~shardstream.dataset.keys.KeyFinder` for what a lookup reads."""
        return self._opened().finder.index_of(key)

    def get_by_key(self, key: str) -> Any:
        """The sample whose ``__key__`` is ``key``: ``self[self.index_of(key)]``."""
        return self[self.index_of(key)]

    def close(self) -> None:
        """Release this process's connections (the dataset can still be used)."""
        opened = self.source.made_here("map")
        if isinstance(opened, _Opened):
            opened.batches.close()
            opened.singles.close()
            opened.reader.close()
        self.source.close()

    def __enter__(self) -> MapDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _with_index(error: ShardstreamError, index: object) -> ShardstreamError:
    return type(error)(
        f"{error.message} [dataset index {index}]",
        url=error.url,
        shard=error.shard,
        offset=error.offset,
        line=error.line,
    )
