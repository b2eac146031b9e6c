"""What is in a dataset folder: ``index`` it, ``inspect`` it, ``verify`` it.

- ``index_dataset(url)`` writes the sample-index sidecars and the manifest for shards
  another tool wrote (``webdataset.ShardWriter`` tars, Spark or Ray Parquet), or joins
  the parts of a ``pack --part I/N``; a tar shard is read once (hash and index together),
  a Parquet one twice (its footer comes first).
- ``inspect_dataset(url)`` summarises the manifest: shards, samples, bytes, fields, a
  few keys and the distribution of shard sizes.
- ``record_sequences(url, seq_len)`` counts a token dataset's packed sequences of one
  packing once and records them in its manifest (NOTE [ Recorded sequences ]).
- ``verify_dataset(url)`` re-reads every shard and checks it against the manifest:
  size, sha256, sample count, and the sidecar against an index rebuilt from the shard.

It reads the names a pack writes from ``shardstream.folder`` and holds the destination's
lease from ``shardstream.lock``; it never imports ``shardstream.pack``.
"""

from __future__ import annotations

from shardstream.catalog.index import index_dataset
from shardstream.catalog.inspect import DatasetSummary, inspect_dataset
from shardstream.catalog.sequences import record_sequences
from shardstream.catalog.verify import ShardProblem, VerifyReport, verify_dataset

__all__ = [
    "DatasetSummary",
    "ShardProblem",
    "VerifyReport",
    "index_dataset",
    "inspect_dataset",
    "record_sequences",
    "verify_dataset",
]
