"""The plan's parameters and what a plan hands to a reader: runs of samples, windows."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from shardstream.counts import check_int
from shardstream.errors import PlanError, ShardstreamError

# NOTE [ Window size ]
# The default window holds DEFAULT_WINDOW_SHARDS mean-sized shards, exactly as in every
# release before: a resume state records its window and must match it, and the window
# decides the epoch's order, so a default that moved would refuse saved states and
# silently reorder existing datasets. It is not capped. A window's order is O(window)
# memory, but it is laid out lazily (``Window.lazy``), only after the sample counts of
# its shards were checked against their sidecars, so a manifest claiming 10^12 samples
# fails as a FormatError before anything of that size is allocated; an honest dataset
# gets the window it always had. ``MAX_WINDOW`` only refuses values no machine can hold
# (a 2^40-sample order is 8 TiB), so any window a real run ever used stays accepted.
DEFAULT_WINDOW_SHARDS = 4
MAX_WINDOW = 1 << 40

# NOTE [ Global window ]
# order="global" reads each segment of a rank's lanes once per window of its sequence
# (NOTE [ Lane groups ] in global_order.py), so its requests fall with the windows an
# epoch has; the local order's do not. Its default window is therefore longer where the
# samples are small: GLOBAL_WINDOW_SHARDS mean-sized shards where the dataset's mean
# sample (as stored) is under GLOBAL_SMALL_SAMPLE, no more samples than
# GLOBAL_WINDOW_BYTES hold at that size, never fewer than DEFAULT_WINDOW_SHARDS. Bigger
# samples keep DEFAULT_WINDOW_SHARDS: their reads are long already, so a longer window
# gains nothing, and it would make a short epoch one window that a worker fetches whole
# before its first sample.
# - The bytes are ``PlanConfig.dataset_bytes``, the manifest's total (the same integer on
#   every rank, so the window is too); StreamingDataset and MapDataset.sampler pass it. A
#   plan that is not told them (a ``ShardSampler`` without ``dataset_bytes``, a mixture)
#   keeps DEFAULT_WINDOW_SHARDS. Mixing does not change with the window (NOTE [ Default
#   lanes ]: a batch's mix is set by its lanes).
# - A worker holds what the local order's does where it can (``PlanConfig.hold_for``):
#   its Windows take whole windows of the sequence (NOTE [ Global order ]), as many as fit
#   in the local default, at least one. So a worker whose share of one window is more
#   holds that share, at most GLOBAL_WINDOW_BYTES, and the next one fetched beside it
#   (NOTE [ Read budget ]), and its first sample waits for it.
# - A state records its window: one saved under the earlier default (4 shards) is refused,
#   naming that window, and resumes with ``shuffle_window`` set to it.
# tools/bench_stream.py --only order measures the rates; docs/benchmarks.md records them.
GLOBAL_WINDOW_SHARDS = 16
GLOBAL_WINDOW_BYTES = 512 << 20
GLOBAL_SMALL_SAMPLE = 64 << 10

ORDERS = ("local", "global")
# Read lanes of order="global" when none are given (NOTE [ Default lanes ] in
# plan/global_order.py): DEFAULT_LANES, or more for a big global batch so that no lane
# gives a batch more than DEFAULT_RUN samples; a function of global_batch_size only,
# never of the topology, so the order is the same on every cluster.
DEFAULT_LANES = 64
DEFAULT_RUN = 2
# NOTE [ Most lanes ]
# An order="global" plan holds a few words per lane, and lanes grow with the global batch by
# default (NOTE [ Default lanes ]): a batch of 10**9 samples would be 5 * 10**8 lanes and
# gigabytes of plan before its first sample. Lanes stop at MAX_LANES, so the plan is O(1) in
# the batch size past it; a bigger batch reads runs of more than DEFAULT_RUN samples per lane,
# and read_lanes above it is refused.
MAX_LANES = 1 << 16


# Seeds are keys of 64 bits (plan/randomness.py): a larger one, or a negative one, would be
# another seed's order under another name, so they are refused.
MAX_SEED = (1 << 64) - 1


def check_global_batch(size: int, total: int) -> None:
    """``PlanError`` for a global batch larger than the epoch's ``total`` samples: every
    batch would hold repeats mostly (or, with drop_last, none would be whole), and laying
    one out would take memory in proportion to the batch, whatever the dataset."""
    if 0 < total < size:  # an empty epoch has no batch to lay out
        raise PlanError(
            f"global_batch_size={size} is more than the {total} samples of an epoch: "
            "give a global batch no larger than the epoch"
        )


def check_seed(seed: object, error: type[ShardstreamError], **where: str) -> int:
    """``seed`` as an int in ``[0, 2**64)``, else ``error`` (with ``where``: ``url=``)."""
    return check_int(seed, "seed", minimum=0, maximum=MAX_SEED, error=error, **where)


def check_count(value: object, name: str, *, minimum: int | None = 0) -> int:
    """``value`` as an int, or ``PlanError`` if it is not an integer >= ``minimum``: the
    one validator, ``counts.check_int``, raising the plan's error."""
    return check_int(value, name, minimum=minimum, error=PlanError)


