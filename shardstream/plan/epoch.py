"""``EpochPlan``: which samples each rank and DataLoader worker reads in one epoch.

See DESIGN.md, "The epoch plan", NOTE [ Passes ] and NOTE [ Striped windows ].
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardstream.errors import PlanError, StateError
from shardstream.plan.config import PlanConfig, Run, Window, check_count, shard_sizes_array
from shardstream.plan.intervals import from_points, points, shift
from shardstream.plan.passes import Pass, PassInput, PassRecord, PassSetup, Remainder
from shardstream.plan.shards import ShardOrder
from shardstream.plan.state import make_state, read_state, same_epoch
from shardstream.plan.windows import lanes_for

__all__ = ["EpochPlan"]

# Samples converted to Python tuples at a time while iterating a window.


class EpochPlan:
    """The plan of one epoch for every rank and worker (pure: no I/O, no torch).

    Every rank gets the same number of samples; ranks x workers see every sample of the
    epoch once (plus at most ``world_size - 1`` repeats, or with ``drop_last`` fewer);
    the same inputs give the same plan everywhere. ``num_workers`` 0 is read as 1.
    A config with ``order="global"`` makes a ``GlobalPlan`` (NOTE [ Global order ]).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> EpochPlan:
        config = args[1] if len(args) > 1 else kwargs.get("config")
        if cls is EpochPlan and isinstance(config, PlanConfig) and config.is_global:
            from shardstream.plan.global_order import GlobalPlan  # a subclass: imports this module

            return super().__new__(GlobalPlan)
        return super().__new__(cls)

    def __init__(
        self,
        shard_sizes: Sequence[int] | np.ndarray,
        config: PlanConfig,
        *,
        epoch: int,
        world_size: int,
        num_workers: int = 1,
        batch_size: int = 1,
    ) -> None:
        record = _record(world_size, num_workers, batch_size)
        self._setup(shard_sizes, config, check_count(epoch, "epoch"), [record])

    @classmethod
    def resume(
        cls,
        shard_sizes: Sequence[int] | np.ndarray,
        config: PlanConfig,
        state: Mapping[str, Any],
        *,
        world_size: int,
        num_workers: int = 1,
        batch_size: int = 1,
    ) -> EpochPlan:
        """The rest of the epoch a ``state_dict()`` stopped in, for this topology: the
        same pass continued if the topology is the same, else a new pass over what is
        left. ``StateError`` if the state is of another dataset, seed or version."""
        if cls is EpochPlan and isinstance(config, PlanConfig) and config.is_global:
            from shardstream.plan.global_order import GlobalPlan

            return GlobalPlan.resume(
                shard_sizes,
                config,
                state,
                world_size=world_size,
                num_workers=num_workers,
                batch_size=batch_size,
            )
        record = _record(world_size, num_workers, batch_size)
        sizes = shard_sizes_array(shard_sizes)
        epoch, records = read_state(state, sizes, config, window=config.window_for(sizes))
        plan = cls.__new__(cls)
        if records[-1].steps > 0 and not records[-1].same_topology(record):
            plan._setup(sizes, config, epoch, [*records, record])  # a new pass over what is left
            return plan
        plan._setup(sizes, config, epoch, records)
        if records[-1].same_topology(record):
            return plan
        # Resuming at the start of a pass under another topology makes that pass anew (a
        # fresh epoch if it is the first); a pass with no batches at all is at its end.
        started = not sum(plan._pass.batches)
        plan._setup(sizes, config, epoch, [*records, record] if started else [*records[:-1], record])
        return plan

    def _setup(
        self,
        shard_sizes: Sequence[int] | np.ndarray,
        config: PlanConfig,
        epoch: int,
        records: list[PassRecord],
    ) -> None:
        if not isinstance(config, PlanConfig):
            raise PlanError(f"config must be a PlanConfig, not {type(config).__name__}")
        self._sizes = shard_sizes_array(shard_sizes)
        self._config, self._epoch, self._records = config, epoch, records
        self._window = config.window_for(self._sizes)
        shards = ShardOrder(self._sizes, shuffle=config.shuffle, seed=config.seed, epoch=epoch)
        setup = PassSetup(
            shards,
            config.seed,
            epoch,
            config.shuffle,
            self._window,
            lanes_for(self._window, self._sizes, config.shuffle),
        )
        read_from: PassInput = shards
        inputs = shards.total
        for index, record in enumerate(records):
            current = Pass(index, record, inputs, read_from, setup, drop_last=config.drop_last and index == 0)
            if record.steps > sum(current.batches):
                raise StateError(
                    f"the state says {record.steps} batches per rank were taken in pass {index}, "
                    f"which has only {sum(current.batches)}"
                )
            used, next_worker = current.consumed(record.steps)
            if index < len(records) - 1:
                remainder = Remainder(current, used)
                read_from, inputs = remainder, remainder.count
        self._pass, self._used, self._first = current, used, next_worker

    # -- what the plan is ------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    def of_epoch(self, epoch: int) -> bool:
        """Whether this is a plan of ``epoch`` (``same_epoch``, the one comparison)."""
        return same_epoch(self._epoch, epoch)

    @property
    def world_size(self) -> int:
        return self._pass.record.world_size

    @property
    def num_workers(self) -> int:
        return self._pass.record.num_workers

    @property
    def batch_size(self) -> int:
        return self._pass.record.batch_size

    @property
    def shuffle_window(self) -> int:
        """The window in samples (the config's, or the default for these shards)."""
        return self._window

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

    def __repr__(self) -> str:
        return (
            f"EpochPlan(epoch={self.epoch}, world_size={self.world_size}, num_workers={self.num_workers}, "
            f"batch_size={self.batch_size}, samples_per_rank={self.samples_per_rank()}, pass={self._pass.index})"
        )

    # -- what a worker reads ---------------------------------------------------------------

    def worker_windows(self, rank: int, worker: int) -> Iterator[Window]:
        """The windows of one worker, in order; the first may be partly used already."""
        self._check(rank, worker)
        return self._windows(int(rank), int(worker))

    def _windows(self, rank: int, worker: int) -> Iterator[Window]:
        current = self._pass
        layout = current.layout(worker)
        start = current.slice_start(rank, worker)
        first, used = layout.locate(self._used[worker])
        for index in range(first, layout.num_windows):
            spans = layout.window(index)  # O(lanes): the window's samples are laid out lazily
            runs = current.runs(shift(spans, start))
            skip = used if index == first else 0
            build = functools.partial(_window_parts, current, rank, worker, index, spans, start, runs, skip)
            known = None if skip else runs  # a window resumed part way lays its runs out again
            shards = tuple(dict.fromkeys(run.shard for run in runs))
            yield Window.lazy(shards, build, known, in_run_order=not current.setup.shuffle)

    def worker_samples(self, rank: int, worker: int) -> Iterator[tuple[int, int]]:
        """``(shard, index in shard)`` of every sample of one worker, in yield order."""
        self._check(rank, worker)
        return self._samples(int(rank), int(worker))

    def _samples(self, rank: int, worker: int) -> Iterator[tuple[int, int]]:
        for window in self._windows(rank, worker):
            for shards, indices in window.samples():
                yield from zip(shards.tolist(), indices.tolist(), strict=True)

    def rank_samples(self, rank: int) -> Iterator[tuple[int, int]]:
        """What this rank's DataLoader yields, in order: each worker's batches taken
        round-robin from ``first_worker()``, an exhausted worker skipped."""
        self._check(rank, 0)
        return self._rank_samples(int(rank))

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
        last = self._records[-1]
        done = PassRecord(last.world_size, last.num_workers, last.batch_size, last.steps + steps)
        records = [*self._records[:-1], done]
        return make_state(self._sizes, self._config, epoch=self._epoch, window=self._window, records=records)

    # -- helpers ---------------------------------------------------------------------------

    def _left(self, worker: int) -> int:
        return int(self._pass.lengths[worker]) - self._used[worker]

    def _check(self, rank: int, worker: int) -> None:
        if check_count(rank, "rank") >= self.world_size:
            raise PlanError(f"rank {rank!r} is not in a world of size {self.world_size}")
        if check_count(worker, "worker") >= self.num_workers:
            raise PlanError(f"worker {worker!r} is not one of {self.num_workers} workers")


def _window_parts(
    current: Pass,
    rank: int,
    worker: int,
    index: int,
    spans: tuple[np.ndarray, np.ndarray],
    start: int,
    runs: tuple[Run, ...],
    used: int,
) -> tuple[tuple[Run, ...], np.ndarray]:
    """The runs and order of a window (O(window)), its first ``used`` samples left out."""
    order = current.order(rank, worker, index, int((spans[1] - spans[0]).sum()))
    if used:
        offsets = points(spans)
        keep = np.sort(order[used:])
        order = np.searchsorted(keep, order[used:])
        runs = current.runs(shift(from_points(offsets[keep]), start))
    order.setflags(write=False)
    return runs, order


def _record(world_size: int, num_workers: int, batch_size: int) -> PassRecord:
    return PassRecord(
        check_count(world_size, "world_size", minimum=1),
        max(1, check_count(num_workers, "num_workers")),
        check_count(batch_size, "batch_size", minimum=1),
    )
