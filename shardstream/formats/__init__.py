"""Shard formats: tar (WebDataset conventions), Parquet and token arrays, behind one contract.

A small registry maps a format's name to a stateless codec instance, read-only from
the outside, as fsspec's ``registry.py`` does::

    fmt = get_format("tar")
    enc = fmt.encoder(fileobj, name="shard-000000.tar")
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from shardstream.errors import UsageError
from shardstream.formats.base import Sample, SampleIndex, ShardEncoder, ShardFormat
from shardstream.formats.parquet import ParquetFormat
from shardstream.formats.tar import TarFormat
from shardstream.formats.tokens import TokensFormat

__all__ = [
    "Sample",
    "SampleIndex",
    "ShardEncoder",
    "ParquetFormat",
    "ShardFormat",
    "TarFormat",
    "TokensFormat",
    "available_formats",
    "get_format",
    "register_format",
]

_BUILT_IN: dict[str, ShardFormat] = {"tar": TarFormat(), "parquet": ParquetFormat(), "tokens": TokensFormat()}
_registry: dict[str, ShardFormat] = dict(_BUILT_IN)
_view = MappingProxyType(_registry)


def available_formats() -> Mapping[str, ShardFormat]:
    """Every registered format by name (a read-only live view)."""
    return _view


def get_format(name: str) -> ShardFormat:
    """The codec registered as ``name``; ``UsageError`` listing the known ones otherwise."""
    try:
        return _registry[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(_registry))
        raise UsageError(f"unknown shard format {name!r}; known formats: {known}") from None


def register_format(fmt: ShardFormat, *, clobber: bool = False) -> None:
    """Register a codec under ``fmt.name``; replacing another one needs ``clobber=True``."""
    if not isinstance(fmt, ShardFormat):
        raise UsageError(f"register_format needs a ShardFormat instance, not {type(fmt).__name__}")
    name = getattr(fmt, "name", None)
    if not isinstance(name, str) or not name:
        raise UsageError(f"format {type(fmt).__name__} has no name")
    existing = _registry.get(name)
    if existing is not None and type(existing) is not type(fmt) and not clobber:
        raise UsageError(
            f"a different format is already registered as {name!r}; pass clobber=True to replace it"
        )
    _registry[name] = fmt


def _unregister_format(name: str) -> None:
    """Forget a format that ``register_format`` added (tests that register their own undo
    it with this); a built-in format comes back as it was, never goes away."""
    if name in _BUILT_IN:
        _registry[name] = _BUILT_IN[name]
    else:
        _registry.pop(name, None)
