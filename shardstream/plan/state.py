"""Resume states: one frozen type, :class:`ResumeState`, and the named keys of its wire
format, shared by the sampler, the dataset and the DataLoader.

A state on the wire is a small JSON-able dict with a version (users pickle, torch.save
or json.dump it). Its core is the plan state: the plan's parameters, a fingerprint of
the shard counts and one record per pass (NOTE [ Passes ]): topology and batches taken
per rank. Its size grows with the number of resumes under a new topology, never with
ranks, workers or samples. A ``ShardSampler`` state is a plan state; a dataset's (and
DataLoader's) wraps one with the epoch, the URL and the dataset's fingerprint.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.counts import check_int
from shardstream.errors import StateError, shown
from shardstream.manifest import counts_checksum
from shardstream.plan.config import PlanConfig
from shardstream.plan.passes import PassRecord

# Two wire formats, two versions: a plan state's (and so a ShardSampler's), and the
# ResumeState a dataset (and DataLoader) wraps around one
PLAN_STATE_VERSION = 1
RESUME_VERSION = 1
# of order="global"'s sequence: 2 took its chunks in a nested order (NOTE [ Nested chunk
# order ]); 3 laid the chunks of a lane group together; 4 lays a lane across a shard edge
# with the groups on both sides (NOTE [ Lane groups ]); states of 1 carry no such field;
# the earlier ones resume a sequence this one no longer makes
GLOBAL_SEQUENCE = 4
# of a mixture whose streams' many passes are laid in stretches (NOTE [ Stretched passes ]):
# its epochs take other orders than the listing did, so its states carry this; a mixture
# that lists every pass writes none (the layout of 1), as before
STRETCHED_PASSES = 2


class Key:
    """The keys of a state on the wire; nothing else in shardstream spells them."""

    VERSION = "version"
    EPOCH = "epoch"
    SEED = "seed"
    SHUFFLE = "shuffle"
    DROP_LAST = "drop_last"
    SHUFFLE_WINDOW = "shuffle_window"
    NUM_SAMPLES = "num_samples"
    NUM_SHARDS = "num_shards"
    COUNTS_CHECKSUM = "counts_checksum"
    PASSES = "passes"
    # order="global" (NOTE [ Global order ]): a local state has none of these
    ORDER = "order"
    GLOBAL_BATCH_SIZE = "global_batch_size"
    READ_LANES = "read_lanes"
    GLOBAL_BATCHES = "global_batches"
    GLOBAL_SEQUENCE = "global_sequence"
    # a mixture (NOTE [ Mixtures ]): the inner plan's state with these
    MIX = "mix"
    STREAMS = "streams"
    STREAM_PASSES = "stream_passes"
    # token sequences (plan/tokens.py): how the sequences a state counts were made
    SEQUENCES = "sequences"
    SEQ_LEN = "seq_len"
    PACKING = "packing"
    LONG_DOCS = "long_docs"
    TOKENIZER = "tokenizer"
    # a stream of a mixture's state (with NUM_SHARDS and NUM_SAMPLES)
    NAME = "name"
    FINGERPRINT = "fingerprint"
    QUOTA = "quota"
    # a pass record
    WORLD_SIZE = "world_size"
    NUM_WORKERS = "num_workers"
    BATCH_SIZE = "batch_size"
    STEPS = "steps"
    # a dataset's state around the plan state
    URL = "url"
    DATASET_FINGERPRINT = "dataset_fingerprint"
    PLAN = "plan"


# The keys of an order's state (local or global); a kind of plan adds its own beside them
# (``ShardView.state``), and a plan refuses a state that carries keys of another kind.
ORDER_KEYS = frozenset(
    (
        Key.VERSION, Key.EPOCH, Key.SEED, Key.SHUFFLE, Key.DROP_LAST, Key.SHUFFLE_WINDOW, Key.NUM_SAMPLES,
        Key.NUM_SHARDS, Key.COUNTS_CHECKSUM, Key.PASSES, Key.ORDER, Key.GLOBAL_BATCH_SIZE, Key.READ_LANES,
        Key.GLOBAL_BATCHES, Key.GLOBAL_SEQUENCE,
    )
)  # fmt: skip
_RECORD_KEYS = (Key.WORLD_SIZE, Key.NUM_WORKERS, Key.BATCH_SIZE, Key.STEPS)
# An epoch gets a pass each time it is resumed under another topology (NOTE [ Passes ]);
# each pass is replayed when a state loads, so a state of more is refused unread.
MAX_PASSES = 4096
# Re-cutting a pass holds a few integers per rank x worker of it; more than this many
# workers is not a state any real run wrote.
_MAX_WORKERS = 1 << 22


def same_epoch(saved: object, epoch: int) -> bool:
    """Whether an epoch read from a state (which may be anything) is ``epoch``: the one
    comparison of epochs, for the sampler, the dataset and the loader."""
    return _same(saved, int(epoch))


@dataclass(frozen=True, slots=True)
class ResumeState:
    """Where an epoch stopped: ``plan`` is its plan state (checked against the shards and
    parameters when a plan resumes from it); ``url`` and ``dataset_fingerprint`` say of
    which dataset, for a dataset's state (``None`` in a sampler's)."""

    epoch: Any  # an int once a plan accepted the state; as given before (NOTE in from_plan)
    plan: Mapping[str, Any]
    url: str | None = None
    dataset_fingerprint: object = None  # a str, once written by shardstream

    def of_epoch(self, epoch: int) -> bool:
        return same_epoch(self.epoch, epoch)

    @classmethod
    def from_plan(cls, state: object) -> ResumeState:
        """A ``ShardSampler`` state (a plan state). Its fields are checked when a plan
        resumes from it, in the plan's order, so only its shape is checked here."""
        if not isinstance(state, Mapping) or isinstance(state.get(Key.EPOCH), bool):
            raise StateError("a ShardSampler state is a mapping with an integer 'epoch'")
        return cls(epoch=state.get(Key.EPOCH, -1), plan=dict(state))

    @classmethod
    def read(cls, state: object, *, url: str) -> ResumeState:
        """A dataset's (or DataLoader's) state, its shape checked; ``StateError`` if not."""
        version = state.get(Key.VERSION) if isinstance(state, Mapping) else None
        if not isinstance(state, Mapping) or not _same(version, RESUME_VERSION):
            raise StateError(f"unknown state version {shown(version)} (expected {RESUME_VERSION})", url=url)
        epoch, plan = state.get(Key.EPOCH), state.get(Key.PLAN)
        if (
            isinstance(epoch, bool)
            or not isinstance(epoch, int)
            or epoch < 0
            or not isinstance(plan, Mapping)
        ):
            raise StateError("state needs an integer 'epoch' and a 'plan' mapping", url=url)
        plan_epoch = plan.get(Key.EPOCH, epoch)
        if type(plan_epoch) is not int or plan_epoch != epoch:
            raise StateError(f"state of epoch {epoch} holds a plan of epoch {shown(plan_epoch)}", url=url)
        saved = state.get(Key.DATASET_FINGERPRINT)
        return cls(epoch=epoch, plan=dict(plan), url=url, dataset_fingerprint=saved)

    def to_dict(self) -> dict[str, Any]:
        """The dataset's wire format (JSON-able)."""
        return {
            Key.VERSION: RESUME_VERSION,
            Key.EPOCH: self.epoch,
            Key.URL: self.url,
            Key.DATASET_FINGERPRINT: self.dataset_fingerprint,
            Key.PLAN: dict(self.plan),
        }


