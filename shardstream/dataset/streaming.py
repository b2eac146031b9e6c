"""``StreamingDataset``: a torch ``IterableDataset`` over a shardstream dataset folder.

Each DataLoader worker of each rank builds the epoch plan for its own place in the
topology and yields the samples of its windows, read with ranged reads (see
``reader.py``). The epoch changes only through :meth:`StreamingDataset.set_epoch` or a
loaded state, never inside ``__iter__``.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from torch.utils.data import IterableDataset

from shardstream.counts import check_int
from shardstream.dataset.binding import Epoch
from shardstream.dataset.budget import DEFAULT_READ_BUDGET
from shardstream.dataset.bulk import decoded_columns, decoded_window
from shardstream.dataset.config import DatasetConfig, read_streamable_manifest
from shardstream.dataset.decode import Decoder
from shardstream.dataset.fetch import READ_THREADS, expectations
from shardstream.dataset.indexes import IndexCache
from shardstream.dataset.reader import WindowReader, report_skip
from shardstream.dataset.sequences import SequenceReader, TokenShards, check_token_dataset, sequence_counts
from shardstream.errors import FormatError, StateError, UsageError, shown
from shardstream.formats.base import SampleColumns
from shardstream.manifest import Manifest, dataset_fingerprint
from shardstream.plan import Plan, PlanConfig, Shape, make_plan
from shardstream.plan.state import RESUME_VERSION, ResumeState
from shardstream.plan.tokens import TokenSequences
from shardstream.storage import Expected, Storage
from shardstream.tokens import Packing
from shardstream.topology import Detector

if TYPE_CHECKING:
    from shardstream.dataset.mixture import Stream
    from shardstream.dataset.mixture_reader import MixtureReader

__all__ = ["STATE_VERSION", "StreamingDataset"]

STATE_VERSION = RESUME_VERSION

# NOTE [ A worker's garbage collector ]
# A DataLoader worker forked from the training process inherits its heap: a few hundred
# thousand objects (torch, numpy, the user's model and data), each tracked by the cyclic
# garbage collector. A worker makes a dict for every sample, and once enough of them live
# at once (about a quarter of the objects that survived the parent's last full
# collection) the collector runs a full collection, which walks every tracked object, the
# inherited ones included. Walking them writes to their headers, so each of their pages
# is copied from the parent (copy on write): a costly pause of the worker's CPU, and the
# order="global" worker, which holds more samples at its peak than the local order's,
# meets it every epoch. So a worker's first iteration moves everything it inherited to the
# permanent generation (``gc.freeze()``, as Python's documentation advises for a process
# that forks without exec): its collections walk only what the worker made since, and
# the parent's pages stay shared. tools/bench_stream.py --only order measures the epoch.
# Once per process, so a persistent worker's later epochs collect their own garbage as
# ever. The price: cycles among the inherited objects that die in the worker are never
# collected there (reference counting still frees everything else); they were the
# parent's memory, shared, and a worker lives one epoch, or as long as the loader.
_FROZEN_IN = -1  # the pid of the worker process that froze its inherited heap


def freeze_inherited_heap() -> None:
    """In a DataLoader worker: the objects it inherited moved out of its garbage
    collector's reach, once per process (NOTE [ A worker's garbage collector ])."""
    global _FROZEN_IN
    if os.getpid() != _FROZEN_IN:
        _FROZEN_IN = os.getpid()
        gc.freeze()


class StreamingDataset(IterableDataset):
    """Stream the samples of the dataset at ``url``, rank- and worker-aware.

    Each sample is a dict with ``__key__`` and its fields, decoded by extension unless
    ``decode=False`` (then raw bytes). ``len()`` is the number of samples this rank gets
    per epoch. See ``DatasetConfig`` for the options; ``decoders`` maps extensions to
    decoders that override the registry, ``allow_pickle`` lets pickled fields load;
    ``verify_checksums=False`` skips the per-read CRC check of NOTE [ Checksummed reads ].
    ``local_reads`` says how shards in a local folder are read: ``"copy"`` (``pread``),
    ``"map"`` (memory-mapped: faster for small samples, but a shard file truncated in place
    while it is read kills the process with SIGBUS, so only for a dataset nothing rewrites
    in place meanwhile), or ``"auto"`` (the default: map on a read-only mount, else copy);
    see NOTE [ Getting the bytes ] in dataset/fetch.py.
    ``order="global"`` with ``global_batch_size`` (and optionally ``read_lanes``) yields
    the same global batches on every world size dividing it (NOTE [ Global order ]); a
    DataLoader over it then takes ``batch_size=global_batch_size // world_size``.
    On object storage a worker keeps ``read_concurrency`` requests in flight and fetches
    later windows ahead within ``read_budget`` bytes (NOTE [ Read budget ]); with
    ``shuffle=False`` it takes a window larger than that in pieces (NOTE [ Unshuffled
    windows in pieces ]).
    ``topology`` detects rank, world size and DataLoader worker (default: torch.distributed,
    ``RANK``/``WORLD_SIZE``, ``get_worker_info()``); inject a ``topology.Detector`` with
    other detectors for odd launchers or tests.
    A list of :class:`~shardstream.Stream` (or URLs) instead of ``url`` makes a mixture
    (a ``MixedDataset``, dataset/mixture.py): ``mix`` and ``epoch_size`` are its options,
    and every sample carries ``__stream__`` (NOTE [ Mixture options ]).
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Sequence[Stream | str],
        *,
        mix: str | None = None,
        epoch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        shuffle_window: int | None = None,
        order: str = "local",
        global_batch_size: int | None = None,
        read_lanes: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        batch_size: int | None = None,
        decode: bool = True,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | None = None,
        cache_limit: int | None = None,
        on_error: str = "raise",
        decoders: Mapping[str, Decoder] | None = None,
        allow_pickle: bool = False,
        verify_checksums: bool = True,
        topology: Detector | None = None,
        local_reads: str = "auto",
        read_budget: int = DEFAULT_READ_BUDGET,
        read_concurrency: int = READ_THREADS,
        seq_len: int | None = None,
        packing: str | None = None,
        long_docs: str | None = None,
    ) -> None:
        if mix is not None or epoch_size is not None:
            raise UsageError("mix and epoch_size are options of a mixture (a list of Streams)", url=str(url))
        config = DatasetConfig.build(
            os.fspath(cast("str | os.PathLike[str]", url)),  # a list makes a MixedDataset
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            shuffle_window=shuffle_window,
            order=order,
            global_batch_size=global_batch_size,
            read_lanes=read_lanes,
            num_replicas=num_replicas,
            rank=rank,
            batch_size=batch_size,
            decode=decode,
            decoders=decoders,
            allow_pickle=allow_pickle,
            transform=transform,
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            on_error=on_error,
            verify_checksums=verify_checksums,
            local_reads=local_reads,
            read_budget=read_budget,
            read_concurrency=read_concurrency,
            seq_len=seq_len,
            packing=packing,
            long_docs=long_docs,
        )
        self._start(config, topology)

    def __new__(cls, *args: Any, **kwargs: Any) -> StreamingDataset:
        url = args[0] if args else kwargs.get("url")
        if cls is StreamingDataset and isinstance(url, (list, tuple)):
            from shardstream.dataset.mixture import MixedDataset  # a subclass: imports this module

            return super().__new__(MixedDataset)
        return super().__new__(cls)

    def _start(self, config: DatasetConfig, topology: Detector | None) -> None:
        self.config = config
        url = config.url
        if topology is not None and not isinstance(topology, Detector):
            raise UsageError(f"topology must be a topology.Detector, not {type(topology).__name__}", url=url)
        self._detector = Detector() if topology is None else topology
        self._epoch = Epoch()  # the one owner of the epoch; shared with persistent workers
        self._resume: ResumeState | None = None  # for the next __iter__ of its epoch
        # (batch size, workers) of the shardstream DataLoader bound to it (binding.py)
        self._loader_shape: tuple[int, int] | None = None
        self._rank_world: tuple[int, int] | None = None  # resolved in the main process
        self._manifest: Manifest | None = None
        self._fingerprint: str | None = None  # of the manifest, computed once
        self._storage: Storage | None = None
        self._storage_pid = -1
        # Made with the Storage, anew in each process: the sidecar LRU kept across this
        # process's iterations (NOTE [ Sidecars across epochs ]) and what the manifest says
        # of each object, checked on every read (O(shards) to make).
        self._indexes: IndexCache | None = None
        self._expected: Mapping[str, Expected] | None = None
        self._iteration: _Iteration | None = None  # the latest in-process one
        self._sequences: TokenSequences | None = None  # a token dataset's sequences, once counted
        self.num_skipped = 0  # samples skipped with on_error="skip", in this process

    # -- what the dataset is -------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def manifest(self) -> Manifest:
        """The dataset's manifest, read once (and carried to workers with the dataset)."""
        if self._manifest is None:
            self._manifest = read_streamable_manifest(self.storage)
        return self._manifest

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint (``manifest.dataset_fingerprint``), kept in states."""
        if self._fingerprint is None:
            self._fingerprint = dataset_fingerprint(self.manifest)
        return self._fingerprint

    @property
    def storage(self) -> Storage:
        """This process's storage client: made lazily, and made anew after a fork."""
        if self._storage is None or self._storage_pid != os.getpid():
            self._storage = self.config.open_storage()
            self._storage_pid = os.getpid()
            self._indexes, self._expected = IndexCache(), None
        return self._storage

    @property
    def epoch(self) -> int:
        return self._epoch.get()

    def set_epoch(self, epoch: int) -> None:
        """Use the plan of ``epoch`` from the next iteration on; a loaded state for
        another epoch is discarded."""
        epoch = check_int(epoch, "epoch", error=StateError, url=self.url)
        self._epoch.set(epoch)
        if self._resume is not None and not self._resume.of_epoch(epoch):
            self._resume = None

    def plan_config(self) -> PlanConfig:
        """The plan's parameters as given; the plans of order="global" are also told the
        manifest's bytes (``dataset_bytes``, NOTE [ Global window ]), which size its default window."""
        return self.config.plan

    def rank_and_world(self) -> tuple[int, int]:
        """``(rank, world_size)``; a worker uses what its main process resolved, since
        torch.distributed is initialised only there."""
        cfg = self.config
        if self._rank_world is None or not self._detector.in_worker():
            self._rank_world = self._detector.rank(rank=cfg.rank, world_size=cfg.num_replicas)
        return self._rank_world

    def batch_size(self) -> int:
        """The batch size the plan assumes: the DataLoader's, else the ``batch_size`` given,
        else this rank's part of a global batch (order="global") or 1."""
        if self._loader_shape is not None:
            return self._loader_shape[0]
        plan = self.config.plan
        if self.config.batch_size is None and plan.is_global:
            return plan.rank_batch_size(self.rank_and_world()[1])
        return self.config.batch_size or 1

    def __len__(self) -> int:
        """Samples this rank gets in one epoch (padding included)."""
        return self.make_plan(consume=False).samples_per_rank()

    # -- plans and states ----------------------------------------------------------------

    def make_plan(self, *, num_workers: int | None = None, consume: bool) -> Plan:
        """The plan of the current epoch for this rank: resumed from a loaded state of this
        epoch if there is one (``consume=True`` then uses it up), else fresh."""
        _, world = self.rank_and_world()
        if num_workers is None:
            num_workers = 1 if self._loader_shape is None else self._loader_shape[1]
        epoch = self.epoch
        shape = Shape(world, num_workers, self.batch_size())
        state = self._resume if self._resume is not None and self._resume.of_epoch(epoch) else None
        if consume:
            self._resume = None
        source, config = self._plan_source()
        if state is None:
            return make_plan(source, config, epoch=epoch, shape=shape)
        return make_plan(source, config, state=state.plan, shape=shape)

    def _plan_source(self) -> tuple[object, PlanConfig]:
        """What this dataset's plans are made of (``make_plan``'s source) and their config."""
        config = self.config.plan
        if config.is_global:  # its default window follows the dataset's bytes (NOTE [ Global window ])
            config = dataclasses.replace(config, dataset_bytes=self.manifest.num_bytes)
        packing = self.config.sequences
        if packing is None:
            return self.manifest.shard_sizes, config
        return self._token_sequences(packing), config

    def plan_shards(self) -> tuple[np.ndarray, str]:
        """What a mixture plans this stream with: its samples per shard (sequences, where
        it is read as sequences) and a fingerprint that holds how those were made."""
        packing = self.config.sequences
        if packing is None:
            return np.asarray(self.manifest.shard_sizes, dtype=np.int64), self.fingerprint
        sequences = self._token_sequences(packing)
        made = ",".join(f"{key}={value}" for key, value in sequences.record().items())
        return sequences.sizes, f"{self.fingerprint};sequences:{made}"

    def _layouts(self, packing: Packing) -> tuple[Any, Any]:
        """``(layout of shard, close)``: each shard's sequences read from its sidecar, for counts
        that the manifest does not give."""
        reader = self._window_reader()
        return SequenceReader(reader, packing, TokenShards.of([self.manifest], packing)).layout, reader.close

    def _token_sequences(self, packing: Packing) -> TokenSequences:
        """The plan's source of a token dataset read as sequences (NOTE [ Reading sequences ]):
        their counts per shard, worked out once and carried to workers with the dataset."""
        if self._sequences is None:
            manifest = self.manifest
            check_token_dataset(manifest, self.url)
            counts = sequence_counts(packing, manifest, self._layouts)
            tokenizer = manifest.tokens.tokenizer if manifest.tokens is not None else None
            self._sequences = TokenSequences(
                counts, packing.seq_len, packing.mode, packing.long_docs, tokenizer or ""
            )
        return self._sequences

    def state_dict(self) -> dict[str, Any]:
        """Where the latest in-process iteration stands (iterating the dataset directly;
        through a DataLoader use ``DataLoader.state_dict()``), at a batch boundary."""
        iteration = self._iteration
        if iteration is not None and iteration.plan.of_epoch(self.epoch):
            if iteration.count % iteration.plan.batch_size and not iteration.done:
                raise StateError(
                    f"{iteration.count} samples is not a whole number of batches of {iteration.plan.batch_size}",
                    url=self.url,
                )
            steps = -(-iteration.count // iteration.plan.batch_size)
            return self.make_state(iteration.plan.state_dict(steps))
        return self.start_state()

    def start_state(self) -> dict[str, Any]:
        """The state before the next iteration: a loaded one not yet used, else the
        start of the current epoch."""
        if self._resume is not None:
            return self._resume.to_dict()
        return self.make_state(self.make_plan(consume=False).state_dict(0))

    def _resume_state(self, plan_state: Mapping[str, Any]) -> ResumeState:
        return ResumeState(
            epoch=self.epoch, plan=plan_state, url=self.url, dataset_fingerprint=self.fingerprint
        )

    def make_state(self, plan_state: dict[str, Any]) -> dict[str, Any]:
        """A dataset (and DataLoader) state around the plan's state (JSON-able)."""
        return self._resume_state(plan_state).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()`` (of a dataset or a shardstream DataLoader), also
        under another world size or number of workers; ``StateError`` if it does not fit."""
        loaded = ResumeState.read(state, url=self.url)
        before = (self.epoch, self._resume, self._iteration)
        self.set_epoch(loaded.epoch)
        self._resume = dataclasses.replace(loaded, dataset_fingerprint=self.fingerprint)
        self._iteration = None
        try:
            self.make_plan(consume=False)  # validate now, not in a worker
            self._check_fingerprint(loaded.dataset_fingerprint)
        except Exception:  # a refused state changes nothing: not the epoch, nor a loaded state
            self.set_epoch(before[0])
            self._resume, self._iteration = before[1], before[2]
            raise

    def _check_fingerprint(self, saved: object) -> None:
        """A state saved with a fingerprint must be of this dataset (the plan state checks
        only shard sizes); one saved before fingerprints existed carries none and loads."""
        if saved is None or (isinstance(saved, str) and saved == self.fingerprint):
            return
        raise StateError(
            f"the state is of another dataset: it was saved on one with fingerprint {shown(saved)}, "
            f"this one has {self.fingerprint!r}: the same shard sample counts, but other shard paths or "
            "contents (sha256s in the manifest)",
            url=self.url,
        )

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        # The plan is made here, eagerly, not in the generator: the caller (a DataLoader)
        # may clear the loaded state right after iter() returns.
        rank, _ = self.rank_and_world()
        worker, num_workers = self._detector.worker()
        plan = self.make_plan(num_workers=num_workers, consume=True)
        iteration = _Iteration(plan)
        if self._detector.in_worker():
            freeze_inherited_heap()  # NOTE [ A worker's garbage collector ]
        else:
            self._iteration = iteration
        return self._samples(self.open_reader(), plan.worker_windows(rank, worker), iteration)

    def open_reader(self) -> WindowReader | MixtureReader | SequenceReader:
        """A reader of this dataset's windows for one iteration (in this process)."""
        if self.config.sequences is not None:
            shards = TokenShards.of([self.manifest], self.config.sequences)
            return SequenceReader(self._window_reader(), self.config.sequences, shards)
        return self._window_reader()

    def _window_reader(self) -> WindowReader:
        return WindowReader(
            self.storage,
            self.manifest,
            on_error=self.config.on_error,
            prefetch=self.config.prefetch_windows,
            verify_checksums=self.config.verify_checksums,
            local_reads=self.config.local_reads,
            read_budget=self.config.read_budget,
            read_concurrency=self.config.read_concurrency,
            indexes=self._indexes,
            expected=self._expectations(),
            columns=self.config.decoder is not None,  # NOTE [ Bulk decode ]
        )

    def _expectations(self) -> Mapping[str, Expected]:
        """What the manifest says of each object, made once per process (after ``storage``)."""
        if self._expected is None:
            self._expected = expectations(self.manifest)
        return self._expected

    def _samples(
        self,
        reader: WindowReader | MixtureReader | SequenceReader,
        windows: Iterator[Any],
        iteration: _Iteration,
    ) -> Iterator[Any]:
        decoder, transform = self.config.decoder, self.config.transform
        try:
            for window, samples, holes in reader.stream(windows):  # in yield order
                if decoder is not None and isinstance(samples, SampleColumns):  # NOTE [ Bulk decode ]
                    positions = iteration.start_window(range(len(samples)))
                    yield from decoded_columns(self, samples, positions, window, reader)
                    continue
                listed = samples.samples() if isinstance(samples, SampleColumns) else samples
                del samples
                ordered = iteration.start_window(listed)
                del listed
                if decoder is None and not holes:
                    # The hot path: no Python code runs per sample but the caller's.
                    yield from ordered if transform is None else map(transform, ordered)
                else:
                    yield from decoded_window(self, ordered, window, reader)  # NOTE [ Bulk decode ]
            iteration.done = True
        finally:
            reader.close()

    def window_decoder(self) -> Any:
        """What decodes a window's samples in bulk (``bulk.decoded_window``): the config's
        decoder; a mixture whose streams decode apart gives its ``StreamDecoders``."""
        return self.config.decoder

    def _decoded(self, ordered: Iterator[Any]) -> Iterator[Any]:
        """The samples of one undecoded window (``decode=False``; decoded windows go through
        ``bulk.decoded_window``), those the format could not read with ``on_error="skip"``
        left out and counted."""
        transform = self.config.transform
        for sample in ordered:
            if sample is None:  # the shard format could not decode it (on_error="skip")
                self.num_skipped += 1
                continue
            yield sample if transform is None else transform(sample)

    def _skip(self, error: FormatError) -> None:
        self.num_skipped += 1
        report_skip(error)

    # -- pickling: configuration, never a live client ---------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        if not self._detector.in_worker():
            self.rank_and_world()  # resolve in the main process, where torch.distributed lives
        state = dict(self.__dict__)
        state["_storage"], state["_storage_pid"], state["_iteration"] = None, -1, None
        state["_indexes"], state["_expected"] = None, None  # made anew where it is unpickled
        return state  # the epoch pickles as Epoch decides: shared only with starting workers


class _Iteration:
    """One in-process iteration: its plan and how many samples it has taken, for
    ``state_dict()``; the count is read off the list iterator of the current window, so
    the hot path counts nothing per sample."""

    __slots__ = ("_base", "_iterator", "_size", "done", "plan")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.done = False
        self._base = self._size = 0
        self._iterator: Any = None

    def start_window(self, ordered: Collection[Any]) -> Iterator[Any]:
        """An iterator over ``ordered`` (the samples of a window, or their positions), which
        the window's samples are yielded in step with."""
        self._base += self._size
        self._size = len(ordered)
        self._iterator = iter(ordered)
        return self._iterator

    @property
    def count(self) -> int:
        """Samples taken so far (skipped ones included: they were consumed too)."""
        left = self._iterator.__length_hint__() if self._iterator is not None else 0
        return self._base + self._size - left
