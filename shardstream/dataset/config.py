"""The options of a :class:`~shardstream.dataset.StreamingDataset`, frozen in one value.

The dataset's constructor only builds a :class:`DatasetConfig` from its option groups
(dataset/options.py); everything downstream (the plan, the reader, the decoders, the
workers) reads this one picklable value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardstream.counts import check_int
from shardstream.dataset.decode import SampleDecoder
from shardstream.dataset.options import (
    DECODE_OPTIONS,
    PLAN_OPTIONS,
    READ_OPTIONS,
    TOKEN_OPTIONS,
    DecodeOptions,
    ReadOptions,
    TokenOptions,
    plan_config,
    split_options,
)
from shardstream.diagnose import read_manifest
from shardstream.errors import ManifestError, UsageError
from shardstream.manifest import Manifest
from shardstream.plan import PlanConfig
from shardstream.storage import Storage
from shardstream.tokens import Packing
from shardstream.tokens.build import SEQ_FIELDS

__all__ = ["DatasetConfig", "read_streamable_manifest"]


@dataclass(frozen=True, slots=True)
class DatasetConfig:
    """What to stream and how.

    ``plan`` holds the plan's knobs (``shuffle``, ``seed``, ``drop_last``,
    ``shuffle_window``, also readable here as attributes; ``order``,
    ``global_batch_size`` and ``read_lanes`` of NOTE [ Global order ]); ``read`` how
    shards are fetched and checked; ``decoder`` is ``None`` with ``decode=False``;
    ``num_replicas``/``rank`` override the detected topology (``None``: detect);
    ``batch_size`` is the batch size the plan assumes when no shardstream DataLoader tells
    it one; ``sequences``: a token dataset read as packed sequences (NOTE [ Reading
    sequences ]), ``None``: as documents; ``seq_fields``: the arrays each sequence carries.
    """

    url: str
    plan: PlanConfig = field(default_factory=PlanConfig)
    read: ReadOptions = field(default_factory=ReadOptions)
    decoder: SampleDecoder | None = None
    transform: Callable[[dict[str, Any]], Any] | None = None
    sequences: Packing | None = None
    seq_fields: tuple[str, ...] = SEQ_FIELDS
    num_replicas: int | None = None
    rank: int | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise UsageError(f"dataset url must be a non-empty string, got {self.url!r}")
        if not isinstance(self.plan, PlanConfig):
            raise UsageError(f"plan must be a PlanConfig, not {type(self.plan).__name__}", url=self.url)
        for name, minimum in (("batch_size", 1), ("num_replicas", 1), ("rank", 0)):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), name, minimum=minimum, url=self.url)

    @classmethod
    def build(
        cls,
        url: str,
        options: Mapping[str, Any],
        *,
        owner: str = "StreamingDataset",
        refused: frozenset[str] = frozenset(),
        num_replicas: int | None = None,
        rank: int | None = None,
        batch_size: int | None = None,
    ) -> DatasetConfig:
        """The config for ``StreamingDataset(url, **options)``: snapshots the decoder registry."""
        stripped = str(url).rstrip("/")
        url = str(url) if not stripped or stripped.endswith(":") else stripped  # "s3://" stays a URL
        read, decode, plan, tokens = split_options(
            owner, options, READ_OPTIONS, DECODE_OPTIONS, PLAN_OPTIONS, TOKEN_OPTIONS, refused=refused
        )
        token_options = TokenOptions(**tokens)
        sequences = token_options.packing_of(url)
        seq_fields = token_options.fields_of(url)
        planned = plan_config(url, plan)
        decoding = DecodeOptions(**decode)
        if sequences is not None:  # the sequences are arrays already: nothing to decode
            decoding = dataclasses.replace(decoding, decode=False)
        decoder = decoding.decoder(url)
        return cls(
            url=url,
            plan=planned,
            read=ReadOptions(**read).checked(url),
            decoder=decoder,
            transform=decoding.transform,
            sequences=sequences,
            seq_fields=seq_fields,
            num_replicas=num_replicas,
            rank=rank,
            batch_size=batch_size,
        )

    # The plan's knobs, read where they always were.

    @property
    def shuffle(self) -> bool:
        return self.plan.shuffle

    @property
    def seed(self) -> int:
        return self.plan.seed

    @property
    def drop_last(self) -> bool:
        return self.plan.drop_last

    @property
    def shuffle_window(self) -> int | None:
        return self.plan.shuffle_window


def read_streamable_manifest(storage: Storage) -> Manifest:
    """``storage``'s manifest, refused when it lists no shards: a pack never writes one
    (it refuses an empty source), so it is hand-made or cut short, and streaming it would
    end every epoch at once with no error (``verify`` names the shard files beside it)."""
    manifest = read_manifest(storage)  # where there is none, it says why
    if not manifest.shards:
        raise ManifestError(
            f"the manifest of {storage.url} lists no shards: nothing to read "
            f"(`shardstream verify {storage.url}` names the shard files beside it)",
            url=storage.url,
        )
    return manifest
