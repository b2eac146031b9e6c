"""Kept as a public module path: worker slices and windows live in ``plan/windows.py``."""

from shardstream.plan.windows import RUNS_PER_SHARD, SliceLayout, lanes_for, round_robin, split_even

__all__ = ["RUNS_PER_SHARD", "SliceLayout", "lanes_for", "round_robin", "split_even"]
