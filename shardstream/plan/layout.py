"""Kept as a public module path: worker slices and windows live in ``plan/windows.py``."""

from shardstream.plan.windows import (
    RUNS_PER_SHARD as RUNS_PER_SHARD,
)
from shardstream.plan.windows import (
    SliceLayout as SliceLayout,
)
from shardstream.plan.windows import (
    lanes_for as lanes_for,
)
from shardstream.plan.windows import (
    round_robin as round_robin,
)
from shardstream.plan.windows import (
    split_even as split_even,
)
