"""Integers given by users and read from states: one validator, ``check_int``, for the
library, the plan and the command line (which must not import the pack to check an
argument); ``parse_count`` on top of it also reads counts written as text or whole floats
(a user's count: the plan's ``check_count`` takes ints alone)."""

from __future__ import annotations

import numbers
import operator
from typing import Any

from shardstream.errors import ShardstreamError, UsageError, shown

# The largest shard size or sample count accepted: what a signed 64-bit field (a tar or
# Parquet size, numpy's counts in the plan) holds; far above anything a shard can be.
MAX_COUNT = 2**63 - 1


def check_int(
    value: object,
    name: str,
    *,
    minimum: int | None = 0,
    maximum: int | None = None,
    error: type[ShardstreamError] = UsageError,
    **where: Any,
) -> int:
    """``value`` as an int (numpy's integers too, never a bool) from ``minimum`` to
    ``maximum`` (``None``: unbounded), else ``error`` (a ``ShardstreamError`` subclass:
    the caller's layer decides, e.g. ``PlanError`` in the plan) with ``where`` (``url=``)."""
    if type(value) is not int:  # the common case skips the ABC check (a 100,000-shard manifest has 400,000)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise error(f"{name} must be an integer, not {shown(value, 40)}", **where)
        value = int(value)
    if minimum is not None and value < minimum:
        raise error(f"{name} must be at least {minimum}, not {shown(value, 40)}", **where)
    if maximum is not None and value > maximum:
        raise error(f"{name} is too large: {shown(value, 40)} (at most {maximum})", **where)
    return value


def parse_count(value: object, name: str) -> int:
    """``value`` as a count from 1 to ``MAX_COUNT`` (samples per shard, workers), or a UsageError."""
    number = _whole(value)
    if number is None:
        raise UsageError(f"{name} must be a positive integer, not {shown(value, 40)}")
    if number <= 0:
        raise UsageError(f"{name} must be a positive integer, not {number}")
    return check_int(number, name, minimum=1, maximum=MAX_COUNT)


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