def make_state(
    sizes: np.ndarray, config: PlanConfig, *, epoch: int, window: int, records: list[PassRecord]
) -> dict[str, Any]:
    """The plan state (wire format) of these shard sizes, parameters and passes."""
    return {
        Key.VERSION: PLAN_STATE_VERSION,
        Key.EPOCH: int(epoch),
        Key.SEED: int(config.seed),
        Key.SHUFFLE: bool(config.shuffle),
        Key.DROP_LAST: bool(config.drop_last),
        Key.SHUFFLE_WINDOW: int(window),
        Key.NUM_SAMPLES: int(sizes.sum()),
        Key.NUM_SHARDS: int(sizes.size),
        Key.COUNTS_CHECKSUM: counts_checksum(sizes.tolist()),
        Key.PASSES: [{k: int(getattr(r, k)) for k in _RECORD_KEYS} for r in records],
    }


def _integer(state: Mapping[str, Any], key: str, minimum: int | None = 0) -> int:
    return check_int(state.get(key), f"plan state field {key!r}", minimum=minimum, error=StateError)


def _same(value: object, expected: object) -> bool:
    """``value == expected`` for a value of a state, which may be anything: the type is
    compared first, so an array or tensor never reaches ``==`` (an integer may be numpy's)."""
    if type(expected) is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) == expected
    return type(value) is type(expected) and value == expected


def _check_same(state: Mapping[str, Any], key: str, expected: object, what: str) -> None:
    if not _same(state.get(key), expected):
        raise StateError(
            f"the state was saved with {key}={shown(state.get(key))}, this plan has {key}={expected!r}: {what}"
        )


def _records(passes: object) -> list[PassRecord]:
    if not isinstance(passes, list) or not passes:
        raise StateError("plan state field 'passes' must be a non-empty list")
    if len(passes) > MAX_PASSES:  # before any of them is read: a hostile state is refused at once
        raise StateError(
            f"plan state has {len(passes)} passes; a run resumed under a new topology at most "
            f"{MAX_PASSES} times in one epoch writes no more"
        )
    records = []
    for entry in passes:
        if not isinstance(entry, Mapping):
            raise StateError(f"plan state pass {shown(entry)} is not a mapping")
        values = [_integer(entry, k, 0 if k == Key.STEPS else 1) for k in _RECORD_KEYS]
        if values[0] * values[1] > _MAX_WORKERS:
            raise StateError(f"plan state pass {shown(entry)} has more than {_MAX_WORKERS} workers in all")
        records.append(PassRecord(*values))
    return records


