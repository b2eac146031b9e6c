"""How many bytes a sample adds to a shard, fast enough to ask for every sample.

For samples in memory this is the format's own ``sample_size`` (for tar exact and fast
in the usual case: NOTE [ Fast tar sample sizes ] in ``shardstream.formats.tar.header``).
A folder of files is cut into shards before any file is read: the format's ``file_sizer``
sizes a sample from its key, field names and file sizes alone.
"""

from __future__ import annotations

from collections.abc import Callable

from shardstream.formats import ShardFormat
from shardstream.formats.base import Sample


def sample_sizer(fmt: ShardFormat) -> Callable[[Sample], int]:
    """A function giving ``fmt.sample_size(sample)``."""
    return fmt.sample_size
