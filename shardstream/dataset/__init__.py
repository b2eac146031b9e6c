"""Streaming into PyTorch: :class:`StreamingDataset` and :class:`DataLoader`; random
access: :class:`MapDataset`.

``register_decoder`` and ``decoders`` manage the field decoders by extension.
"""

from __future__ import annotations

from shardstream.dataset.decode import PickleRefusedError, decoders, register_decoder
from shardstream.dataset.loader import DataLoader
from shardstream.dataset.random_access import MapDataset
from shardstream.dataset.streaming import StreamingDataset

__all__ = [
    "DataLoader",
    "MapDataset",
    "PickleRefusedError",
    "StreamingDataset",
    "decoders",
    "register_decoder",
]
