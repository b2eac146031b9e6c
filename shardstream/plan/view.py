"""The shards a plan runs on: a dataset's own, or virtual ones made by a kind of plan.

A plan cuts an epoch over shard sample counts. Some kinds run it over shards of their
own making ("virtual shards"): a random mixture over segments of its streams' shards
(NOTE [ Mixtures ]), so that every guarantee of the order holds for them unchanged. A
``ShardView`` carries those counts, how their runs map back to real shards, and what a
state of such a plan records beside the order's own keys; the kind that made the view
checks those keys when a plan resumes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardstream.errors import StateError
from shardstream.plan.config import Run, Window, shard_sizes_array
from shardstream.plan.state import ORDER_KEYS, Key


@dataclass(frozen=True, eq=False)
class Segments:
    """One stream's samples of one epoch, in order: segment ``i`` is samples
    ``[start[i], stop[i])`` of mixture shard ``shard[i]``; a plan reads the segments as
    its shards ("virtual shards", NOTE [ Mixtures ])."""

    shard: np.ndarray
    start: np.ndarray
    stop: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        return self.stop - self.start

    def __len__(self) -> int:
        return int(self.shard.size)

    @staticmethod
    def concat(parts: Sequence[Segments]) -> Segments:
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return Segments(empty, empty, empty)
        return Segments(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("shard", "start", "stop")))

    def split(self, at: int) -> tuple[Segments, Segments]:
        """The first ``at`` samples, and the rest (a segment cut in two if need be)."""
        ends = np.cumsum(self.sizes)
        cut = int(np.searchsorted(ends, at, side="left"))  # the segment holding sample `at - 1`
        if cut >= len(self):
            return self, Segments.concat([])
        inside = int(at - (ends[cut] - self.sizes[cut]))  # samples of segment `cut` that go first
        middle = int(self.start[cut]) + inside
        head = Segments(self.shard[: cut + 1], self.start[: cut + 1], self.stop[: cut + 1].copy())
        head.stop[cut] = middle
        tail = Segments(self.shard[cut:], self.start[cut:].copy(), self.stop[cut:])
        tail.start[0] = middle
        return _nonempty(head), _nonempty(tail)

    def runs(self, runs: Iterable[Run]) -> tuple[Run, ...]:
        """Runs over the segments (``Run.shard`` a segment number) as runs of mixture shards."""
        shard, start = self.shard, self.start
        return tuple(
            Run(int(shard[r.shard]), int(start[r.shard]) + r.start, int(start[r.shard]) + r.stop)
            for r in runs
        )

    def shards_of(self, virtual: Iterable[int]) -> tuple[int, ...]:
        """The mixture shards of segment numbers, each once, in order."""
        return tuple(dict.fromkeys(int(self.shard[v]) for v in virtual))


def _nonempty(segments: Segments) -> Segments:
    keep = segments.stop > segments.start
    return Segments(segments.shard[keep], segments.start[keep], segments.stop[keep])


def _mapped_window(segments: Segments, window: Window) -> tuple[tuple[Run, ...], np.ndarray]:
    """The runs (over real shards) and order of a window over segments."""
    return segments.runs(window.runs), window.order


@dataclass(frozen=True, eq=False)
class ShardView:
    """The shards a plan runs on: ``sizes`` their sample counts; ``segments`` maps them to
    real shards (``None``: they are real); ``state`` the keys its plan's states carry
    beside the order's (checked by the kind that made the view, on resume); ``quotas``
    the samples each stream gives an epoch (one stream: all of them)."""

    sizes: np.ndarray = field(repr=False)
    segments: Segments | None = None
    state: Mapping[str, Any] = field(default_factory=dict)
    quotas: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", shard_sizes_array(self.sizes))
        if not self.quotas:
            object.__setattr__(self, "quotas", (int(self.sizes.sum()),))

    @classmethod
    def of(cls, source: object) -> ShardView:
        """A dataset's own shards (their sample counts, checked), or a view as it is."""
        if isinstance(source, ShardView):
            return source
        return cls(shard_sizes_array(source))  # type: ignore[arg-type]  # it refuses what is not counts

    def windows(self, windows: Iterator[Window]) -> Iterator[Window]:
        """Windows over these shards as windows over real shards."""
        segments = self.segments
        if segments is None:
            return windows
        return (
            Window.lazy(segments.shards_of(w.shards), functools.partial(_mapped_window, segments, w))
            for w in windows
        )

    def samples(self, samples: Iterator[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """``(shard, index)`` over these shards as ``(shard, index)`` of real shards."""
        if self.segments is None:
            return samples
        shard, start = self.segments.shard.tolist(), self.segments.start.tolist()
        return ((shard[virtual], start[virtual] + index) for virtual, index in samples)

    def order_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` less this view's keys: what the order's plan reads. ``StateError`` if it
        carries keys of another kind (a mixture's in a dataset's plan, or the reverse)."""
        if not isinstance(state, Mapping):
            raise StateError(f"a plan state is a mapping, not {type(state).__name__}")
        foreign = [key for key in state if key not in ORDER_KEYS and key not in self.state]
        if Key.STREAMS in foreign:
            raise StateError(
                "the state is of a mixture of datasets: it resumes a mixture of the same streams"
            )
        if foreign:
            raise StateError(
                f"the state is of another kind of plan (it has {foreign[0]!r}): it resumes that kind"
            )
        missing = [key for key in self.state if key not in state]
        if missing:
            raise StateError(f"the state has no {missing[0]!r}: it is of a plan of another kind")
        return {key: value for key, value in state.items() if key not in self.state}

    def with_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The order's ``state`` with this view's keys."""
        return {**state, **self.state}
