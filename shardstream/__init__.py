"""shardstream: pack corpora into shards on object storage, stream them into PyTorch.

The public API, imported lazily so that ``import shardstream`` (and the CLI's pack,
inspect and verify) do not pay for importing torch::

    shardstream.pack(source, dest, ...)             # build a dataset
    shardstream.ShardWriter(dest, ...)              # write samples from a program
    shardstream.StreamingDataset(url, ...)          # stream it, rank- and worker-aware
    shardstream.StreamingDataset([shardstream.Stream(url, weight=0.7), ...])  # a mixture
    shardstream.DataLoader(dataset, ...)            # with exact mid-epoch state_dict()
    shardstream.MapDataset(url, ...)                # random access: dataset[i], by key too
    shardstream.ShardSampler(shard_sizes, ...)      # the plan as a map-style sampler
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardstream._version import __version__

_EXPORTS = {
    "pack": "shardstream.pack",
    "ShardWriter": "shardstream.pack",
    "index_dataset": "shardstream.catalog",
    "inspect_dataset": "shardstream.catalog",
    "verify_dataset": "shardstream.catalog",
    "StreamingDataset": "shardstream.dataset",
    "Stream": "shardstream.dataset",
    "DataLoader": "shardstream.dataset",
    "MapDataset": "shardstream.dataset",
    "ShardSampler": "shardstream.sampler",
    "EpochPlan": "shardstream.plan",
    "PlanConfig": "shardstream.plan",
    "Manifest": "shardstream.manifest",
    "ShardInfo": "shardstream.manifest",
    "Storage": "shardstream.storage",
    "ShardstreamError": "shardstream.errors",
}

__all__ = [
    "DataLoader",
    "EpochPlan",
    "Manifest",
    "MapDataset",
    "PlanConfig",
    "ShardInfo",
    "ShardSampler",
    "ShardWriter",
    "ShardstreamError",
    "Storage",
    "Stream",
    "StreamingDataset",
    "__version__",
    "index_dataset",
    "inspect_dataset",
    "pack",
    "verify_dataset",
]

if TYPE_CHECKING:
    from shardstream.catalog import index_dataset, inspect_dataset, verify_dataset
    from shardstream.dataset import DataLoader, MapDataset, Stream, StreamingDataset
    from shardstream.errors import ShardstreamError
    from shardstream.manifest import Manifest, ShardInfo
    from shardstream.pack import ShardWriter, pack
    from shardstream.plan import EpochPlan, PlanConfig
    from shardstream.sampler import ShardSampler
    from shardstream.storage import Storage


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shardstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
