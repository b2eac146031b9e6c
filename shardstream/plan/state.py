"""The plan state: a small JSON-able dict that says how far an epoch got.

It holds the plan's parameters, a fingerprint of the dataset and one record per pass
(NOTE [ Passes ]): topology and batches taken per rank. Its size grows with the number
of resumes under a new topology, never with ranks, workers or samples.
"""

from __future__ import annotations

import numbers
import reprlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardstream.errors import StateError
from shardstream.manifest import counts_checksum
from shardstream.plan.config import PlanConfig
from shardstream.plan.passes import PassRecord

__all__ = ["STATE_VERSION", "make_state", "read_state"]

STATE_VERSION = 1

_RECORD_KEYS = ("world_size", "num_workers", "batch_size", "steps")
# Re-cutting a pass holds a few integers per rank x worker of it; more than this many
# workers is not a state any real run wrote.
_MAX_WORKERS = 1 << 22


def make_state(
    sizes: np.ndarray, config: PlanConfig, *, epoch: int, window: int, records: list[PassRecord]
) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "epoch": int(epoch),
        "seed": int(config.seed),
        "shuffle": bool(config.shuffle),
        "drop_last": bool(config.drop_last),
        "shuffle_window": int(window),
        "num_samples": int(sizes.sum()),
        "num_shards": int(sizes.size),
        "counts_checksum": counts_checksum(sizes.tolist()),
        "passes": [{k: int(getattr(r, k)) for k in _RECORD_KEYS} for r in records],
    }


def _integer(state: Mapping[str, Any], key: str, minimum: int | None = 0) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise StateError(f"plan state field {key!r} must be an integer, not {reprlib.repr(value)}")
    if minimum is not None and value < minimum:
        raise StateError(f"plan state field {key!r} must be at least {minimum}, not {value}")
    return int(value)


def _same(value: object, expected: object) -> bool:
    """``value == expected`` for a value of a state, which may be anything: the type is
    compared first, so an array or tensor never reaches ``==`` (an integer may be numpy's)."""
    if type(expected) is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) == expected
    return type(value) is type(expected) and value == expected


def _check_same(state: Mapping[str, Any], key: str, expected: object, what: str) -> None:
    if not _same(state.get(key), expected):
        raise StateError(
            f"the state was saved with {key}={reprlib.repr(state.get(key))}, this plan has {key}={expected!r}: {what}"
        )


def _records(passes: object) -> list[PassRecord]:
    if not isinstance(passes, list) or not passes:
        raise StateError("plan state field 'passes' must be a non-empty list")
    records = []
    for entry in passes:
        if not isinstance(entry, Mapping):
            raise StateError(f"plan state pass {reprlib.repr(entry)} is not a mapping")
        values = [_integer(entry, k, 0 if k == "steps" else 1) for k in _RECORD_KEYS]
        if values[0] * values[1] > _MAX_WORKERS:
            raise StateError(
                f"plan state pass {reprlib.repr(entry)} has more than {_MAX_WORKERS} workers in all"
            )
        records.append(PassRecord(*values))
    return records


def read_state(
    state: Mapping[str, Any], sizes: np.ndarray, config: PlanConfig, *, window: int
) -> tuple[int, list[PassRecord]]:
    """``(epoch, pass records)`` of a state, or ``StateError`` if it does not fit this
    dataset (shard counts) and these parameters."""
    if not isinstance(state, Mapping):
        raise StateError(f"a plan state is a mapping, not {type(state).__name__}")
    if not _same(state.get("version"), STATE_VERSION):
        raise StateError(
            f"unknown plan state version {reprlib.repr(state.get('version'))}; "
            f"this shardstream reads version {STATE_VERSION}"
        )
    checksum = counts_checksum(sizes.tolist())
    saved = {"counts_checksum": checksum, "num_shards": int(sizes.size), "num_samples": int(sizes.sum())}
    if not all(_same(state.get(key), expected) for key, expected in saved.items()):
        brief = {key: reprlib.repr(state.get(key)) for key in saved}
        raise StateError(
            f"the state is of another dataset: {brief['num_shards']} shards, "
            f"{brief['num_samples']} samples, shard counts checksum {brief['counts_checksum']}; "
            f"this one has {sizes.size} shards, {int(sizes.sum())} samples, checksum {checksum!r}"
        )
    _check_same(state, "seed", int(config.seed), "resume with the same seed")
    _check_same(state, "shuffle", bool(config.shuffle), "resume with the same shuffle setting")
    _check_same(state, "drop_last", bool(config.drop_last), "resume with the same drop_last")
    _check_same(state, "shuffle_window", int(window), "resume with the same shuffle window")
    return _integer(state, "epoch"), _records(state.get("passes"))
