"""``ShardSampler``: the epoch plan as a map-style sampler with shard locality.

A drop-in for ``torch.utils.data.DistributedSampler``, with the same knobs and the same
guarantees (every index once per epoch across ranks, equal counts per rank, padding by
repetition or ``drop_last``), but the indices a rank gets are contiguous runs of shards
shuffled inside windows (DESIGN.md, "The epoch plan"), and the order is computed lazily:
no ``randperm(N)``, so a 10^10-sample epoch starts at once. Over a mixture (a
``Mixture`` or a list of ``StreamSpec`` in place of the shard sizes) it mixes the streams
as ``StreamingDataset`` does (NOTE [ Mixtures ]), indexing their ``ConcatDataset``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from shardstream.errors import StateError
from shardstream.plan import Plan, PlanConfig, Shape, make_plan
from shardstream.plan.config import check_count, shard_sizes_array
from shardstream.plan.mixture import Mixture, StreamSpec
from shardstream.plan.state import ResumeState
from shardstream.topology import detect_rank

__all__ = ["ShardSampler"]

# The plan's options a sampler takes by keyword: its config's, besides DistributedSampler's.
_PLAN_OPTIONS = frozenset(f.name for f in dataclasses.fields(PlanConfig)) - {"shuffle", "seed", "drop_last"}


class ShardSampler(Sampler[int]):
    """Global sample indices for this rank, in the order of the epoch plan.

    ``shard_sizes`` is the sample count of each shard in manifest order; index ``i`` of
    the dataset is sample ``i - offset[shard]`` of the shard whose prefix-sum range holds
    it. ``num_replicas`` and ``rank`` default to torch.distributed, then to ``RANK`` and
    ``WORLD_SIZE``, then to 1 and 0. Call ``set_epoch(epoch)`` before each epoch.

    ``state_dict(num_consumed)`` and ``load_state_dict(state)`` resume an epoch exactly
    where it stopped, also under another number of ranks. A sampler knows only shard
    sizes, so its states are checked against those (and the plan's parameters), not
    against a dataset fingerprint as ``StreamingDataset`` states are: a state of another
    dataset with the same shard sizes loads. Keep it with the dataset it belongs to.

    ``order="global"`` with ``global_batch_size`` (and optionally ``read_lanes``) gives the
    same global batches on every ``num_replicas`` dividing it (NOTE [ Global order ]):
    batch this sampler's indices by ``global_batch_size // num_replicas``, and count
    ``num_consumed`` in whole such batches. ``dataset_bytes`` (the shards' total bytes, a
    manifest's ``num_bytes``) sizes that order's default window as ``StreamingDataset``
    sizes it (NOTE [ Global window ]): pass it for the same batches as the dataset's;
    without it the default window is four mean-sized shards, as a mixture's always is.

    A ``Mixture`` (or a list of ``StreamSpec``, mixed with ``mix="random"``) in place of
    ``shard_sizes`` mixes its streams, each its quota per epoch, with the mixture's ``mix``
    (NOTE [ Mixtures ], NOTE [ Composed batches ]): index ``i`` is sample
    ``i - mixture.sample_offsets[s]`` of stream ``s``, the indexing of
    ``ConcatDataset([stream_0, stream_1, ...])``; its states name the streams they fit.
    """

    def __init__(
        self,
        shard_sizes: Sequence[int] | Mixture | Sequence[StreamSpec],
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        **plan: Any,
    ) -> None:
        """``plan``: the plan's other options by their ``PlanConfig`` names (``shuffle_window``,
        ``order``, ``global_batch_size``, ``read_lanes``, ``dataset_bytes``)."""
        super().__init__()
        for name in plan:
            if name not in _PLAN_OPTIONS:
                raise TypeError(f"ShardSampler() got an unexpected keyword argument {name!r}")
        self.rank, self.num_replicas = detect_rank(rank=rank, world_size=num_replicas)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), seed, bool(drop_last)
        self.config = PlanConfig(shuffle=self.shuffle, seed=seed, drop_last=self.drop_last, **plan)
        # The plan's batch: this rank's part of a global batch, or single indices.
        self._batch = self.config.rank_batch_size(self.num_replicas)
        self.mixture, self.shard_sizes = _mixture_or_sizes(shard_sizes)
        # a mixture's shards are its streams' shards in order: these are ConcatDataset indices
        self.offsets = np.cumsum(self.shard_sizes) - self.shard_sizes
        self.epoch = 0
        self._resume: ResumeState | None = None  # a loaded state for the next __iter__
        self._next: Plan | None = None  # the plan of the next __iter__, once built
        self._active: Plan | None = None  # the plan the latest __iter__ follows

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next iteration on (a loaded state of the
        same epoch stays in force)."""
        self.epoch = check_count(epoch, "epoch")
        if self._active is not None and not self._active.of_epoch(self.epoch):
            self._active = None
        if self._next is not None and not self._next.of_epoch(self.epoch):
            self._next = None
        if self._resume is not None and not self._resume.of_epoch(self.epoch):
            self._resume, self._next = None, None

    def plan(self) -> Plan:
        """The plan the next iteration follows: resumed from a loaded state, or fresh."""
        if self._next is None:
            shape = Shape(self.num_replicas, 1, self._batch)
            source = self.mixture if self.mixture is not None else self.shard_sizes
            if self._resume is not None:
                self._next = make_plan(source, self.config, state=self._resume.plan, shape=shape)
            else:
                self._next = make_plan(source, self.config, epoch=self.epoch, shape=shape)
        return self._next

    @property
    def num_samples(self) -> int:
        """Indices this rank gets in the current (or next) iteration, as DistributedSampler's."""
        plan = self._active if self._active is not None else self.plan()
        return plan.samples_per_rank()

    @property
    def total_size(self) -> int:
        """Indices all ranks get together (padding included), as DistributedSampler's."""
        return self.num_samples * self.num_replicas

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        plan = self.plan()
        self._active = plan
        if self._resume is not None:  # a loaded state is used once
            self._resume, self._next = None, None
        return self._indices(plan)

    def _indices(self, plan: Plan) -> Iterator[int]:
        for window in plan.worker_windows(self.rank, 0):
            for shards, indices in window.samples():
                yield from (self.offsets[shards] + indices).tolist()

    def state_dict(self, num_consumed: int = 0) -> dict[str, Any]:
        """The state after this rank consumed ``num_consumed`` indices of the current
        iteration (of the next one, before it starts); JSON-serialisable."""
        plan = self._active if self._active is not None else self.plan()
        num_consumed = check_count(num_consumed, "num_consumed")
        if num_consumed % self._batch:
            raise StateError(
                f"num_consumed={num_consumed} is not a whole number of this rank's batches of "
                f"{self._batch} (order='global': global_batch_size // num_replicas)"
            )
        return plan.state_dict(num_consumed // self._batch)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``: the next iteration yields what was not consumed
        (re-cut over this world size if it changed). ``StateError`` if it does not fit."""
        resume = ResumeState.from_plan(state)
        previous = (self.epoch, self._resume, self._next, self._active)
        self._resume, self._next, self._active = resume, None, None
        try:
            self.epoch = self.plan().epoch  # validate now: the plan checks the epoch too
        except StateError:
            self.epoch, self._resume, self._next, self._active = previous
            raise


def _mixture_or_sizes(
    given: Sequence[int] | Mixture | Sequence[StreamSpec],
) -> tuple[Mixture | None, np.ndarray]:
    """The mixture a sampler was given in place of shard sizes and its shard sizes, or
    ``None`` and the shard sizes given."""
    if isinstance(given, Mixture):
        return given, given.sizes
    if isinstance(given, Sequence) and len(given) and isinstance(given[0], StreamSpec):
        mixture = Mixture(given)  # type: ignore[arg-type]  # it checks that every item is a StreamSpec
        return mixture, mixture.sizes
    return None, shard_sizes_array(np.asarray(given))
