"""The dataset manifest: ``manifest.json`` at the root of a dataset folder.

It lists every shard (path relative to the manifest, sample count, byte size, sha256,
and the path of its sample-index sidecar), the fields of a sample, the totals and the
writer. It holds no timestamps and no absolute paths, so the same input always gives
the same manifest and a dataset folder can be copied or moved as a whole. It is written
last and atomically: a dataset without a manifest is not a dataset.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardstream.errors import ManifestError

__all__ = [
    "FORMATS",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "Manifest",
    "ShardInfo",
    "counts_checksum",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
FORMATS = ("tar", "parquet")


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard: where it is (relative to the manifest) and what it holds."""

    path: str
    samples: int
    bytes: int
    sha256: str
    index: str  # sidecar with the per-sample index, relative to the manifest
    index_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "samples": self.samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "index": self.index,
            "index_bytes": self.index_bytes,
        }


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a dataset holds. ``fields`` are tar extensions or Parquet column names."""

    format: str
    shards: tuple[ShardInfo, ...]
    fields: tuple[str, ...] = ()
    schema: dict[str, str] = field(default_factory=dict)  # Parquet: column -> arrow type
    key_column: str | None = None  # Parquet: the column that names a sample, if any
    writer: str = ""
    version: int = MANIFEST_VERSION

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ManifestError(f"unknown shard format {self.format!r}; known: {', '.join(FORMATS)}")

    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def shard_sizes(self) -> list[int]:
        """Sample count of each shard, in manifest order: the epoch plan's input."""
        return [s.samples for s in self.shards]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "format": self.format,
            "writer": self.writer,
            "fields": list(self.fields),
            "schema": dict(sorted(self.schema.items())),
            "key_column": self.key_column,
            "num_shards": len(self.shards),
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "shards": [s.to_dict() for s in self.shards],
        }

    def to_json(self) -> str:
        """Deterministic JSON: the same manifest always gives the same bytes."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=False, ensure_ascii=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, url: str | None = None) -> Manifest:
        """Parse and validate a manifest; ``url`` only names it in errors."""
        try:
            data = json.loads(text)
        except ValueError as error:
            raise ManifestError(f"manifest is not valid JSON: {error}", url=url) from None
        if not isinstance(data, dict):
            raise ManifestError("manifest is not a JSON object", url=url)
        version = data.get("version")
        if version != MANIFEST_VERSION:
            raise ManifestError(
                f"manifest version {version!r} is not supported (this shardstream reads "
                f"version {MANIFEST_VERSION}); upgrade shardstream or re-index the dataset",
                url=url,
            )
        try:
            shards = tuple(
                ShardInfo(
                    path=str(s["path"]),
                    samples=int(s["samples"]),
                    bytes=int(s["bytes"]),
                    sha256=str(s["sha256"]),
                    index=str(s["index"]),
                    index_bytes=int(s.get("index_bytes", 0)),
                )
                for s in data["shards"]
            )
            manifest = cls(
                format=str(data["format"]),
                shards=shards,
                fields=tuple(data.get("fields", ())),
                schema=dict(data.get("schema") or {}),
                key_column=data.get("key_column"),
                writer=str(data.get("writer", "")),
                version=int(version),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ManifestError(f"manifest is malformed: {error!r}", url=url) from None
        for shard in manifest.shards:
            if shard.samples < 0 or shard.bytes < 0:
                raise ManifestError("negative sample count or size", url=url, shard=shard.path)
            if shard.path.startswith("/") or ".." in shard.path.split("/"):
                raise ManifestError(
                    "shard path must be relative and inside the dataset", url=url, shard=shard.path
                )
        return manifest


def counts_checksum(shard_sizes: Sequence[int]) -> str:
    """A short fingerprint of a dataset's shard layout, stored in resume states."""
    digest = hashlib.sha256(",".join(str(int(n)) for n in shard_sizes).encode())
    return digest.hexdigest()[:16]
