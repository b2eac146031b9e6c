"""The epoch plan: which shards and samples every rank and DataLoader worker reads.

Pure: numpy only, no I/O, no torch. See DESIGN.md, "The epoch plan".

    plan = make_plan(shard_sizes, PlanConfig(seed=0), epoch=3, shape=Shape(8, 4, 32))
    for window in plan.worker_windows(rank, worker): ...   # runs to read, and the order to yield
    state = plan.state_dict(steps)                          # after `steps` batches per rank
    plan = make_plan(shard_sizes, config, state=state, shape=Shape(16, 2, 32))

``EpochPlan(shard_sizes, config, epoch=..., world_size=..., num_workers=..., batch_size=...)``
and ``EpochPlan.resume(...)`` make the same plans with the keywords of earlier releases.
Every kind of plan (plan/kinds.py) keeps the ``Plan`` protocol.
"""

from __future__ import annotations

from shardstream.plan.config import PlanConfig, Run, Window
from shardstream.plan.kinds import EpochPlan, Plan, PlanKind, make_plan, plan_kinds, register_plan_kind
from shardstream.plan.state import PLAN_STATE_VERSION
from shardstream.types import Shape

# The name of earlier releases: the version of a plan state (a dataset's state wraps one
# under its own, ``RESUME_VERSION``)
STATE_VERSION = PLAN_STATE_VERSION

__all__ = [
    "PLAN_STATE_VERSION",
    "STATE_VERSION",
    "EpochPlan",
    "Plan",
    "PlanConfig",
    "PlanKind",
    "Run",
    "Shape",
    "Window",
    "make_plan",
    "plan_kinds",
    "register_plan_kind",
]
