"""``StreamingDataset``: a torch ``IterableDataset`` over a shardstream dataset folder, or
over a mixture of several (a list of :class:`~shardstream.Stream`).

Each DataLoader worker of each rank builds the epoch plan for its own place in the
topology and yields the samples of its windows, read with ranged reads (see
``reader.py``). What it streams is its kind (dataset/kinds.py: one dataset, or a
``StreamMixture``), chosen once by what it was given. The epoch changes only through
:meth:`StreamingDataset.set_epoch` or a loaded state, never inside ``__iter__``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from torch.utils.data import IterableDataset

from shardstream.counts import check_int
from shardstream.dataset.binding import LoaderSlot
from shardstream.dataset.bulk import WindowDecoding
from shardstream.dataset.config import DatasetConfig
from shardstream.dataset.iteration import Iteration, window_samples
from shardstream.dataset.kinds import DatasetKind, OneDataset, Reader
from shardstream.dataset.mixture import Stream, StreamMixture, mixture_label, streams_of
from shardstream.dataset.source import DatasetSource
from shardstream.dataset.startup import by_source, first_window_shards, share_manifests
from shardstream.errors import StateError, UsageError, shown
from shardstream.lifecycle import freeze_inherited_heap
from shardstream.manifest import Manifest
from shardstream.plan import Plan, PlanConfig, Shape, make_plan
from shardstream.plan.mixture import Mixture
from shardstream.plan.state import ResumeState
from shardstream.storage import Storage
from shardstream.topology import Detector

__all__ = ["StreamingDataset"]


class StreamingDataset(IterableDataset):
    """Stream the samples of the dataset at ``url``, rank- and worker-aware.

    Each sample is a dict with ``__key__`` and its fields, decoded by extension unless
    ``decode=False`` (then raw bytes). ``len()`` is the number of samples this rank gets
    per epoch. The options are those of dataset/options.py: ``ReadOptions``
    (``storage_options``, ``cache_dir``, ``cache_limit``, ``local_reads``,
    ``verify_checksums``, ``on_error``, ``read_budget``, ``read_concurrency``),
    ``DecodeOptions`` (``decode``, ``decoders``, ``allow_pickle``, ``transform``),
    ``PlanOptions`` (``shuffle``, ``seed``, ``drop_last``, ``shuffle_window``, ``order``,
    ``global_batch_size``, ``read_lanes``) and ``TokenOptions`` (``seq_len``,
    ``packing``, ``long_docs``, ``seq_fields``). ``decoders`` maps extensions to decoders that override
    the registry, ``allow_pickle`` lets pickled fields load; ``verify_checksums=False``
    skips the per-read CRC check of NOTE [ Checksummed reads ].
    ``local_reads`` says how shards in a local folder are read: ``"copy"`` (``pread``),
    ``"map"`` (memory-mapped: faster for small samples, but a shard file truncated in place
    while it is read kills the process with SIGBUS, so only for a dataset nothing rewrites
    in place meanwhile), or ``"auto"`` (the default: map on a read-only mount, else copy);
    see NOTE [ Getting the bytes ] in dataset/fetch.py.
    ``order="global"`` with ``global_batch_size`` (and optionally ``read_lanes``) yields
    the same global batches on every world size dividing it (NOTE [ Global order ]); a
    DataLoader over it then takes ``batch_size=global_batch_size // world_size``.
    On object storage a worker keeps ``read_concurrency`` requests in flight and fetches
    later windows ahead within ``read_budget`` bytes (default 64 MiB, 128 MiB where the
    storage's small GETs took 30 ms or more to answer: NOTE [ Read budget ]); with
    ``shuffle=False`` it takes a window larger than that in pieces (NOTE [ Unshuffled
    windows in pieces ]).
    ``num_replicas``/``rank`` override the detected topology; ``batch_size`` is the batch
    the plan assumes when no shardstream DataLoader tells it one. ``topology`` detects
    rank, world size and DataLoader worker (default: torch.distributed,
    ``RANK``/``WORLD_SIZE``, ``get_worker_info()``); inject a ``topology.Detector`` with
    other detectors for odd launchers or tests.
    A list of :class:`~shardstream.Stream` (or URLs) instead of ``url`` makes a mixture
    (dataset/mixture.py): ``mix`` and ``epoch_size`` are its options, every sample
    carries ``__stream__`` (NOTE [ Mixture options ]), and ``sources[i]`` (also
    ``datasets[i]``) is stream ``i``'s dataset: its manifest and storage.
    The manifest (each stream's, for a mixture) is read when the dataset is made, so a
    URL that is not a dataset fails here; it is carried to workers with the dataset. With
    torch.distributed initialised, rank 0 reads it and broadcasts it, so every rank must
    make the dataset at the same point of its program; ``share_manifest=False`` for a
    dataset made on some ranks only (NOTE [ One manifest read per job ] in startup.py).
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Sequence[Stream | str],
        *,
        mix: str | None = None,
        epoch_size: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        batch_size: int | None = None,
        topology: Detector | None = None,
        share_manifest: bool = True,
        **options: Any,
    ) -> None:
        kind: DatasetKind
        if isinstance(url, (list, tuple)):
            streams = streams_of(url)
            config = _config(mixture_label(streams), options, num_replicas, rank, batch_size)
            kind = StreamMixture(streams, config, mix=mix, epoch_size=epoch_size)
            config = dataclasses.replace(config, decoder=kind.decoder)
        else:
            if mix is not None or epoch_size is not None:
                raise UsageError(
                    "mix and epoch_size are options of a mixture (a list of Streams)", url=str(url)
                )
            config = _config(
                os.fspath(cast("str | os.PathLike[str]", url)), options, num_replicas, rank, batch_size
            )
            kind = OneDataset(DatasetSource(config.url, config.read), config.sequences, config.decoder)
        if topology is not None and not isinstance(topology, Detector):
            raise UsageError(
                f"topology must be a topology.Detector, not {type(topology).__name__}", url=config.url
            )
        self.config = config
        self.kind = kind
        self._detector = Detector() if topology is None else topology
        self.loader_slot = LoaderSlot()  # the epoch, and what a DataLoader bound to it sets
        self._rank_world: tuple[int, int] | None = None  # resolved in the main process
        self._iteration: Iteration | None = None  # the latest in-process one
        self._primed_epoch: int | None = None  # the epoch whose first sidecars were read for workers
        self._decoding = WindowDecoding(
            kind.window_decoder, config.decoder, config.transform, config.read.on_error == "skip", config.url
        )
        if share_manifest and not self._detector.in_worker():
            share_manifests(kind.sources, self._detected_world())  # NOTE [ One manifest read per job ]
        kind.check()  # last: a URL that is not a dataset, or a mixture that sizes its streams two ways, fails here

    def _detected_world(self) -> int:
        try:
            return self.rank_and_world()[1]
        except UsageError:  # a rank outside its world fails where it is used, as it always did
            self._rank_world = None
            return 1

    # -- what the dataset is -------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def sources(self) -> tuple[DatasetSource, ...]:
        """The dataset's source, or one per stream of a mixture (manifest, storage, sidecars)."""
        return self.kind.sources

    @property
    def datasets(self) -> tuple[DatasetSource, ...]:
        """``sources``, by the name a mixture's streams had: ``datasets[i].manifest``."""
        return self.kind.sources

    def _one(self, what: str) -> DatasetSource:
        if isinstance(self.kind, OneDataset):
            return self.kind.source
        raise UsageError(
            f"a mixture has one {what} per stream: dataset.sources[i].{what} (or dataset.datasets[i].{what})",
            url=self.url,
        )

    @property
    def manifest(self) -> Manifest:
        """The dataset's manifest, read once (and carried to workers with the dataset)."""
        return self._one("manifest").manifest

    @property
    def storage(self) -> Storage:
        """This process's storage client: made lazily, and made anew after a fork."""
        return self._one("storage").storage

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint (``manifest.dataset_fingerprint``; a mixture's: a
        digest of its streams'), kept in states."""
        return self.kind.fingerprint

    def _mixed(self) -> StreamMixture:
        if isinstance(self.kind, StreamMixture):
            return self.kind
        raise UsageError("streams, quotas and mix are a mixture's (a list of Streams)", url=self.url)

    @property
    def streams(self) -> tuple[Stream, ...]:
        return self._mixed().streams

    @property
    def mix(self) -> str:
        return self._mixed().mix

    @property
    def epoch_size(self) -> int | None:
        return self._mixed().epoch_size

    @property
    def mixture(self) -> Mixture:
        """A mixture's streams: their shard sizes and quotas per epoch."""
        return self._mixed().mixture

    @property
    def quotas(self) -> tuple[int, ...]:
        """Samples of each stream per epoch (over all ranks, padding aside); mix="stratified"
        and "per_stream" round them to whole global batches (NOTE [ Composed batches ])."""
        return self._mixed().quotas(self.config.plan, self.epoch)

    @property
    def num_skipped(self) -> int:
        """Samples skipped with on_error="skip", in this process."""
        return self._decoding.skipped

    @property
    def epoch(self) -> int:
        return self.loader_slot.epoch.get()

    def set_epoch(self, epoch: int) -> None:
        """Use the plan of ``epoch`` from the next iteration on; a loaded state for
        another epoch is discarded."""
        epoch = check_int(epoch, "epoch", error=StateError, url=self.url)
        slot = self.loader_slot
        slot.epoch.set(epoch)
        if slot.resume is not None and not slot.resume.of_epoch(epoch):
            slot.resume = None

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
        if self.loader_slot.shape is not None:
            return self.loader_slot.shape[0]
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
        slot = self.loader_slot
        if num_workers is None:
            num_workers = 1 if slot.shape is None else slot.shape[1]
        epoch = self.epoch
        shape = Shape(world, num_workers, self.batch_size())
        state = slot.resume if slot.resume is not None and slot.resume.of_epoch(epoch) else None
        if consume:
            slot.resume = None
        source, config = self.kind.plan_source(self.config.plan)
        if state is None:
            plan = make_plan(source, config, epoch=epoch, shape=shape)
        else:
            plan = make_plan(source, config, state=state.plan, shape=shape)
        if not consume and slot.shape is not None:
            self._read_first_sidecars(plan)
        return plan

    def _read_first_sidecars(self, plan: Plan) -> None:
        """The plan a bound DataLoader's workers will follow, made in the main process
        before they start: read their first windows' sidecars here, once (NOTE [ First
        sidecars through the parent ] in startup.py). Only for the first epoch planned:
        persistent workers started then read their later windows' themselves."""
        workers = plan.num_workers
        if workers < 2 or self.config.sequences is not None or self._detector.in_worker():
            return
        if self._primed_epoch is not None and self._primed_epoch != self.epoch:
            return
        self._primed_epoch = self.epoch
        rank, world = self.rank_and_world()
        shards = [shard for worker in range(workers) for shard in first_window_shards(plan, rank, worker)]
        sources = self.kind.sources
        for number, mine in by_source(shards, [len(s.manifest.shards) for s in sources]).items():
            sources[number].read_first_sidecars(mine, world)

    def _seed_first_sidecars(self, plan: Plan, rank: int, worker: int) -> None:
        """In a worker: its first window's sidecars, carried from the main process, into its LRU."""
        sources = self.kind.sources
        shards = first_window_shards(plan, rank, worker) if any(s.carries_sidecars for s in sources) else ()
        grouped = by_source(shards, [len(s.manifest.shards) for s in sources])
        shared = sources[0].indexes  # a mixture's streams read through the first's LRU (mixture.py)
        for number, source in enumerate(sources):
            source.seed_first_sidecars(grouped.get(number, ()), shared)

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
        if self.loader_slot.resume is not None:
            return self.loader_slot.resume.to_dict()
        return self.make_state(self.make_plan(consume=False).state_dict(0))

    def make_state(self, plan_state: dict[str, Any]) -> dict[str, Any]:
        """A dataset (and DataLoader) state around the plan's state (JSON-able)."""
        resume = ResumeState(
            epoch=self.epoch, plan=plan_state, url=self.url, dataset_fingerprint=self.fingerprint
        )
        return resume.to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()`` (of a dataset or a shardstream DataLoader), also
        under another world size or number of workers; ``StateError`` if it does not fit."""
        loaded = ResumeState.read(state, url=self.url)
        slot = self.loader_slot
        before = (self.epoch, slot.resume, self._iteration)
        self.set_epoch(loaded.epoch)
        slot.resume = dataclasses.replace(loaded, dataset_fingerprint=self.fingerprint)
        self._iteration = None
        try:
            self.make_plan(consume=False)  # validate now, not in a worker
            self._check_fingerprint(loaded.dataset_fingerprint)
        except Exception:  # a refused state changes nothing: not the epoch, nor a loaded state
            self.set_epoch(before[0])
            slot.resume, self._iteration = before[1], before[2]
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
        iteration = Iteration(plan)
        if self._detector.in_worker():
            freeze_inherited_heap()  # NOTE [ A worker's garbage collector ]
            self._seed_first_sidecars(plan, rank, worker)
        else:
            self._iteration = iteration
        windows = plan.worker_windows(rank, worker)
        return window_samples(self.open_reader(), windows, iteration, self._decoding)

    def open_reader(self) -> Reader:
        """A reader of this dataset's windows for one iteration (in this process)."""
        return self.kind.open_reader(self.config)

    # -- pickling: configuration and manifests, never a live client --------------------------

    def __getstate__(self) -> dict[str, Any]:
        if not self._detector.in_worker():
            self.rank_and_world()  # resolve in the main process, where torch.distributed lives
        state = dict(self.__dict__)
        state["_iteration"] = None  # the sources drop their storage and sidecars themselves
        return state  # the epoch pickles as Epoch decides: shared only with starting workers


def _config(
    url: str, options: Mapping[str, Any], num_replicas: int | None, rank: int | None, batch_size: int | None
) -> DatasetConfig:
    return DatasetConfig.build(url, options, num_replicas=num_replicas, rank=rank, batch_size=batch_size)
