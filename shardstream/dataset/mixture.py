"""Mixtures in PyTorch: :class:`Stream` names one dataset of a mixture, a ``StreamingDataset`` over a
list of them streams their mixture (its kind: :class:`StreamMixture`).

# NOTE [ Mixture options ]
# A ``Stream`` says where its samples are and how much of them an epoch takes: its URL,
# ``weight``/``repeat``/``choose`` (NOTE [ Mixtures ] in plan/mixture.py), and what is
# particular to its storage: ``storage_options`` (another bucket, endpoint or
# credentials), ``cache_dir``/``cache_limit`` and ``local_reads``, each by default the
# mixture's. Each stream keeps its own Storage, manifest and reader (one
# ``DatasetSource`` per stream, in ``StreamingDataset.sources``; the sidecar LRU is the
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

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np

from shardstream.dataset.bulk import StreamDecoders
from shardstream.dataset.config import DatasetConfig
from shardstream.dataset.decode import Decoder, SampleDecoder
from shardstream.dataset.kinds import OneDataset, Reader
from shardstream.dataset.mixture_reader import STREAM_KEY, MixtureReader
from shardstream.dataset.options import DecodeOptions, ReadOptions
from shardstream.dataset.sequences import SequenceReader, TokenShards
from shardstream.dataset.source import DatasetSource
from shardstream.errors import PlanError, UsageError
from shardstream.plan import PlanConfig, Shape, make_plan
from shardstream.plan.mixture import MIXES, Mixture, StreamSpec

__all__ = ["STREAM_KEY", "Stream", "StreamMixture"]


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

    def read_options(self, mixture: ReadOptions) -> ReadOptions:
        """How this stream is read: the mixture's options, with this stream's own."""
        return mixture.override(
            self.url,
            storage_options=self.storage_options,
            cache_dir=self.cache_dir,
            cache_limit=self.cache_limit,
            local_reads=self.local_reads,
        )

    def decoder(self, mixture: SampleDecoder | None) -> SampleDecoder | None:
        """The mixture's decoder, unless this stream gives its own ``decode``, ``decoders``
        or ``allow_pickle``: then one built from them (the mixture's for what it leaves out;
        ``decoders`` alone decode the stream even when the mixture does not)."""
        if self.decode is None and self.decoders is None and self.allow_pickle is None:
            return mixture
        decode = mixture is not None or self.decoders is not None if self.decode is None else self.decode
        allow = mixture.allow_pickle if mixture is not None else False
        allow = allow if self.allow_pickle is None else self.allow_pickle
        return DecodeOptions(decode=bool(decode), decoders=self.decoders, allow_pickle=allow).decoder(
            self.url
        )


def streams_of(given: Sequence[Stream | str | os.PathLike[str]]) -> tuple[Stream, ...]:
    """The streams of a mixture given as Streams or URLs (a URL taken whole)."""
    listed = tuple(s if isinstance(s, Stream) else Stream(os.fspath(s)) for s in given)
    if not listed:
        raise UsageError("a mixture needs at least one Stream")
    return listed


def mixture_label(streams: Sequence[Stream]) -> str:
    """What a mixture's errors name it by."""
    return "mixture of " + ", ".join(stream.url for stream in streams)


class StreamMixture:
    """A mixture's kind of ``StreamingDataset``: one epoch drawn from several datasets,
    each stream its quota (NOTE [ Mixtures ]); every sample carries ``__stream__``, the
    index of its stream in the list. Options are split as NOTE [ Mixture options ] says;
    a state names the streams, so it loads only into the same mixture."""

    def __init__(
        self, streams: tuple[Stream, ...], config: DatasetConfig, *, mix: str | None, epoch_size: int | None
    ) -> None:
        self.url = config.url
        self.mix = "random" if mix is None else mix
        if self.mix not in MIXES:
            raise UsageError(f"mix must be one of {MIXES}, not {self.mix!r}", url=self.url)
        if self.mix != "random" and not config.plan.is_global:
            raise UsageError(
                f"mix={self.mix!r} composes global batches: it needs order='global' and a global_batch_size",
                url=self.url,
            )
        self.epoch_size = epoch_size
        self.streams = streams
        self.datasets = tuple(
            OneDataset(
                DatasetSource(stream.url, stream.read_options(config.read)),
                config.sequences,
                stream.decoder(config.decoder),
            )
            for stream in streams
        )
        self.decoder, self.window_decoder = _decoders(config.decoder, [d.decoder for d in self.datasets])
        self._mixture: Mixture | None = None
        self._fingerprint: str | None = None

    @property
    def sources(self) -> tuple[DatasetSource, ...]:
        return tuple(dataset.source for dataset in self.datasets)

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

    def check(self) -> None:
        """Read the manifests and size the streams now: a mixture that cannot make an
        epoch fails where it was given."""
        _ = self.mixture

    def quotas(self, config: PlanConfig, epoch: int) -> tuple[int, ...]:
        """Samples of each stream per epoch (over all ranks, padding aside)."""
        batch = int(config.global_batch_size or 1) if config.is_global else 1
        return make_plan(self.mixture, config, epoch=epoch, shape=Shape(1, 1, batch)).quotas

    def plan_source(self, config: PlanConfig) -> tuple[object, PlanConfig]:
        return self.mixture, config

    def open_reader(self, config: DatasetConfig) -> Reader:
        """A reader of the mixture's windows for one iteration (in this process)."""
        # One sidecar LRU for all streams, as one dataset has (NOTE [ Sidecars across
        # epochs ]): the first stream's, made anew in each process as its Storage is.
        # Entries are keyed by the whole ShardInfo, sha256 included, so streams never see
        # each other's.
        shared = self.datasets[0].source.indexes
        readers = [dataset.window_reader(indexes=shared) for dataset in self.datasets]
        reader = MixtureReader(
            readers,
            self.mixture.shard_offsets,
            prefetch=config.read.prefetch_windows,
            read_budget=config.read.read_budget,
        )
        if config.sequences is None:
            return reader
        manifests = [dataset.source.manifest for dataset in self.datasets]
        shards = TokenShards.of(manifests, config.sequences, mixture=True)
        return SequenceReader(reader, config.sequences, shards, fields=config.seq_fields)


def _decoders(
    mixture: SampleDecoder | None, decoders: list[SampleDecoder | None]
) -> tuple[SampleDecoder | None, SampleDecoder | StreamDecoders | None]:
    """The mixture's decoder, as its config keeps it (``None``: no stream decodes), and
    what decodes its windows: that decoder, or ``StreamDecoders`` where streams decode
    apart (``Stream(decode=...)``)."""
    if all(decoder is mixture for decoder in decoders):
        return mixture, mixture
    if all(decoder is None for decoder in decoders):
        return None, None
    if mixture is None:  # decoded streams: the bulk path
        mixture = next(decoder for decoder in decoders if decoder is not None)
    return mixture, StreamDecoders(tuple(decoders))
