"""Plans whose epoch is a sequence of global batches that no topology changes: order="global"
over one dataset's shards (``GlobalPlan``) and the composed mixtures (plan/composed.py).

Both cut the sequence the same way (NOTE [ Global order ] in global_order.py): rank ``r``
takes its entries of every global batch, worker ``w`` the rank's batches ``w, w + W,
...`` from where the epoch (or the resumed state) starts, a worker's ``Window`` its
batches of whole windows of the sequence. A state is the number of global batches taken.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from shardstream.errors import PlanError, StateError
from shardstream.plan.base import PlanBase
from shardstream.plan.config import PlanConfig, Window, check_count
from shardstream.plan.global_order import GlobalSequence, lanes_of, window_parts
from shardstream.plan.shards import ShardOrder
from shardstream.plan.state import make_global_state, read_global_state
from shardstream.plan.view import ShardView
from shardstream.types import Shape

# A worker's first Window holds about this many samples, then each one twice the last.
_FIRST_WINDOW = 1024


class BatchSequence(Protocol):
    """What a plan of global batches needs of its sequence: ``batches`` batches of
    ``size`` samples read from ``lanes`` lanes, ``per_window`` batches a window."""

    size: int
    batches: int
    lanes: int
    per_window: int


SequenceT = TypeVar("SequenceT", bound=BatchSequence)


class BatchPlan(PlanBase, Generic[SequenceT]):
    """A sequence of global batches cut for a shape; ``batch_size`` is
    ``global_batch_size // world_size`` and ``state_dict(steps)`` counts global batches."""

    def __init__(
        self,
        view: ShardView,
        config: PlanConfig,
        epoch: int,
        shape: Shape,
        sequence: SequenceT,
        taken: int,
        *,
        error: type[Exception] = PlanError,
    ) -> None:
        super().__init__(view, config, epoch, shape)
        self._sequence, self._taken = sequence, taken
        self._window, self._hold = config.window_for(view.window_sizes), config.hold_for(view.window_sizes)
        if taken > sequence.batches:
            raise StateError(
                f"the state says {taken} global batches were taken, the epoch has {sequence.batches}"
            )
        size, world = sequence.size, shape.world_size
        if size % world:
            raise error(
                f"order='global' with global_batch_size={size} runs on a world size that divides it, "
                f"not on {world} ranks"
            )
        if shape.batch_size != size // world:
            raise error(
                f"order='global' with global_batch_size={size} on {world} ranks takes batches of "
                f"{size // world} samples per rank, not batch_size={shape.batch_size}"
            )

    @abc.abstractmethod
    def _window_maker(self, rank: int) -> Callable[[int, int, np.ndarray], Window]:
        """``(first, stop, batches) -> Window``: rank ``rank``'s part of ``batches`` (of the
        sequence's batches ``[first, stop)``), laid out lazily."""

    # -- what the plan is ------------------------------------------------------------------

    @property
    def shuffle_window(self) -> int:
        return self._window

    @property
    def sequence(self) -> SequenceT:
        return self._sequence

    @property
    def global_batches_taken(self) -> int:
        return self._taken

    def _left(self, worker: int) -> int:
        left = self._sequence.batches - self._taken
        return (left // self.num_workers + (worker < left % self.num_workers)) * self.batch_size

    def batches_per_rank(self) -> int:
        return self._sequence.batches - self._taken

    # -- what a worker reads ---------------------------------------------------------------

    def _windows(self, rank: int, worker: int) -> Iterator[Window]:
        sequence, step, per = self._sequence, self.num_workers, self._sequence.per_window
        window_of = self._window_maker(rank)
        # whole windows of the sequence per Window: see NOTE [ Global order ]
        share = max(1, per * self.batch_size // step)  # this worker's samples of one window
        most = max(1, self._hold // share)  # NOTE [ Global window ]
        count = max(1, min(most, _FIRST_WINDOW // share))
        first = self._taken + worker
        while first < sequence.batches:
            stop = min((first // per + count) * per, sequence.batches)
            batches = np.arange(first, stop, step, dtype=np.int64)  # never empty: first < stop
            yield window_of(first, stop, batches)
            first, count = int(batches[-1]) + step, min(most, 2 * count)

    def global_batch(self, batch: int) -> list[tuple[int, int]]:
        """``(shard, index)`` of every sample of global batch ``batch`` of the epoch (counted
        from its start), all ranks' parts in rank order, over real shards: which data a step
        took, laid out from the seed alone (O(window), nothing read)."""
        batch = check_count(batch, "batch")
        if batch >= self._sequence.batches:
            raise PlanError(
                f"batch {batch} is not one of the epoch's {self._sequence.batches} global batches"
            )
        taken = np.array([batch], dtype=np.int64)
        parts = [self._window_maker(rank)(batch, batch + 1, taken) for rank in range(self.world_size)]
        found: list[tuple[int, int]] = []
        for window in self._view.windows(iter(parts)):
            for shards, indices in window.samples():
                found.extend(zip(shards.tolist(), indices.tolist(), strict=True))
        return found

    # -- resume ----------------------------------------------------------------------------

    def _state(self, steps: int) -> dict[str, Any]:
        return make_global_state(
            self._view.sizes,
            self._config,
            epoch=self._epoch,
            window=self._window,
            lanes=self._sequence.lanes,
            taken=self._taken + steps,
        )


def check_global(config: PlanConfig, what: str) -> None:
    if not isinstance(config, PlanConfig) or not config.is_global:
        raise PlanError(f"{what} needs a PlanConfig with order='global'")


def read_taken(view: ShardView, config: PlanConfig, state: Mapping[str, Any]) -> tuple[int, int]:
    """``(epoch, global batches taken)`` of a state of a plan of global batches over ``view``."""
    window = config.window_for(view.window_sizes)
    return read_global_state(
        view.order_state(state), view.sizes, config, window=window, lanes=lanes_of(config)
    )


class GlobalPlan(BatchPlan[GlobalSequence]):
    """The plan of an order="global" epoch of one dataset (NOTE [ Global order ])."""

    @classmethod
    def fresh(cls, view: ShardView, config: PlanConfig, epoch: int, shape: Shape) -> GlobalPlan:
        check_global(config, "a GlobalPlan")
        epoch = check_count(epoch, "epoch")
        return cls(view, config, epoch, shape, _sequence(view, config, epoch), 0)

    @classmethod
    def resume(
        cls, view: ShardView, config: PlanConfig, state: Mapping[str, Any], shape: Shape
    ) -> GlobalPlan:
        """The rest of the epoch after the global batches the state took, on any shape
        whose world size divides the global batch size."""
        check_global(config, "a GlobalPlan")
        epoch, taken = read_taken(view, config, state)
        return cls(view, config, epoch, shape, _sequence(view, config, epoch), taken, error=StateError)

    def __repr__(self) -> str:
        return (
            f"GlobalPlan(epoch={self.epoch}, world_size={self.world_size}, num_workers={self.num_workers}, "
            f"global_batch_size={self._sequence.size}, read_lanes={self._sequence.lanes}, "
            f"global_batches_taken={self._taken} of {self._sequence.batches})"
        )

    def _window_maker(self, rank: int) -> Callable[[int, int, np.ndarray], Window]:
        sequence = self._sequence
        pieces = sequence.pieces(rank * self.batch_size, (rank + 1) * self.batch_size)

        def window_of(first: int, stop: int, batches: np.ndarray) -> Window:
            build = functools.partial(window_parts, sequence, batches, pieces)
            return Window.lazy(sequence.window_shards(first, stop, pieces), build)

        return window_of


def _sequence(view: ShardView, config: PlanConfig, epoch: int) -> GlobalSequence:
    shards = ShardOrder(view.sizes, shuffle=config.shuffle, seed=config.seed, epoch=epoch)
    return GlobalSequence(shards, config, epoch=epoch, window=config.window_for(view.window_sizes))
