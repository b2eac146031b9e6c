"""``LocalPlan``: which samples each rank and DataLoader worker reads in an order="local" epoch.

See DESIGN.md, "The epoch plan", NOTE [ Passes ] and NOTE [ Striped windows ].
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from shardstream.errors import PlanError, StateError
from shardstream.plan.base import PlanBase
from shardstream.plan.config import PlanConfig, Run, Window, check_count
from shardstream.plan.intervals import from_points, points, select, shift, total
from shardstream.plan.passes import Pass, PassInput, PassRecord, PassSetup, Remainder
from shardstream.plan.shards import ShardOrder
from shardstream.plan.state import make_state, read_state
from shardstream.plan.view import ShardView
from shardstream.plan.windows import lanes_for
from shardstream.types import Shape


class LocalPlan(PlanBase):
    """The plan of an order="local" epoch for every rank and worker (pure: no I/O, no torch).

    Every rank gets the same number of samples; ranks x workers see every sample of the
    epoch once (plus at most ``world_size - 1`` repeats, or with ``drop_last`` fewer);
    the same inputs give the same plan everywhere. Made by ``make_plan`` (plan/kinds.py).
    """

    def __init__(self, view: ShardView, config: PlanConfig, epoch: int, records: list[PassRecord]) -> None:
        last = records[-1]
        super().__init__(view, config, epoch, Shape(last.world_size, last.num_workers, last.batch_size))
        self._records = records
        self._window = config.window_for(view.window_sizes)
        shards = ShardOrder(view.sizes, shuffle=config.shuffle, seed=config.seed, epoch=epoch)
        setup = PassSetup(
            shards,
            config.seed,
            epoch,
            config.shuffle,
            self._window,
            lanes_for(self._window, view.window_sizes, config.shuffle),
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

    @classmethod
    def fresh(cls, view: ShardView, config: PlanConfig, epoch: int, shape: Shape) -> LocalPlan:
        """Epoch ``epoch`` from its start."""
        return cls(view, config, check_count(epoch, "epoch"), [_record(shape)])

    @classmethod
    def resume(cls, view: ShardView, config: PlanConfig, state: Mapping[str, Any], shape: Shape) -> LocalPlan:
        """The rest of the epoch a ``state_dict()`` stopped in, for this shape: the same
        pass continued if the shape is the same, else a new pass over what is left.
        ``StateError`` if the state is of another dataset, seed or version."""
        if not isinstance(config, PlanConfig):
            raise PlanError(f"config must be a PlanConfig, not {type(config).__name__}")
        record = _record(shape)
        epoch, records = read_state(
            view.order_state(state), view.sizes, config, window=config.window_for(view.window_sizes)
        )
        last = records[-1]
        if last.steps > 0 and not last.same_topology(record):
            return cls(view, config, epoch, [*records, record])  # a new pass over what is left
        plan = cls(view, config, epoch, records)
        if last.same_topology(record):
            return plan
        # Resuming at the start of a pass under another topology makes that pass anew (a
        # fresh epoch if it is the first); a pass with no batches at all is at its end.
        started = not sum(plan._pass.batches)
        return cls(view, config, epoch, [*records, record] if started else [*records[:-1], record])

    # -- what the plan is ------------------------------------------------------------------

    @property
    def shuffle_window(self) -> int:
        """The window in samples (the config's, or the default for these shards)."""
        return self._window

    def __repr__(self) -> str:
        return (
            f"LocalPlan(epoch={self.epoch}, world_size={self.world_size}, num_workers={self.num_workers}, "
            f"batch_size={self.batch_size}, samples_per_rank={self.samples_per_rank()}, pass={self._pass.index})"
        )

    def _left(self, worker: int) -> int:
        return int(self._pass.lengths[worker]) - self._used[worker]

    # -- what a worker reads ---------------------------------------------------------------

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
            in_run_order = not current.setup.shuffle
            known: tuple[Run, ...] | None = runs
            if skip and in_run_order:  # resumed part way: the runs of its rest, as build gives them
                known = current.runs(shift(select(spans, skip, total(spans)), start))
            elif skip:  # a shuffled window resumed part way lays its runs out again
                known = None
            shards = tuple(dict.fromkeys(run.shard for run in (runs if known is None else known)))
            yield Window.lazy(shards, build, known, in_run_order=in_run_order)

    # -- resume ----------------------------------------------------------------------------

    def _state(self, steps: int) -> dict[str, Any]:
        last = self._records[-1]
        done = PassRecord(last.world_size, last.num_workers, last.batch_size, last.steps + steps)
        records = [*self._records[:-1], done]
        return make_state(
            self._view.sizes, self._config, epoch=self._epoch, window=self._window, records=records
        )


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
    size = int((spans[1] - spans[0]).sum())
    order = current.order(rank, worker, index, size)
    if used:
        offsets = points(spans)
        # The kept samples ascending, and each one's place among them: a mask and its
        # running count, O(window) and sequential in memory (a binary search per sample
        # misses the cache at every step on a big window).
        kept = np.ones(size, dtype=bool)
        kept[order[:used]] = False
        keep = np.flatnonzero(kept)
        order = (np.cumsum(kept, dtype=np.int64) - 1)[order[used:]]
        runs = current.runs(shift(from_points(offsets[keep]), start))
    order.setflags(write=False)
    return runs, order


def _record(shape: Shape) -> PassRecord:
    return PassRecord(shape.world_size, shape.num_workers, shape.batch_size)
