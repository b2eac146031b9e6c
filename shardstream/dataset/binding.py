"""What ties a ``StreamingDataset`` to the ``shardstream.DataLoader`` over it: the
dataset's epoch (one owner, shareable with persistent workers) and the one object
through which a loader tells its dataset its batch size and workers, plans, saves and
loads states. See NOTE [ Exact resume through the DataLoader ] in loader.py.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from collections.abc import Mapping
from typing import Any, Protocol

from shardstream.plan import Plan
from shardstream.plan.state import ResumeState

__all__ = ["BoundDataset", "Epoch", "LoaderBinding", "LoaderSlot"]


class Epoch:
    """The dataset's epoch, held here only: a plain int, or a shared-memory cell that
    persistent DataLoader workers read, which ``set`` writes in the main process."""

    __slots__ = ("_cell", "_value")

    def __init__(self, value: int = 0) -> None:
        self._value, self._cell = value, None

    def get(self) -> int:
        return int(self._cell.value) if self._cell is not None else self._value

    def set(self, epoch: int) -> None:
        self._value = epoch
        if self._cell is not None:
            self._cell.value = epoch

    def share(self, cell: Any) -> None:
        """Read and write the epoch in ``cell`` (a shared ``multiprocessing`` value) from now on."""
        cell.value = self.get()
        self._cell = cell

    def __getstate__(self) -> tuple[int, Any]:
        # Shared memory crosses only into processes being started; a copy or a pickle
        # written elsewhere gets the epoch as a plain value.
        sharing = multiprocessing.context.get_spawning_popen() is not None
        return self.get(), self._cell if sharing else None

    def __setstate__(self, state: tuple[int, Any]) -> None:
        self._value, self._cell = state


class LoaderSlot:
    """The part of a dataset that the DataLoader bound to it sets: the epoch (its one
    owner), the loader's ``(batch size, workers)`` the dataset plans with, and a loaded
    state that the next iteration resumes from (forgotten once workers carry it)."""

    __slots__ = ("epoch", "resume", "shape")

    def __init__(self) -> None:
        self.epoch = Epoch()
        self.shape: tuple[int, int] | None = None
        self.resume: ResumeState | None = None


class BoundDataset(Protocol):
    """What a loader uses of the dataset it is bound to (a ``StreamingDataset``)."""

    @property
    def loader_slot(self) -> LoaderSlot: ...
    @property
    def epoch(self) -> int: ...
    def rank_and_world(self) -> tuple[int, int]: ...
    def make_plan(self, *, num_workers: int | None = None, consume: bool) -> Plan: ...
    def make_state(self, plan_state: dict[str, Any]) -> dict[str, Any]: ...
    def start_state(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class LoaderBinding:
    """A DataLoader's hold on its dataset: the only way a loader acts on it. The dataset
    plans with the bound batch size and workers, so that ``len()`` and the plan in the
    main process agree with the workers' plans (the dataset carries them to workers)."""

    def __init__(self, dataset: BoundDataset, *, batch_size: int | None, num_workers: int) -> None:
        self.dataset = dataset
        self.bind(batch_size=batch_size, num_workers=num_workers)

    def bind(self, *, batch_size: int | None, num_workers: int) -> None:
        """Make the loader's batch size and workers the dataset's (again before each
        iteration and load: another loader over the same dataset may have bound it since,
        and a loader's ``num_workers`` may have been changed)."""
        self.dataset.loader_slot.shape = (batch_size or 1, max(1, num_workers))

    def share_epoch(self, context: Any = None) -> None:
        """Let persistent workers follow ``set_epoch``: the epoch moves to shared memory."""
        self.dataset.loader_slot.epoch.share((context or multiprocessing).RawValue("q", self.dataset.epoch))

    def begin(self) -> Plan:
        """Before an iterator starts its workers: the plan they will follow (the main
        process's copy; the workers build the same one from the same inputs)."""
        self.dataset.rank_and_world()  # resolve here: torch.distributed lives in the main process
        return self.dataset.make_plan(consume=False)

    def started(self) -> None:
        """The iterator has started: its workers (or the in-process iterator) carry a
        loaded state now, so the dataset forgets it."""
        self.dataset.loader_slot.resume = None

    def plan(self, num_workers: int) -> Plan:
        """The plan of the epoch the next iteration plays with ``num_workers`` (for ``len()``)."""
        return self.dataset.make_plan(num_workers=max(1, num_workers), consume=False)

    def state(self, plan: Plan | None, steps: int) -> dict[str, Any]:
        """The state after ``steps`` batches of ``plan`` (the current iterator's), or the
        state before the next iteration if ``plan`` is not of the current epoch."""
        dataset = self.dataset
        if plan is not None and plan.of_epoch(dataset.epoch):
            return dataset.make_state(plan.state_dict(steps))
        return dataset.start_state()

    def load(self, state: Any) -> None:
        self.dataset.load_state_dict(state)
