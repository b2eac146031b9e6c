"""Token sequences as a kind of plan: a packed sequence of ``seq_len`` tokens is a sample.

A sequence never crosses a shard boundary, so a token dataset's plan is the plan of its
order over per-shard sequence counts, and every guarantee of that order holds for
sequences: equal sequences per rank, the same global batches on any world size, exact
resume on another shape. What makes a sequence (the sequence length, the packing, how
long documents are cut, the tokenizer) decides which tokens sequence ``i`` of a shard
holds, so a state records it and resumes only the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardstream.errors import StateError, shown
from shardstream.plan.base import PlanBase
from shardstream.plan.config import PlanConfig, shard_sizes_array
from shardstream.plan.orders import order_plan
from shardstream.plan.state import Key
from shardstream.plan.view import ShardView
from shardstream.types import Shape


@dataclass(frozen=True, eq=False)
class TokenSequences:
    """A token dataset read as sequences: ``sizes`` the sequences of each shard (manifest
    order); ``seq_len``, ``packing``, ``long_docs`` and ``tokenizer`` (its fingerprint)
    what makes them."""

    sizes: np.ndarray = field(repr=False)
    seq_len: int
    packing: str
    long_docs: str
    tokenizer: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", shard_sizes_array(self.sizes))

    def record(self) -> dict[str, Any]:
        """What a state records of the sequences (JSON-able)."""
        return {
            Key.SEQ_LEN: int(self.seq_len),
            Key.PACKING: str(self.packing),
            Key.LONG_DOCS: str(self.long_docs),
            Key.TOKENIZER: str(self.tokenizer),
        }

    def view(self) -> ShardView:
        return ShardView(self.sizes, None, {Key.SEQUENCES: self.record()})

    def check(self, state: Mapping[str, Any]) -> None:
        """``StateError`` unless ``state`` was saved over sequences made as these are."""
        saved = state.get(Key.SEQUENCES) if isinstance(state, Mapping) else None
        if not isinstance(saved, Mapping):
            raise StateError("the state is not of token sequences: it resumes the plan it was saved with")
        for key, value in self.record().items():
            if type(saved.get(key)) is not type(value) or saved.get(key) != value:
                raise StateError(
                    f"the state was saved over sequences with {key}={shown(saved.get(key))}, these have "
                    f"{key}={value!r}: sequence i of a shard holds other tokens; resume with the same {key}"
                )


def selects(source: object, config: PlanConfig) -> bool:
    return isinstance(source, TokenSequences)


def fresh(source: TokenSequences, config: PlanConfig, epoch: int, shape: Shape) -> PlanBase:
    return order_plan(config).fresh(source.view(), config, epoch, shape)


def resume(source: TokenSequences, config: PlanConfig, state: Mapping[str, Any], shape: Shape) -> PlanBase:
    source.check(state)
    return order_plan(config).resume(source.view(), config, state, shape)
