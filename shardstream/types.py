"""Small value types shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass

from shardstream.counts import check_int
from shardstream.errors import PlanError


@dataclass(frozen=True, slots=True)
class ByteRange:
    """The bytes ``[start, end)`` of one file."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"bad byte range [{self.start}, {self.end})")

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Topology:
    """Where this process stands: its rank among ``world_size`` and its DataLoader worker.

    ``num_workers`` counts DataLoader workers per rank; the main process reading with
    ``num_workers=0`` is worker 0 of 1.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise PlanError(f"rank {self.rank} is not in a world of size {self.world_size}")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise PlanError(f"worker {self.worker} is not one of {self.num_workers} workers")


@dataclass(frozen=True, slots=True)
class Shape:
    """What a plan is cut for: ``world_size`` ranks of ``num_workers`` DataLoader workers
    (0 is read as 1: the main process reads), each batch ``batch_size`` samples. A
    :class:`Topology` less the rank and worker, plus the batch."""

    world_size: int = 1
    num_workers: int = 1
    batch_size: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "world_size", check_int(self.world_size, "world_size", minimum=1, error=PlanError)
        )
        workers = check_int(self.num_workers, "num_workers", error=PlanError)
        object.__setattr__(self, "num_workers", max(1, workers))
        object.__setattr__(
            self, "batch_size", check_int(self.batch_size, "batch_size", minimum=1, error=PlanError)
        )
