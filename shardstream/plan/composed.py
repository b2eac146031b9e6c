"""mix="stratified" and mix="per_stream": a mixture's global batches composed of parts.

NOTE [ Composed batches ]
Both mixes need order="global" (NOTE [ Global order ]): the epoch is ``B`` global
batches of ``G`` samples (``B = total // G`` with drop_last, else ``ceil(total / G)``),
the same on every world size dividing ``G`` and any worker count. A global batch is
made of *parts*: each part is a ``GlobalSequence`` of its own (its lanes, chunks and
windows as for a single dataset) over its own virtual shards (some of one stream's
``Segments``), with a batch size ``g``, its share ``L g / G`` of the lanes (at least
one; so reads are as long as a single dataset's, ``G / L``) and a seed drawn from
``(seed, stream, kind)``. Part ``i``'s ``j``-th batch goes into the ``j``-th global
batch that holds part ``i``; the parts of a batch come in a fixed order, so entry ``e``
of batch ``k`` is one entry of one part, and ranks and workers cut the batches exactly
as a ``GlobalPlan``'s. The quotas are first rounded so that the epoch is whole batches:
the epoch of stream ``s`` is ``q_s'`` samples (``quotas``), taken from its passes as
``Mixture.segments(quota=q_s')`` takes them, so "every sample before a repeat" holds.

How each mix lays its parts: NOTE [ Stratified batches ] and NOTE [ Per-stream batches ]
in plan/composed_sequences.py. Which part-batch a global batch holds is a count (``before``), never a
walk over the epoch, so a resume state is the number of global batches taken, as a ``GlobalPlan``'s,
and memory is O(segments + window).

Every part's windows are ``M = shuffle_window // G`` of its own batches: a main part's
windows are then exactly the windows of the global batches, a sparse part's span more
of them (its window of ``M g`` samples still shuffles as a single dataset's would). A
worker's ``Window`` is its batches of whole windows, as a ``GlobalPlan``'s; as every
batch is full, entry ``e`` of its ``i``-th batch is yielded ``i (G / R) + e - r G / R``,
so the yield order is one scatter, no sort.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shardstream.errors import PlanError, StateError
from shardstream.plan.batches import BatchPlan, check_global, read_taken
from shardstream.plan.composed_sequences import ComposedSequence, PerStreamSequence, StratifiedSequence
from shardstream.plan.config import PlanConfig, Window, check_count
from shardstream.plan.mixture import Mixture, check_mixture, check_mixture_state, mixture_view
from shardstream.plan.state import Key
from shardstream.plan.view import ShardView
from shardstream.types import Shape


class ComposedPlan(BatchPlan[ComposedSequence]):
    """The plan of a mix="stratified" or "per_stream" epoch (NOTE [ Composed batches ]) for
    every rank and worker, as a ``GlobalPlan``'s: ``batch_size`` is ``global_batch_size //
    world_size`` and ``state_dict(steps)`` counts global batches. Its runs are of mixture
    shards; its states carry the mixture's streams."""

    @classmethod
    def fresh(cls, mixture: Mixture, config: PlanConfig, epoch: int, shape: Shape) -> ComposedPlan:
        mixture = _check(mixture, config)
        epoch = check_count(epoch, "epoch")
        sequence = _sequence(mixture, config, epoch)
        return cls(_view(mixture, sequence), config, epoch, shape, sequence, 0)

    @classmethod
    def resume(
        cls, mixture: Mixture, config: PlanConfig, state: Mapping[str, Any], shape: Shape
    ) -> ComposedPlan:
        """The rest of the epoch after the global batches the state took, on any shape
        whose world size divides the global batch size."""
        mixture = _check(mixture, config)
        check_mixture_state(mixture, state)
        epoch, taken = read_taken(mixture_view(mixture), config, state)
        sequence = _sequence(mixture, config, epoch)
        return cls(_view(mixture, sequence), config, epoch, shape, sequence, taken, error=StateError)

    def __repr__(self) -> str:
        return (
            f"ComposedPlan(mix={self._view.state[Key.MIX]!r}, epoch={self.epoch}, world_size={self.world_size}, "
            f"num_workers={self.num_workers}, global_batch_size={self._sequence.size}, "
            f"quotas={self.quotas}, global_batches_taken={self._taken} of {self._sequence.batches})"
        )

    # -- what a worker reads: a GlobalPlan's windows, cut from the composed batches --------

    def _window_maker(self, rank: int) -> Callable[[int, int, np.ndarray], Window]:
        sequence = self._sequence
        lo, hi = rank * self.batch_size, (rank + 1) * self.batch_size

        def window_of(first: int, stop: int, batches: np.ndarray) -> Window:
            build = functools.partial(sequence.window_parts, batches, lo, hi)
            return Window.lazy(sequence.window_shards(first, stop, lo, hi), build)

        return window_of


_SEQUENCES: dict[str, type[ComposedSequence]] = {
    "stratified": StratifiedSequence,
    "per_stream": PerStreamSequence,
}


def _check(mixture: Mixture, config: PlanConfig) -> Mixture:
    mixture = check_mixture(mixture, config)
    check_global(config, "mix='stratified' and 'per_stream' compose global batches: a mixture of them")
    if mixture.mix not in _SEQUENCES:
        raise PlanError(f"a ComposedPlan composes mix='stratified' or 'per_stream', not {mixture.mix!r}")
    return mixture


def _sequence(mixture: Mixture, config: PlanConfig, epoch: int) -> ComposedSequence:
    return _SEQUENCES[mixture.mix](mixture, config, epoch=epoch, window=config.window_for(mixture.sizes))


def _view(mixture: Mixture, sequence: ComposedSequence) -> ShardView:
    """The mixture's shards as they are; the quotas its sequence rounds to whole batches."""
    return mixture_view(mixture, quotas=sequence.quotas)
