"""``inspect_dataset(url)``: a summary of the manifest: shards, samples, bytes, fields, a
few keys and the distribution of shard sizes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardstream.diagnose import read_manifest
from shardstream.formats import get_format
from shardstream.storage import Storage


@dataclass(frozen=True, slots=True)
class DatasetSummary:
    """What ``shardstream inspect`` shows."""

    url: str
    format: str
    writer: str
    num_shards: int
    num_samples: int
    num_bytes: int
    fields: tuple[str, ...]
    schema: dict[str, str]
    sample_keys: tuple[str, ...]
    shard_bytes: dict[str, float]  # min, p10, p50, p90, max, mean
    shard_samples: dict[str, float]
    tokens: dict[str, Any] | None = None  # token datasets: the manifest's record and num_tokens

    def to_dict(self) -> dict[str, Any]:
        out = {
            "url": self.url,
            "format": self.format,
            "writer": self.writer,
            "num_shards": self.num_shards,
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "fields": list(self.fields),
            "schema": dict(self.schema),
            "sample_keys": list(self.sample_keys),
            "shard_bytes": dict(self.shard_bytes),
            "shard_samples": dict(self.shard_samples),
        }
        if self.tokens is not None:
            out["tokens"] = dict(self.tokens)
        return out


def _distribution(values: list[int]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def quantile(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "min": ordered[0],
        "p10": quantile(0.1),
        "p50": quantile(0.5),
        "p90": quantile(0.9),
        "max": ordered[-1],
        "mean": round(sum(ordered) / len(ordered), 1),
    }


def inspect_dataset(
    url: str, *, storage_options: Mapping[str, Any] | None = None, sample_keys: int = 5
) -> DatasetSummary:
    """A summary of the dataset at ``url`` from its manifest and its first shard's index."""
    storage = Storage(url, storage_options)
    try:
        manifest = read_manifest(storage)
        keys: list[str] = []
        fmt = get_format(manifest.format)
        for shard in manifest.shards:
            if len(keys) >= sample_keys:
                break
            index = fmt.load_index(storage.read(shard.index), name=shard.path)
            keys += index.keys[: sample_keys - len(keys)]
        return DatasetSummary(
            url=storage.url,
            format=manifest.format,
            writer=manifest.writer,
            num_shards=len(manifest.shards),
            num_samples=manifest.num_samples,
            num_bytes=manifest.num_bytes,
            fields=manifest.fields,
            schema=dict(manifest.schema),
            sample_keys=tuple(keys),
            shard_bytes=_distribution([s.bytes for s in manifest.shards]),
            shard_samples=_distribution([s.samples for s in manifest.shards]),
            tokens=None
            if manifest.tokens is None
            else {**manifest.tokens.to_dict(), "num_tokens": manifest.num_tokens},
        )
    finally:
        storage.close()
