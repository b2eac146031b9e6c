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
from typing import Any, Protocol

import numpy as np

from shardstream.errors import StateError
from shardstream.plan.config import Run, Window, shard_sizes_array
from shardstream.plan.state import ORDER_KEYS, Key


class Stretch(Protocol):
    """What segments need of streams whose passes are laid in stretches (NOTE [ Stretched
    passes ] in plan/stream_passes.py): their offsets as real runs and samples."""

    def runs(self, start: int, stop: int) -> list[Run]:
        """Offsets ``[start, stop)`` as runs of mixture shards, in order."""
        ...

    def shards(self, start: int, stop: int) -> tuple[int, ...]:
        """The mixture shards offsets ``[start, stop)`` may read, each once."""
        ...

    def sample(self, position: int) -> tuple[int, int]:
        """``(mixture shard, index)`` of one offset."""
        ...


@dataclass(frozen=True, eq=False)
class Segments:
    """One stream's samples of one epoch, in order: segment ``i`` is samples
    ``[start[i], stop[i])`` of mixture shard ``shard[i]``; a plan reads the segments as
    its shards ("virtual shards", NOTE [ Mixtures ]). A segment whose ``source`` is ``k >=
    0`` is instead offsets ``[start[i], stop[i])`` of ``stretches[k]``, the epochs of
    streams whose many passes are laid in stretches (NOTE [ Stretched passes ]); ``source``
    ``None``: no such segment."""

    shard: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    source: np.ndarray | None = None
    stretches: tuple[Stretch, ...] = ()

    @property
    def sizes(self) -> np.ndarray:
        return self.stop - self.start

    def __len__(self) -> int:
        return int(self.shard.size)

    def _sources(self) -> np.ndarray:
        return np.full(len(self), -1, dtype=np.int64) if self.source is None else self.source

    @staticmethod
    def concat(parts: Sequence[Segments]) -> Segments:
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return Segments(empty, empty, empty)
        shard, start, stop = (
            np.concatenate([getattr(p, k) for p in parts]) for k in ("shard", "start", "stop")
        )
        if all(p.source is None for p in parts):
            return Segments(shard, start, stop)
        sources: list[np.ndarray] = []
        stretches: list[Stretch] = []
        for part in parts:  # each part's sources counted after the stretches before it
            own = part._sources()
            sources.append(np.where(own >= 0, own + len(stretches), -1))
            stretches += part.stretches
        return Segments(shard, start, stop, np.concatenate(sources), tuple(stretches))

    def split(self, at: int) -> tuple[Segments, Segments]:
        """The first ``at`` samples, and the rest (a segment cut in two if need be)."""
        ends = np.cumsum(self.sizes)
        cut = int(np.searchsorted(ends, at, side="left"))  # the segment holding sample `at - 1`
        if cut >= len(self):
            return self, Segments.concat([])
        inside = int(at - (ends[cut] - self.sizes[cut]))  # samples of segment `cut` that go first
        middle = int(self.start[cut]) + inside
        source = self.source
        head = Segments(
            self.shard[: cut + 1],
            self.start[: cut + 1],
            self.stop[: cut + 1].copy(),
            None if source is None else source[: cut + 1],
            self.stretches,
        )
        head.stop[cut] = middle
        tail = Segments(
            self.shard[cut:],
            self.start[cut:].copy(),
            self.stop[cut:],
            None if source is None else source[cut:],
            self.stretches,
        )
        tail.start[0] = middle
        return _nonempty(head), _nonempty(tail)

    def runs(self, runs: Iterable[Run]) -> tuple[Run, ...]:
        """Runs over the segments (``Run.shard`` a segment number) as runs of mixture shards."""
        shard, start = self.shard, self.start
        if self.source is None:
            return tuple(
                Run(int(shard[r.shard]), int(start[r.shard]) + r.start, int(start[r.shard]) + r.stop)
                for r in runs
            )
        found: list[Run] = []
        for r in runs:
            first, source = int(start[r.shard]), int(self.source[r.shard])
            if source < 0:
                found.append(Run(int(shard[r.shard]), first + r.start, first + r.stop))
            else:
                found += self.stretches[source].runs(first + r.start, first + r.stop)
        return tuple(found)

    def shards_of(self, virtual: Iterable[int]) -> tuple[int, ...]:
        """The mixture shards of segment numbers, each once, in order (all that a stretch
        may read: every shard of its stream once it spans a pass)."""
        if self.source is None:
            return tuple(dict.fromkeys(int(self.shard[v]) for v in virtual))
        found: dict[int, None] = {}
        for v in virtual:
            source = int(self.source[v])
            if source < 0:
                found[int(self.shard[v])] = None
            else:
                found.update(
                    dict.fromkeys(self.stretches[source].shards(int(self.start[v]), int(self.stop[v])))
                )
        return tuple(found)

    def sample(self, virtual: int, index: int) -> tuple[int, int]:
        """``(mixture shard, index)`` of sample ``index`` of segment ``virtual``."""
        source = -1 if self.source is None else int(self.source[virtual])
        if source < 0:
            return int(self.shard[virtual]), int(self.start[virtual]) + index
        return self.stretches[source].sample(int(self.start[virtual]) + index)