def shard_sizes_array(shard_sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    """The sample count of each shard as int64, validated (no negatives, no fractions)."""
    sizes = np.asarray(shard_sizes)
    if sizes.ndim != 1 or (sizes.size and not np.issubdtype(sizes.dtype, np.integer)):
        raise PlanError("shard_sizes must be a flat sequence of integer sample counts")
    sizes = sizes.astype(np.int64, copy=True)
    negative = np.flatnonzero(sizes < 0)
    if negative.size:
        raise PlanError(
            f"shard number {int(negative[0])} has a negative sample count {int(sizes[negative[0]])}"
        )
    sizes.setflags(write=False)
    return sizes


def default_window(sizes: np.ndarray) -> int:
    """``DEFAULT_WINDOW_SHARDS`` times the mean sample count of a non-empty shard (>= 1)."""
    nonempty = int(np.count_nonzero(sizes))
    if nonempty == 0:
        return 1
    mean = -(-int(sizes.sum()) // nonempty)
    return DEFAULT_WINDOW_SHARDS * mean  # NOTE [ Window size ]: never capped


def global_window(sizes: np.ndarray, dataset_bytes: int) -> int:
    """order="global"'s default window (NOTE [ Global window ]): ``GLOBAL_WINDOW_SHARDS``
    mean-sized shards where the mean sample is under ``GLOBAL_SMALL_SAMPLE``, cut to the
    samples ``GLOBAL_WINDOW_BYTES`` hold at that size, never below :func:`default_window`."""
    local, dataset_bytes = default_window(sizes), int(dataset_bytes)
    samples = int(sizes.sum())
    if samples == 0 or dataset_bytes >= GLOBAL_SMALL_SAMPLE * samples:
        return local  # no samples, or big ones: their reads are long already
    longest = local * (GLOBAL_WINDOW_SHARDS // DEFAULT_WINDOW_SHARDS)
    return max(local, min(longest, GLOBAL_WINDOW_BYTES * samples // max(1, dataset_bytes)))


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """What a user chooses; the same knobs as ``torch.utils.data.DistributedSampler``.

    ``shuffle_window`` is the number of samples a worker holds for its in-window shuffle;
    ``None`` means four mean-sized shards (with ``order="global"`` and ``dataset_bytes``,
    the dataset's total bytes, up to sixteen: NOTE [ Global window ]). ``order="global"`` makes the epoch a sequence
    of global batches of ``global_batch_size`` read from ``read_lanes`` lanes (by default
    enough for runs of ``DEFAULT_RUN`` samples, at least ``DEFAULT_LANES``: NOTE
    [ Default lanes ]), the same on every world size dividing it (NOTE [ Global order ]);
    ``"local"`` (the default) cuts the epoch per rank and worker as always.
    """

    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    shuffle_window: int | None = None
    order: str = "local"
    global_batch_size: int | None = None
    read_lanes: int | None = None
    dataset_bytes: int | None = None

    def __post_init__(self) -> None:
        check_seed(self.seed, PlanError)
        self._check_order()
        if self.dataset_bytes is not None:  # a Python int: a numpy one would overflow in the window's product
            object.__setattr__(self, "dataset_bytes", check_count(self.dataset_bytes, "dataset_bytes"))
        if self.shuffle_window is not None:
            check_count(self.shuffle_window, "shuffle_window", minimum=1)
            if self.shuffle_window > MAX_WINDOW:
                raise PlanError(
                    f"shuffle_window must be at most {MAX_WINDOW} samples, not {self.shuffle_window}"
                )

    def _check_order(self) -> None:
        if self.order not in ORDERS:
            raise PlanError(f"order must be one of {ORDERS}, not {self.order!r}")
        if self.order == "local":
            for name in ("global_batch_size", "read_lanes"):
                if getattr(self, name) is not None:
                    raise PlanError(f"{name} is an option of order='global'; this plan has order='local'")
            return
        if self.global_batch_size is None:
            raise PlanError("order='global' needs a global_batch_size (samples per step over all ranks)")
        check_count(self.global_batch_size, "global_batch_size", minimum=1)
        if self.read_lanes is not None:
            check_count(self.read_lanes, "read_lanes", minimum=1)
            if self.read_lanes > MAX_LANES:
                raise PlanError(
                    f"read_lanes must be at most {MAX_LANES} (NOTE [ Most lanes ]), not {self.read_lanes}"
                )

    @property
    def is_global(self) -> bool:
        return self.order == "global"

    def rank_batch_size(self, world_size: int) -> int:
        """The plan's batch on each of ``world_size`` ranks: its part of a global batch
        (order="global", NOTE [ Global order ]), else 1."""
        return max(1, int(self.global_batch_size or 1) // world_size) if self.is_global else 1

    def window_for(self, sizes: np.ndarray) -> int:
        """The window in samples for a dataset of these shard sizes."""
        if self.shuffle_window is not None:
            return int(self.shuffle_window)
        if self.is_global and self.dataset_bytes is not None:
            return global_window(sizes, self.dataset_bytes)
        return default_window(sizes)

    def hold_for(self, sizes: np.ndarray) -> int:
        """The samples a worker's Window of order="global" holds at most, where one
        worker's share of a window is less: the window, or by default the local order's
        window (NOTE [ Global window ])."""
        if self.shuffle_window is not None:
            return int(self.shuffle_window)
        return default_window(sizes)


@dataclass(frozen=True, slots=True)
class Run:
    """Samples ``[start, stop)`` of shard number ``shard`` (manifest order): contiguous,
    so a reader fetches them with one ranged GET."""

    shard: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


class Window:
    """One shuffle window of a worker.

    ``runs`` are exactly the samples the window yields, in read order; ``order`` is the
    yield order, as indices into the concatenation of the runs' samples. ``shards`` are
    the shards it reads: a window made by :meth:`lazy` knows them before it lays out its
    runs and order (O(window) memory), so a reader checks those shards' sample counts
    against their sidecars first. ``known_runs`` are its runs where the plan knew them
    without laying anything out (O(runs)), else None. ``in_run_order``: the yield order
    is the runs' own (``shuffle=False``), so a reader may take the window in pieces
    (NOTE [ Unshuffled windows in pieces ] in dataset/budget.py).
    """

    __slots__ = ("_build", "_order", "_runs", "in_run_order", "known_runs", "shards")

    def __init__(self, runs: Sequence[Run], order: np.ndarray, *, in_run_order: bool = False) -> None:
        self._runs: tuple[Run, ...] | None = tuple(runs)
        self._order: np.ndarray | None = order
        self._build: Callable[[], tuple[tuple[Run, ...], np.ndarray]] | None = None
        self.shards: tuple[int, ...] = tuple(dict.fromkeys(run.shard for run in self._runs))
        self.known_runs: tuple[Run, ...] | None = self._runs
        self.in_run_order = in_run_order

    @classmethod
    def lazy(
        cls,
        shards: Sequence[int],
        build: Callable[[], tuple[tuple[Run, ...], np.ndarray]],
        runs: Sequence[Run] | None = None,
        *,
        in_run_order: bool = False,
    ) -> Window:
        """A window reading only ``shards``, whose ``(runs, order)`` ``build`` makes on first
        use; ``runs``: the runs ``build`` will give, where the plan has them already."""
        window = cls.__new__(cls)
        window._runs = window._order = None
        window._build = build
        window.shards = tuple(shards)
        window.known_runs = None if runs is None else tuple(runs)
        window.in_run_order = in_run_order
        return window

    def _made(self) -> tuple[tuple[Run, ...], np.ndarray]:
        if self._build is not None:
            self._runs, self._order = self._build()
            self._build = None
        return self._runs, self._order  # type: ignore[return-value]

    @property
    def runs(self) -> tuple[Run, ...]:
        return self._made()[0]

    @property
    def order(self) -> np.ndarray:
        return self._made()[1]

    def __repr__(self) -> str:
        return f"Window(shards={self.shards}, samples={len(self)})" if self._build is None else "Window(lazy)"

    def __len__(self) -> int:
        return len(self.order)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Window):
            return NotImplemented
        return self.runs == other.runs and np.array_equal(self.order, other.order)

    __hash__ = None  # type: ignore[assignment]  # holds an array

    def samples(self, chunk: int = 8192) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(shards, indices)`` of the window's samples in yield order, ``chunk`` at a
        time: the first ones come before the whole window is laid out (it may hold millions)."""
        if not self.runs:
            return
        shard = np.fromiter((r.shard for r in self.runs), dtype=np.int64, count=len(self.runs))
        start = np.fromiter((r.start for r in self.runs), dtype=np.int64, count=len(self.runs))
        length = np.fromiter((r.stop - r.start for r in self.runs), dtype=np.int64, count=len(self.runs))
        first = np.cumsum(length) - length
        for lo in range(0, len(self.order), chunk):
            positions = self.order[lo : lo + chunk]
            run = np.searchsorted(first, positions, side="right") - 1
            yield shard[run], start[run] + positions - first[run]
