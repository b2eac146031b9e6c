"""The epoch plan: which shards and samples every rank and DataLoader worker reads.

Pure: numpy only, no I/O, no torch. See DESIGN.md, "The epoch plan".

    plan = EpochPlan(shard_sizes, PlanConfig(seed=0), epoch=3, world_size=8, num_workers=4, batch_size=32)
    for window in plan.worker_windows(rank, worker): ...   # runs to read, and the order to yield
    state = plan.state_dict(steps)                          # after `steps` batches per rank
    plan = EpochPlan.resume(shard_sizes, config, state, world_size=16, num_workers=2, batch_size=32)
"""

from __future__ import annotations

from shardstream.plan.config import PlanConfig, Run, Window
from shardstream.plan.epoch import EpochPlan
from shardstream.plan.state import STATE_VERSION

__all__ = ["STATE_VERSION", "EpochPlan", "PlanConfig", "Run", "Window"]
