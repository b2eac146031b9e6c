"""Packed token sequences: pure functions of document ends and tokens (numpy only; no I/O,
no torch). A dataset of token shards asks a ``SequenceLayout`` how many sequences a shard
has and which tokens a run of them needs, reads those, and builds the arrays with
``build_sequences``. NOTE [ Packed sequences ] in layout.py says how."""

from __future__ import annotations

from shardstream.tokens.bestfit import BLOCK_TOKENS, best_fit
from shardstream.tokens.build import IGNORE_INDEX, build_sequences
from shardstream.tokens.fitfile import BestFit
from shardstream.tokens.layout import SequenceLayout, SequenceRun, count_sequences, sequence_layout
from shardstream.tokens.packing import LONG_DOCS, MODES, Packing
from shardstream.tokens.pieces import SequencePieces

__all__ = [
    "BLOCK_TOKENS",
    "IGNORE_INDEX",
    "LONG_DOCS",
    "MODES",
    "BestFit",
    "Packing",
    "SequenceLayout",
    "SequencePieces",
    "SequenceRun",
    "best_fit",
    "build_sequences",
    "count_sequences",
    "sequence_layout",
]