def _nonempty(segments: Segments) -> Segments:
    keep = segments.stop > segments.start
    source = None if segments.source is None else segments.source[keep]
    return Segments(
        segments.shard[keep], segments.start[keep], segments.stop[keep], source, segments.stretches
    )


def _mapped(segments: Segments, window: Window) -> Window:
    """A window over segments as a window over real shards, laid out lazily. Its shards
    are exact: a stretch spans far more shards than one window reads (NOTE [ Stretched
    passes ]), so a window over stretches whose runs the plan does not know up front is
    laid out here, else it would name (and fetch the sidecars of) every shard of a stream."""
    build = functools.partial(_mapped_window, segments, window)
    if segments.source is None:
        return Window.lazy(segments.shards_of(window.shards), build)
    runs = window.known_runs
    if runs is None:
        made = build()
        return Window.lazy(tuple(dict.fromkeys(run.shard for run in made[0])), lambda: made)
    return Window.lazy(tuple(dict.fromkeys(run.shard for run in segments.runs(runs))), build)


def _mapped_window(segments: Segments, window: Window) -> tuple[tuple[Run, ...], np.ndarray]:
    """The runs (over real shards) and order of a window over segments."""
    return segments.runs(window.runs), window.order


@dataclass(frozen=True, eq=False)
class ShardView:
    """The shards a plan runs on: ``sizes`` their sample counts; ``segments`` maps them to
    real shards (``None``: they are real); ``state`` the keys its plan's states carry
    beside the order's (checked by the kind that made the view, on resume); ``quotas``
    the samples each stream gives an epoch (one stream: all of them); ``listed`` the
    mean size of the segments that stretches stand for (NOTE [ Stretched passes ]), which
    sizes the default window and lanes as the listing did (``None``: ``sizes`` do)."""

    sizes: np.ndarray = field(repr=False)
    segments: Segments | None = None
    state: Mapping[str, Any] = field(default_factory=dict)
    quotas: tuple[int, ...] = ()
    listed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", shard_sizes_array(self.sizes))
        if not self.quotas:
            object.__setattr__(self, "quotas", (int(self.sizes.sum()),))

    @property
    def window_sizes(self) -> np.ndarray:
        """The shard sizes a default window and its lanes are made from (``default_window``,
        ``lanes_for``: both read only the mean of the non-empty ones)."""
        if self.listed is None:
            return self.sizes
        return np.array([self.listed], dtype=np.int64)

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
        return (_mapped(segments, w) for w in windows)

    def samples(self, samples: Iterator[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """``(shard, index)`` over these shards as ``(shard, index)`` of real shards."""
        if self.segments is None:
            return samples
        if self.segments.source is not None:
            return (self.segments.sample(virtual, index) for virtual, index in samples)
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
