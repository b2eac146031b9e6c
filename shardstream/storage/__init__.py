"""Storage: fsspec access with ranged reads, retries, atomic writes, a local cache, prefetch.

Wraps an fsspec file system by composition. No torch here, and no imports of
``shardstream.formats`` or ``shardstream.plan``.
"""

from __future__ import annotations

from shardstream.storage.cache import ShardCache
from shardstream.storage.core import Storage
from shardstream.storage.expect import Expected
from shardstream.storage.local import absolute_url, file_kind
from shardstream.storage.prefetch import Prefetcher
from shardstream.storage.read_pool import ReadPool, trim_read_buffers
from shardstream.storage.retry import RetryPolicy, is_transient

__all__ = [
    "Expected",
    "Prefetcher",
    "ReadPool",
    "RetryPolicy",
    "ShardCache",
    "Storage",
    "absolute_url",
    "file_kind",
    "is_transient",
    "trim_read_buffers",
]
