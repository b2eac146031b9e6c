"""Streaming into PyTorch: :class:`StreamingDataset` (of one dataset, or a mixture of
:class:`Stream` sources) and :class:`DataLoader`; random access: :class:`MapDataset`.

``register_decoder`` and ``decoders`` manage the field decoders by extension.
"""

from __future__ import annotations

from shardstream.dataset.decode import PickleRefusedError, decoders, register_decoder
from shardstream.dataset.loader import DataLoader
from shardstream.dataset.mixture import Stream
from shardstream.dataset.random_access import MapDataset
from shardstream.dataset.streaming import StreamingDataset

__all__ = [
    "DataLoader",
    "MapDataset",
    "PickleRefusedError",
    "Stream",
    "StreamingDataset",
    "decoders",
    "register_decoder",
]