def read_state(
    state: Mapping[str, Any], sizes: np.ndarray, config: PlanConfig, *, window: int
) -> tuple[int, list[PassRecord]]:
    """``(epoch, pass records)`` of a plan state, or ``StateError`` if it does not fit
    this dataset (shard counts) and these parameters."""
    _check_plan(state, sizes, config, window=window)
    return _integer(state, Key.EPOCH), _records(state.get(Key.PASSES))


def make_global_state(
    sizes: np.ndarray, config: PlanConfig, *, epoch: int, window: int, lanes: int, taken: int
) -> dict[str, Any]:
    """The plan state of order="global": the local state's parameters (no passes), the
    global batch size, the lanes and the number of global batches taken."""
    state = make_state(sizes, config, epoch=epoch, window=window, records=[])
    del state[Key.PASSES]
    state[Key.ORDER] = "global"
    state[Key.GLOBAL_BATCH_SIZE] = int(config.global_batch_size or 0)
    state[Key.READ_LANES] = int(lanes)
    state[Key.GLOBAL_BATCHES] = int(taken)
    state[Key.GLOBAL_SEQUENCE] = GLOBAL_SEQUENCE
    return state


def read_global_state(
    state: Mapping[str, Any], sizes: np.ndarray, config: PlanConfig, *, window: int, lanes: int
) -> tuple[int, int]:
    """``(epoch, global batches taken)`` of an order="global" plan state, or ``StateError``."""
    _check_plan(state, sizes, config, window=window)
    if not _same(state.get(Key.GLOBAL_SEQUENCE, 1), GLOBAL_SEQUENCE):
        raise StateError(
            f"the state is of order='global' sequence {shown(state.get(Key.GLOBAL_SEQUENCE, 1))}, "
            f"this shardstream makes sequence {GLOBAL_SEQUENCE} (its batches take their chunks of "
            "a lane in another order and place, NOTE [ Nested chunk order ] and [ Lane groups ]): the "
            "rest of that epoch is not "
            "this one's; resume it with the shardstream that saved it, or start the epoch again"
        )
    _check_same(
        state,
        Key.GLOBAL_BATCH_SIZE,
        int(config.global_batch_size or 0),
        "resume with the same global_batch_size",
    )
    _check_same(state, Key.READ_LANES, int(lanes), "resume with the same read_lanes")
    return _integer(state, Key.EPOCH), _integer(state, Key.GLOBAL_BATCHES)


def _check_plan(state: Mapping[str, Any], sizes: np.ndarray, config: PlanConfig, *, window: int) -> None:
    """What every plan state must match: version, dataset, order and parameters."""
    if not isinstance(state, Mapping):
        raise StateError(f"a plan state is a mapping, not {type(state).__name__}")
    if not _same(state.get(Key.VERSION), PLAN_STATE_VERSION):
        raise StateError(
            f"unknown plan state version {shown(state.get(Key.VERSION))}; "
            f"this shardstream reads version {PLAN_STATE_VERSION}"
        )
    if Key.STREAMS in state:
        raise StateError("the state is of a mixture of datasets: it resumes a mixture of the same streams")
    checksum = counts_checksum(sizes.tolist())
    saved = {
        Key.COUNTS_CHECKSUM: checksum,
        Key.NUM_SHARDS: int(sizes.size),
        Key.NUM_SAMPLES: int(sizes.sum()),
    }
    if not all(_same(state.get(key), expected) for key, expected in saved.items()):
        brief = {key: shown(state.get(key)) for key in saved}
        raise StateError(
            f"the state is of another dataset: {brief[Key.NUM_SHARDS]} shards, "
            f"{brief[Key.NUM_SAMPLES]} samples, shard counts checksum {brief[Key.COUNTS_CHECKSUM]}; "
            f"this one has {sizes.size} shards, {int(sizes.sum())} samples, checksum {checksum!r}"
        )
    order = state.get(Key.ORDER, "local")  # states written before order="global" are local
    if not _same(order, config.order):
        raise StateError(
            f"the state was saved with order={shown(order)}, this plan has order={config.order!r}: "
            "a state resumes only the order it was saved in"
        )
    _check_same(state, Key.SEED, int(config.seed), "resume with the same seed")
    _check_same(state, Key.SHUFFLE, bool(config.shuffle), "resume with the same shuffle setting")
    _check_same(state, Key.DROP_LAST, bool(config.drop_last), "resume with the same drop_last")
    _check_same(  # a default window that changed (NOTE [ Global window ]) is resumed by naming it
        state,
        Key.SHUFFLE_WINDOW,
        int(window),
        f"resume with the same shuffle window (shuffle_window={shown(state.get(Key.SHUFFLE_WINDOW))})",
    )
