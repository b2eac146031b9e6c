"""Small value types shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass

from shardstream.errors import PlanError

__all__ = ["ByteRange", "Topology"]


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
