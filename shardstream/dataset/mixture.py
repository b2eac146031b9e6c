"""Mixtures in PyTorch: :class:`Stream` names one dataset of a mixture, a ``StreamingDataset`` over a
list of them (a :class:`MixedDataset`) streams their mixture.

# NOTE [ Mixture options ]
# A ``Stream`` says where its samples are and how much of them an epoch takes: its URL,
# ``weight``/``repeat``/``choose`` (NOTE [ Mixtures ] in plan/mixture.py), and what is
# particular to its storage: ``storage_options`` (another bucket, endpoint or
# credentials), ``cache_dir``/``cache_limit`` and ``local_reads``, each by default the
# mixture's. Each stream keeps its own Storage, manifest and reader (one
# ``StreamingDataset`` per stream, in ``MixedDataset.datasets``; the sidecar LRU is the
# mixture's, one for all), and may be tar or Parquet.
# How its samples become values may be its own too: ``decode``, ``decoders`` and
# ``allow_pickle`` (a stream of raw bytes beside decoded ones, or with its own decoder
# for an extension); left out, the mixture's. A window is then decoded in bulk stream by
# stream (``bulk.StreamDecoders``, picked by ``__stream__``).
# Everything else is the mixture's, given to ``StreamingDataset`` once: the plan's knobs
# (``shuffle``, ``seed``, ``drop_last``, ``shuffle_window``, ``order`` and its options),
# because one plan orders all streams; the ``transform``, which reads ``__stream__`` if it
# must tell streams apart; and the worker's reading (``on_error``, ``verify_checksums``,
# ``read_budget``, ``read_concurrency``), because one worker reads all streams with one
# read budget (NOTE [ Mixture reads ] in mixture_reader.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np

from shardstream.dataset.bulk import StreamDecoders
from shardstream.dataset.config import DatasetConfig
from shardstream.dataset.decode import Decoder, SampleDecoder
from shardstream.dataset.indexes import IndexCache
from shardstream.dataset.mixture_reader import STREAM_KEY, MixtureReader
from shardstream.dataset.sequences import SequenceReader, TokenShards
from shardstream.dataset.streaming import StreamingDataset
from shardstream.errors import PlanError, UsageError
from shardstream.manifest import Manifest
from shardstream.plan import PlanConfig, Shape, make_plan
from shardstream.plan.mixture import MIXES, Mixture, StreamSpec
from shardstream.storage import Storage

__all__ = ["STREAM_KEY", "MixedDataset", "Stream"]


@dataclass(frozen=True)
class Stream:
    """One stream of a mixture: the dataset at ``url`` and how much of it an epoch takes,
    at most one of ``weight`` (a share of the epoch; then every stream has one), ``repeat``
    (a multiple of its size: 0.5 half of it, 2.5 two and a half times) or ``choose``
    (samples per epoch); none takes all of it once. ``storage_options``, ``cache_dir``,
    ``cache_limit``, ``local_reads``, ``decode``, ``decoders`` and ``allow_pickle`` are
    the mixture's unless given (NOTE [ Mixture options ])."""

    url: str
    _: KW_ONLY
    weight: float | None = None
    repeat: float | None = None
    choose: int | None = None
    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | None = None
    cache_limit: int | None = None
    local_reads: str | None = None
    decode: bool | None = None
    decoders: Mapping[str, Decoder] | None = None
    allow_pickle: bool | None = None

    def __post_init__(self) -> None:
        url = os.fspath(self.url)
        if not isinstance(url, str) or not url:
            raise UsageError(f"a Stream's url must be a non-empty string, got {self.url!r}")
        object.__setattr__(self, "url", url.rstrip("/") or url)
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise UsageError("storage_options must be a mapping", url=self.url)
        try:  # the plan's rules for one stream, checked now rather than at the first epoch
            self.spec(np.zeros(0, dtype=np.int64), "")
        except PlanError as error:
            raise UsageError(str(error), url=self.url) from error

    def spec(self, sizes: Sequence[int] | np.ndarray, fingerprint: str) -> StreamSpec:
        """What the plan needs of this stream, given its shard sizes and fingerprint."""
        return StreamSpec(
            self.url,
            np.asarray(sizes),
            fingerprint,
            weight=self.weight,
            repeat=self.repeat,
            choose=self.choose,
        )

    def config(self, mixture: DatasetConfig) -> DatasetConfig:
        """The config this stream is read with: the mixture's, with this stream's options."""
        options = self.storage_options
        return dataclasses.replace(
            mixture,
            url=self.url,
            storage_options=dict(mixture.storage_options if options is None else options),
            cache_dir=mixture.cache_dir if self.cache_dir is None else self.cache_dir,
            cache_limit=mixture.cache_limit if self.cache_limit is None else self.cache_limit,
            local_reads=mixture.local_reads if self.local_reads is None else self.local_reads,
            decoder=self._decoder(mixture),
        )

    def _decoder(self, mixture: DatasetConfig) -> SampleDecoder | None:
        """The mixture's decoder, unless this stream gives its own ``decode``, ``decoders``
        or ``allow_pickle``: then one built from them (the mixture's for what it leaves out;
        ``decoders`` alone decode the stream even when the mixture does not)."""
        if self.decode is None and self.decoders is None and self.allow_pickle is None:
            return mixture.decoder
        decode = (
            mixture.decoder is not None or self.decoders is not None if self.decode is None else self.decode
        )
        if not decode:  # its own decoders decode it, unless it says decode=False
            return None
        allow = mixture.decoder.allow_pickle if mixture.decoder is not None else False
        return SampleDecoder.build(
            self.decoders, allow_pickle=allow if self.allow_pickle is None else self.allow_pickle
        )


