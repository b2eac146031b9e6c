"""What a ``StreamingDataset`` streams: one dataset, or a mixture of streams.

Both kinds give the dataset what it plans and reads with, behind ``DatasetKind``: their
sources (``DatasetSource``: storage, manifest, sidecars, per process), the fingerprint a
state keeps, what ``make_plan`` makes the epoch of, and a reader of its windows.
``OneDataset`` is here; ``StreamMixture`` (dataset/mixture.py) holds a ``OneDataset``
per stream. The dataset picks its kind by what it was given, once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from shardstream.dataset.bulk import StreamDecoders
from shardstream.dataset.config import DatasetConfig
from shardstream.dataset.decode import SampleDecoder, typed_values
from shardstream.dataset.indexes import IndexCache
from shardstream.dataset.mixture_reader import MixtureReader
from shardstream.dataset.reader import WindowReader
from shardstream.dataset.sequences import SequenceReader, TokenShards, check_token_dataset, sequence_counts
from shardstream.dataset.source import DatasetSource
from shardstream.plan import PlanConfig
from shardstream.plan.tokens import TokenSequences
from shardstream.tokens import Packing

__all__ = ["DatasetKind", "OneDataset", "Reader"]

Reader = WindowReader | MixtureReader | SequenceReader


class DatasetKind(Protocol):
    """What a ``StreamingDataset`` plans and reads: one dataset or a mixture."""

    @property
    def sources(self) -> tuple[DatasetSource, ...]: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def window_decoder(self) -> SampleDecoder | StreamDecoders | None: ...
    def check(self) -> None: ...
    def plan_source(self, config: PlanConfig) -> tuple[object, PlanConfig]: ...
    def open_reader(self, config: DatasetConfig) -> Reader: ...


class OneDataset:
    """One dataset folder: planned over its shards' sample counts (or, for a token
    dataset read as sequences, their sequence counts, NOTE [ Reading sequences ])."""

    def __init__(
        self, source: DatasetSource, sequences: Packing | None, decoder: SampleDecoder | None
    ) -> None:
        self.source = source
        self.sequences = sequences
        self.decoder = decoder
        self._counted: TokenSequences | None = None  # its sequences, once counted; carried to workers

    @property
    def sources(self) -> tuple[DatasetSource, ...]:
        return (self.source,)

    @property
    def fingerprint(self) -> str:
        return self.source.fingerprint

    @property
    def window_decoder(self) -> SampleDecoder | None:
        return self.decoder

    def check(self) -> None:
        """Read the manifest now: a URL that is not a dataset fails where it was given."""
        manifest = self.source.manifest
        if self.sequences is not None:
            check_token_dataset(manifest, self.source.url)

    def plan_source(self, config: PlanConfig) -> tuple[object, PlanConfig]:
        """What this dataset's plans are made of (``make_plan``'s source) and their config:
        the plans of order="global" are told the manifest's bytes (``dataset_bytes``,
        NOTE [ Global window ]), which size its default window."""
        if config.is_global:
            config = dataclasses.replace(config, dataset_bytes=self.source.manifest.num_bytes)
        if self.sequences is None:
            return self.source.manifest.shard_sizes, config
        return self.token_sequences(self.sequences), config

    def plan_shards(self) -> tuple[np.ndarray, str]:
        """What a mixture plans this stream with: its samples per shard (sequences, where
        it is read as sequences) and a fingerprint that holds how those were made."""
        if self.sequences is None:
            return np.asarray(self.source.manifest.shard_sizes, dtype=np.int64), self.fingerprint
        sequences = self.token_sequences(self.sequences)
        made = ",".join(f"{key}={value}" for key, value in sequences.record().items())
        return sequences.sizes, f"{self.fingerprint};sequences:{made}"

    def token_sequences(self, packing: Packing) -> TokenSequences:
        """The plan's source of a token dataset read as sequences: their counts per shard,
        worked out once and carried to workers with the dataset."""
        if self._counted is None:
            manifest = self.source.manifest
            check_token_dataset(manifest, self.source.url)
            counts = sequence_counts(packing, manifest, self._shard_sequences)
            tokenizer = manifest.tokens.tokenizer if manifest.tokens is not None else None
            self._counted = TokenSequences(
                counts, packing.seq_len, packing.mode, packing.long_docs, tokenizer or ""
            )
        return self._counted

    def _shard_sequences(self, packing: Packing) -> tuple[Any, Any]:
        """``(sequences of shard, close)``: each shard's sequences read from its sidecar,
        for counts that the manifest does not give."""
        reader = self.source.window_reader()
        shards = TokenShards.of([self.source.manifest], packing)
        return SequenceReader(reader, packing, shards).layout, reader.close

    def window_reader(self, indexes: IndexCache | None = None) -> WindowReader:
        """A reader of this dataset's windows (of documents, for sequences), by columns
        where they are decoded (NOTE [ Bulk decode ])."""
        decoder = self.decoder  # its text and integer fields as typed: NOTE [ Typed values passed through ]
        typed = typed_values(decoder, self.source.manifest.fields) if decoder is not None else None
        return self.source.window_reader(columns=decoder is not None, indexes=indexes, typed_values=typed)

    def open_reader(self, config: DatasetConfig) -> Reader:
        """A reader of this dataset's windows for one iteration (in this process)."""
        reader = self.window_reader()
        if self.sequences is None:
            return reader
        shards = TokenShards.of([self.source.manifest], self.sequences)
        return SequenceReader(reader, self.sequences, shards, fields=config.seq_fields)
