"""Counts given by users (samples per shard, workers, shard sizes): one rule for the
library and the command line, which must not import the pack to check an argument."""

from __future__ import annotations

import operator

from shardstream.errors import UsageError, shown

__all__ = ["MAX_COUNT", "check_count"]

# The largest shard size or sample count accepted: what a signed 64-bit field (a tar or
# Parquet size, numpy's counts in the plan) holds; far above anything a shard can be.
MAX_COUNT = 2**63 - 1


def check_count(name: str, value: object) -> int:
    """``value`` as a count from 1 to ``MAX_COUNT`` (samples per shard, workers), or a UsageError."""
    number = _whole(value)
    if number is None:
        raise UsageError(f"{name} must be a positive integer, not {shown(value, 40)}")
    if number <= 0:
        raise UsageError(f"{name} must be a positive integer, not {number}")
    if number > MAX_COUNT:
        raise UsageError(f"{name} is too large: {shown(value, 40)} (at most {MAX_COUNT})")
    return number


def _whole(value: object) -> int | None:
    """An int from an int-like value (numpy's too), a whole float or decimal text; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        text = value.strip()
        # int() of thousands of digits is slow (and refused past 4300): any such count is too large
        return (MAX_COUNT + 1 if len(text) > 40 else int(text)) if text.isdecimal() else None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