class MixedDataset(StreamingDataset):
    """``StreamingDataset([Stream(...), ...], mix=..., epoch_size=..., ...)``: one epoch
    drawn from several datasets, each stream its quota (NOTE [ Mixtures ]); every sample
    carries ``__stream__``, the index of its stream in the list. Options are split as
    NOTE [ Mixture options ] says; ``len()``, states, ``set_epoch`` and the DataLoader work
    as for one dataset, and a state names the streams, so it loads only into the same
    mixture."""

    def __init__(
        self,
        url: Sequence[Stream | str | os.PathLike[str]],
        *,
        mix: str | None = None,
        epoch_size: int | None = None,
        **options: Any,
    ) -> None:
        """``url``: the streams (``StreamingDataset``'s first argument), a URL taken whole."""
        listed = [s if isinstance(s, Stream) else Stream(os.fspath(s)) for s in url]
        if not listed:
            raise UsageError("a mixture needs at least one Stream")
        label = "mixture of " + ", ".join(stream.url for stream in listed)
        super().__init__(label, **options)
        self.mix = "random" if mix is None else mix
        if self.mix not in MIXES:
            raise UsageError(f"mix must be one of {MIXES}, not {self.mix!r}", url=label)
        if self.mix != "random" and not self.config.plan.is_global:
            raise UsageError(
                f"mix={self.mix!r} composes global batches: it needs order='global' and a global_batch_size",
                url=label,
            )
        self.epoch_size = epoch_size
        self.streams = tuple(listed)
        self.datasets = tuple(_stream_dataset(stream.config(self.config)) for stream in self.streams)
        decoders = tuple(dataset.config.decoder for dataset in self.datasets)
        self._decoders = None if all(d is self.config.decoder for d in decoders) else StreamDecoders(decoders)
        if self._decoders is not None and all(d is None for d in decoders):
            self._decoders = None
            self.config = dataclasses.replace(self.config, decoder=None)
        elif self._decoders is not None and self.config.decoder is None:  # decoded streams: the bulk path
            self.config = dataclasses.replace(self.config, decoder=next(d for d in decoders if d is not None))
        self._mixture: Mixture | None = None

    def window_decoder(self) -> Any:
        """Each stream's own decoder where streams decode apart (``Stream(decode=...)``)."""
        return self.config.decoder if self._decoders is None else self._decoders

    # -- what the dataset is -------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        raise UsageError("a mixture has one manifest per stream: dataset.datasets[i].manifest", url=self.url)

    @property
    def storage(self) -> Storage:
        raise UsageError("a mixture has one storage per stream: dataset.datasets[i].storage", url=self.url)

    @property
    def fingerprint(self) -> str:
        """A digest of the streams' fingerprints, in order (a state checks each by name first)."""
        if self._fingerprint is None:
            joined = "\n".join(dataset.fingerprint for dataset in self.datasets)
            self._fingerprint = "mixture:" + hashlib.sha256(joined.encode()).hexdigest()
        return self._fingerprint

    @property
    def mixture(self) -> Mixture:
        """The streams' shard sizes and quotas per epoch (their manifests read once)."""
        if self._mixture is None:
            specs = [
                stream.spec(*dataset.plan_shards())
                for stream, dataset in zip(self.streams, self.datasets, strict=True)
            ]
            try:
                self._mixture = Mixture(specs, epoch_size=self.epoch_size, mix=self.mix)
            except PlanError as error:  # the streams' sizing: a user's choice
                raise UsageError(str(error), url=self.url) from error
        return self._mixture

    @property
    def quotas(self) -> tuple[int, ...]:
        """Samples of each stream per epoch (over all ranks, padding aside); mix="stratified"
        and "per_stream" round them to whole global batches (NOTE [ Composed batches ])."""
        plan = self.config.plan
        batch = int(plan.global_batch_size or 1) if plan.is_global else 1
        return make_plan(self.mixture, plan, epoch=self.epoch, shape=Shape(1, 1, batch)).quotas

    # -- plans and reads -----------------------------------------------------------------

    def _plan_source(self) -> tuple[object, PlanConfig]:
        return self.mixture, self.config.plan

    def open_reader(self) -> MixtureReader | SequenceReader:
        # One sidecar LRU for all streams, as one dataset has (NOTE [ Sidecars across
        # epochs ]): entries are keyed by the whole ShardInfo, sha256 included, so streams
        # never see each other's. Made anew in each process, as a stream's Storage is.
        if self._indexes is None or self._storage_pid != os.getpid():
            self._indexes, self._storage_pid = IndexCache(), os.getpid()
        for dataset in self.datasets:
            _ = dataset.storage  # made first: a new Storage comes with a new LRU
            dataset._indexes = self._indexes
        readers = [dataset._window_reader() for dataset in self.datasets]
        reader = MixtureReader(
            readers,
            self.mixture.shard_offsets,
            prefetch=self.config.prefetch_windows,
            read_budget=self.config.read_budget,
        )
        if self.config.sequences is None:
            return reader
        manifests = [dataset.manifest for dataset in self.datasets]
        shards = TokenShards.of(manifests, self.config.sequences, mixture=True)
        return SequenceReader(reader, self.config.sequences, shards)


def _stream_dataset(config: DatasetConfig) -> StreamingDataset:
    """One stream's own dataset: its storage, manifest, sidecars and reader."""
    dataset = StreamingDataset.__new__(StreamingDataset)
    dataset._start(config, None)
    return dataset
