"""Where this process stands: its rank, the world size, its DataLoader worker.

This is the ONE place that asks torch.distributed, the environment and
``torch.utils.data.get_worker_info()``; every detector is a parameter, so tests (and
odd launchers) inject their own, as torch's ``WorkerInfo`` and LitData's
``_WorkerEnv.detect(get_worker_info_fn=...)`` allow. torch is imported only when a
default detector runs, so ``import shardstream`` stays light.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shardstream.errors import UsageError
from shardstream.types import Topology

__all__ = [
    "Detector",
    "DistDetector",
    "WorkerDetector",
    "detect",
    "detect_rank",
    "detect_worker",
    "torch_distributed",
]

# Returns (rank, world_size) when a process group is initialised, else None.
DistDetector = Callable[[], "tuple[int, int] | None"]
# Returns torch's WorkerInfo (anything with ``id`` and ``num_workers``) or None.
WorkerDetector = Callable[[], Any]


def torch_distributed() -> tuple[int, int] | None:
    """``(rank, world_size)`` of the default process group, or None if there is none."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _torch_worker_info() -> Any:
    from torch.utils.data import get_worker_info

    return get_worker_info()


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"environment variable {name}={text!r} is not an integer") from None


def detect_rank(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    dist_fn: DistDetector = torch_distributed,
    environ: Mapping[str, str] | None = None,
) -> tuple[int, int]:
    """``(rank, world_size)``: explicit values first, then torch.distributed, then
    ``RANK``/``WORLD_SIZE``, else ``(0, 1)``; each of the two is resolved on its own,
    as ``DistributedSampler`` does with ``rank`` and ``num_replicas``."""
    if rank is None or world_size is None:
        found = dist_fn()
        if found is None:
            env = os.environ if environ is None else environ
            found = (_env_int(env, "RANK") or 0, _env_int(env, "WORLD_SIZE") or 1)
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in a world of size {world_size} (num_replicas)")
    return rank, world_size


def detect_worker(*, worker_info_fn: WorkerDetector = _torch_worker_info) -> tuple[int, int]:
    """``(worker, num_workers)`` of this DataLoader worker; ``(0, 1)`` in the main process."""
    info = worker_info_fn()
    if info is None:
        return 0, 1
    return int(info.id), int(info.num_workers)


def detect(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    dist_fn: DistDetector = torch_distributed,
    environ: Mapping[str, str] | None = None,
    worker_info_fn: WorkerDetector = _torch_worker_info,
) -> Topology:
    """The whole :class:`~shardstream.types.Topology` of this process."""
    rank, world_size = detect_rank(rank=rank, world_size=world_size, dist_fn=dist_fn, environ=environ)
    worker, num_workers = detect_worker(worker_info_fn=worker_info_fn)
    return Topology(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)


@dataclass(frozen=True, slots=True)
class Detector:
    """The detectors of one consumer (a ``StreamingDataset(topology=...)``), kept
    together and picklable (module-level functions), so DataLoader workers detect with
    the same ones. ``environ`` ``None`` reads ``os.environ`` when it detects."""

    dist_fn: DistDetector = torch_distributed
    environ: Mapping[str, str] | None = None
    worker_info_fn: WorkerDetector = _torch_worker_info

    def rank(self, *, rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
        return detect_rank(rank=rank, world_size=world_size, dist_fn=self.dist_fn, environ=self.environ)

    def worker(self) -> tuple[int, int]:
        return detect_worker(worker_info_fn=self.worker_info_fn)

    def in_worker(self) -> bool:
        """Whether this process is a DataLoader worker (not the main process)."""
        return self.worker_info_fn() is not None

    def __call__(self, *, rank: int | None = None, world_size: int | None = None) -> Topology:
        return detect(
            rank=rank,
            world_size=world_size,
            dist_fn=self.dist_fn,
            environ=self.environ,
            worker_info_fn=self.worker_info_fn,
        )
