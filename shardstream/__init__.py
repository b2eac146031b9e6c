"""shardstream: pack corpora into shards on object storage, stream them into PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"
