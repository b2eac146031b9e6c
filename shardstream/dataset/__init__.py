"""Streaming into PyTorch: :class:`StreamingDataset` and :class:`DataLoader`.

``register_decoder`` and ``decoders`` manage the field decoders by extension.
"""

from __future__ import annotations

from shardstream.dataset.decode import PickleRefusedError, decoders, register_decoder
from shardstream.dataset.loader import DataLoader
from shardstream.dataset.streaming import StreamingDataset

__all__ = ["DataLoader", "PickleRefusedError", "StreamingDataset", "decoders", "register_decoder"]
