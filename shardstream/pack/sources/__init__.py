"""Pack sources: a small registry of the kinds of input ``shardstream pack`` reads.

A new kind of input is one module with a :class:`Source` subclass and one
``register_source`` call, as fsspec registers file systems::

    @register_source
    class LinesSource(Source):
        name = "lines"
        ...

``open_source`` picks a source by name, or by asking each registered one whether it
reads the URL (the folder source last: it takes any folder).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from shardstream.errors import UsageError
from shardstream.pack.sources.base import Entry, Source, is_dir
from shardstream.pack.sources.csvfile import CsvSource
from shardstream.pack.sources.folder import FolderSource
from shardstream.pack.sources.jsonl import JsonlSource
from shardstream.pack.sources.parquet import ParquetSource
from shardstream.pack.sources.tar import TarSource

__all__ = ["Entry", "Source", "available_sources", "open_source", "register_source"]

_SOURCES: dict[str, type[Source]] = {}


def register_source(cls: type[Source]) -> type[Source]:
    """Add a source class under ``cls.name`` (replacing one of that name); a decorator too."""
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise UsageError(f"a pack source must be a subclass of Source, not {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise UsageError(f"pack source {cls.__name__} has no name")
    _SOURCES[name] = cls
    return cls


def available_sources() -> Mapping[str, type[Source]]:
    """The registered sources by name (a read-only view)."""
    return MappingProxyType(_SOURCES)


def open_source(
    url: str | os.PathLike[str],
    *,
    source_type: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Source:
    """The source reading ``url``: the one named ``source_type``, or the one that detects it."""
    url = os.fspath(url)
    options = dict(storage_options or {})
    if source_type is not None:
        cls = _SOURCES.get(source_type)
        if cls is None:
            raise UsageError(f"unknown source type {source_type!r}; known: {', '.join(sorted(_SOURCES))}")
        is_dir(url, options)  # a missing source fails here, clearly
        return cls(url, options)
    folder = is_dir(url, options)
    ordered = sorted(_SOURCES.values(), key=lambda cls: cls.fallback)
    for cls in ordered:
        if cls.detect(url, options, folder):
            return cls(url, options)
    raise UsageError(
        f"cannot tell what kind of source this is; name it with --source-type ({', '.join(sorted(_SOURCES))})",
        url=url,
    )


for _cls in (ParquetSource, TarSource, JsonlSource, CsvSource, FolderSource):
    register_source(_cls)
