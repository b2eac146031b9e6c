"""The plan of each order over a ``ShardView``: what a kind that runs on shards of its own
(a random mixture's segments, a token dataset's sequences) makes its plans with."""

from __future__ import annotations

from shardstream.plan.batches import GlobalPlan
from shardstream.plan.config import PlanConfig
from shardstream.plan.epoch import LocalPlan

_ORDER_PLANS: dict[str, type[LocalPlan] | type[GlobalPlan]] = {"local": LocalPlan, "global": GlobalPlan}


def order_plan(config: PlanConfig) -> type[LocalPlan] | type[GlobalPlan]:
    """The plan class of ``config.order``."""
    return _ORDER_PLANS[config.order]
