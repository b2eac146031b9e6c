"""Packing: sources in, shards + sample indexes + manifest out.

``pack(source, dest, ...)`` packs a folder of files, JSON Lines, CSV, Parquet or tar
shards; ``ShardWriter(dest, ...)`` takes samples from a program. Both give the same
bytes for the same samples and options. New kinds of input register with
``register_source``.
"""

from __future__ import annotations

from shardstream.pack.api import pack
from shardstream.pack.options import PackOptions, Part, parse_part, parse_size
from shardstream.pack.sources import Entry, Source, available_sources, open_source, register_source
from shardstream.pack.writer import ShardWriter

__all__ = [
    "Entry",
    "PackOptions",
    "Part",
    "ShardWriter",
    "Source",
    "available_sources",
    "open_source",
    "pack",
    "parse_part",
    "parse_size",
    "register_source",
]
