"""What every kind of plan shares: the ``Plan`` protocol's members that do not depend
on how a kind cuts its epoch, over the shards of a ``ShardView``.

A kind (plan/kinds.py) implements ``_windows`` (a worker's windows over the view's
shards), ``_left`` (a worker's samples still to come), ``_state`` (its order's state
after some batches) and its shape; this base maps windows and samples to real shards,
checks ranks and workers, and adds the view's keys to every state.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Iterator
from typing import Any

from shardstream.errors import PlanError
from shardstream.plan.config import PlanConfig, Window, check_count
from shardstream.plan.state import same_epoch
from shardstream.plan.view import ShardView
from shardstream.types import Shape


class PlanBase(abc.ABC):
    """An epoch's plan for every rank and worker of ``shape``, over ``view``'s shards."""

    def __init__(self, view: ShardView, config: PlanConfig, epoch: int, shape: Shape) -> None:
        if not isinstance(config, PlanConfig):
            raise PlanError(f"config must be a PlanConfig, not {type(config).__name__}")
        self._view, self._config, self._epoch, self._shape = view, config, epoch, shape
        self._first = 0  # the worker whose batch comes first

    # -- what a kind implements ------------------------------------------------------------

    @abc.abstractmethod
    def _windows(self, rank: int, worker: int) -> Iterator[Window]:
        """A worker's windows over the view's shards, in order."""

    @abc.abstractmethod
    def _left(self, worker: int) -> int:
        """Samples a worker of every rank yields from now to the end of the epoch."""

    @abc.abstractmethod
    def _state(self, steps: int) -> dict[str, Any]:
        """The order's state after every rank took ``steps`` (checked) batches."""

    @property
    @abc.abstractmethod
    def shuffle_window(self) -> int:
        """The window in samples."""

    # -- what the plan is ------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    def of_epoch(self, epoch: int) -> bool:
        """Whether this is a plan of ``epoch`` (``same_epoch``, the one comparison)."""
        return same_epoch(self._epoch, epoch)

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def world_size(self) -> int:
        return self._shape.world_size

    @property
    def num_workers(self) -> int:
        return self._shape.num_workers

    @property
    def batch_size(self) -> int:
        return self._shape.batch_size

    @property
    def quotas(self) -> tuple[int, ...]:
        """What each stream gives this epoch over all ranks, padding aside (one dataset:
        its samples)."""
        return self._view.quotas

    def samples_per_rank(self) -> int:
        """What each rank yields from now to the end of the epoch (equal for all)."""
        return sum(self._left(w) for w in range(self.num_workers))

    def worker_num_samples(self, rank: int, worker: int) -> int:
        self._check(rank, worker)
        return self._left(int(worker))

    def batches_per_rank(self) -> int:
        """Batches each rank yields from now on: per worker, partial last batch included."""
        return sum(-(-self._left(w) // self.batch_size) for w in range(self.num_workers))

    def first_worker(self) -> int:
        """The worker whose batch comes first: 0 in a fresh pass, else the next one in
        the round-robin that the state interrupted."""
        return self._first

    # -- what a worker reads ---------------------------------------------------------------

    def worker_windows(self, rank: int, worker: int) -> Iterator[Window]:
        """The windows of one worker, in order, over real shards; the first may be partly
        used already."""
        self._check(rank, worker)
        return self._view.windows(self._windows(int(rank), int(worker)))

    def worker_samples(self, rank: int, worker: int) -> Iterator[tuple[int, int]]:
        """``(shard, index in shard)`` of every sample of one worker, in yield order."""
        self._check(rank, worker)
        return self._view.samples(self._samples(int(rank), int(worker)))

    def rank_samples(self, rank: int) -> Iterator[tuple[int, int]]:
        """What this rank's DataLoader yields, in order: each worker's batches taken
        round-robin from ``first_worker()``, an exhausted worker skipped."""
        self._check(rank, 0)
        return self._view.samples(self._rank_samples(int(rank)))

    def _samples(self, rank: int, worker: int) -> Iterator[tuple[int, int]]:
        for window in self._windows(rank, worker):
            for shards, indices in window.samples():
                yield from zip(shards.tolist(), indices.tolist(), strict=True)

    def _rank_samples(self, rank: int) -> Iterator[tuple[int, int]]:
        count, size = self.num_workers, self.batch_size
        turn = [(self._first + i) % count for i in range(count)]
        streams = {w: self._samples(rank, w) for w in turn}
        while turn:
            for worker in list(turn):
                batch = list(itertools.islice(streams[worker], size))
                if len(batch) < size:
                    turn.remove(worker)
                yield from batch

    # -- resume ----------------------------------------------------------------------------

    def state_dict(self, steps: int) -> dict[str, Any]:
        """The state after every rank took ``steps`` batches from this plan (counted since
        this plan object started); small and JSON-serialisable."""
        steps = check_count(steps, "steps")
        if steps > self.batches_per_rank():
            raise PlanError(
                f"steps={steps} is more than the {self.batches_per_rank()} batches this plan has per rank"
            )
        return self._view.with_state(self._state(steps))

    def _check(self, rank: int, worker: int) -> None:
        if check_count(rank, "rank") >= self.world_size:
            raise PlanError(f"rank {rank!r} is not in a world of size {self.world_size}")
        if check_count(worker, "worker") >= self.num_workers:
            raise PlanError(f"worker {worker!r} is not one of {self.num_workers} workers")
