"""Reading the windows of a mixture's plan: one ``WindowReader`` per stream.

# NOTE [ Mixture reads ]
# A mixture's window is runs of mixture shards (stream ``s``'s shard ``i`` is
# ``offsets[s] + i``, NOTE [ Mixtures ] in plan/mixture.py). Its runs are split by stream
# into one part per stream, in window order, numbered as that stream's manifest numbers
# them, and each part is read by its stream's ``WindowReader``: the stream's own
# Storage (bucket, endpoint, options), manifest checks, sidecar LRU and format. A window
# is fetched as one: every part's sidecars first (so no window is laid out before all its
# shards' counts are checked), then every part's reads planned, then one share of the
# worker's read budget taken for all of them (NOTE [ Read budget ]), then the bytes read.
# The parts' samples are put back in the window's run order, so the window's order
# applies as for one dataset, each tagged with ``__stream__``: its stream's index in
# the mixture (one C-level call per sample; an int, which torch's default collate turns
# into a tensor of stream indices per batch).
"""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.dataset.budget import ReadBudget
from shardstream.dataset.reader import Fetched, WindowReader, prefetched
from shardstream.errors import FormatError
from shardstream.formats.base import Sample, SampleColumns
from shardstream.plan import Run
from shardstream.storage import Prefetcher

__all__ = ["STREAM_KEY", "MixtureReader"]

STREAM_KEY = "__stream__"


@dataclass(frozen=True, slots=True)
class _StreamRuns:
    """The runs of a mixture window that one stream reads, as its manifest numbers them."""

    runs: tuple[Run, ...]
    shards: tuple[int, ...]


class MixtureReader:
    """Fetches the samples of mixture windows for one worker; see NOTE [ Mixture reads ].

    ``readers[s]`` reads stream ``s``, whose shards are mixture shards
    ``[offsets[s], offsets[s + 1])``; the interface is ``WindowReader``'s.
    """

    def __init__(
        self,
        readers: Sequence[WindowReader],
        offsets: np.ndarray,
        *,
        prefetch: int,
        read_budget: int | None = None,
    ) -> None:
        """``read_budget`` None: the largest of the streams' readers' own (each one
        ``default_read_budget``'s for its storage: NOTE [ Read budget ])."""
        self.readers = tuple(readers)
        self._offsets = np.asarray(offsets, dtype=np.int64)
        self.prefetch = prefetch
        # one budget for the worker, as one dataset has (the streams' own go unused)
        ahead = any(reader.budget is not None for reader in self.readers)
        if read_budget is None:
            read_budget = max(reader.read_budget for reader in self.readers)
        self.budget = ReadBudget(read_budget) if ahead else None
        self._prefetcher: Prefetcher[Any, Any] | None = None

    def _stream_of(self, shard: int) -> int:
        return int(np.searchsorted(self._offsets, shard, side="right")) - 1

    def _split(self, runs: Sequence[Run]) -> tuple[list[int], dict[int, list[Run]]]:
        """The stream of each run, and each stream's runs in its own shard numbers."""
        streams = [self._stream_of(run.shard) for run in runs]
        parts: dict[int, list[Run]] = {}
        for run, stream in zip(runs, streams, strict=True):
            base = int(self._offsets[stream])
            parts.setdefault(stream, []).append(Run(run.shard - base, run.start, run.stop))
        return streams, parts

    def index(self, shard: int) -> Any:
        """The sample index of mixture shard ``shard``, from its stream's reader."""
        stream = self._stream_of(shard)
        return self.readers[stream].index(shard - int(self._offsets[stream]))

    def sidecar(self, shard: int, name: str) -> bytes:
        """The file ``name`` of the dataset of mixture shard ``shard`` (a sidecar of it)."""
        return self.readers[self._stream_of(shard)].sidecar(shard, name)

    # -- one window ----------------------------------------------------------------------

    def fetch(
        self,
        window: Any,
        take: Callable[[int], None] | None = None,
        tell: Callable[[int], None] | None = None,
    ) -> list[list[Fetched]]:
        """Every stream's bytes of ``window`` (see NOTE [ Mixture reads ]), by stream."""
        shards: dict[int, list[int]] = {}
        for shard in window.shards:
            stream = self._stream_of(shard)
            shards.setdefault(stream, []).append(shard - int(self._offsets[stream]))
        indexes = {stream: self.readers[stream].load_indexes(local) for stream, local in shards.items()}
        _, parts = self._split(window.runs)
        planned = {
            stream: self.readers[stream].plan_fetch(runs, indexes[stream]) for stream, runs in parts.items()
        }
        if take is not None:
            take(sum(one.bytes for one in planned.values()))
        fetched: list[list[Fetched]] = [[] for _ in self.readers]
        for stream, one in planned.items():
            fetched[stream] = self.readers[stream].fetch_planned(one, tell)
        return fetched

    def decode(self, window: Any, fetched: list[list[Fetched]]) -> tuple[list[Sample | None], bool]:
        """The samples of ``window``'s runs in run order, each with ``__stream__``, and
        whether any is ``None`` (skipped as corrupt)."""
        streams, parts = self._split(window.runs)
        decoded: dict[int, list[Sample | None]] = {}
        holes = False
        for stream, runs in parts.items():
            local = tuple(runs)
            decoded_part, missing = self.readers[stream].decode(_StreamRuns(local, ()), fetched[stream])
            fetched[stream] = []
            samples: list[Sample | None] = (
                list(decoded_part.samples()) if isinstance(decoded_part, SampleColumns) else decoded_part
            )
            _tag([sample for sample in samples if sample is not None] if missing else samples, stream)
            decoded[stream] = samples
            holes = holes or missing
        if len(decoded) == 1:
            return decoded.popitem()[1], holes
        out: list[Sample | None] = []
        taken = dict.fromkeys(decoded, 0)
        for run, stream in zip(window.runs, streams, strict=True):
            first = taken[stream]
            taken[stream] = first + len(run)
            out.extend(decoded[stream][first : first + len(run)])
        return out, holes

    def locate(self, error: FormatError, window: Any, position: int) -> FormatError:
        """``error`` about the sample at ``position`` of ``window``'s runs, named by its stream's reader."""
        for run in window.runs:
            if position < len(run):
                stream = self._stream_of(run.shard)
                local = Run(run.shard - int(self._offsets[stream]), run.start, run.stop)
                return self.readers[stream].locate(error, _StreamRuns((local,), (local.shard,)), position)
            position -= len(run)
        return error

    # -- the stream of windows -----------------------------------------------------------

    def stream(self, windows: Iterator[Any]) -> Iterator[tuple[Any, list[Sample | None], bool]]:
        """``(window, samples, holes)`` for each window, its samples in yield order, fetched
        ahead as ``WindowReader.stream`` does."""
        return prefetched(self, windows)

    def in_yield_order(self, window: Any, fetched: list[list[Fetched]]) -> tuple[list[Sample | None], bool]:
        samples, holes = self.decode(window, fetched)
        return list(map(samples.__getitem__, window.order.tolist())), holes

    def in_pieces(self, windows: Iterator[Any]) -> Iterator[Any]:
        """``windows`` as they are: a mixture's are never cut (its streams' budgets go unused)."""
        return windows

    def hold(self, prefetcher: Prefetcher[Any, Any]) -> None:
        """Keep the stream's ``prefetcher``, closed with the reader."""
        self._prefetcher = prefetcher

    def check_beside_decoding(self) -> None:
        """Each stream's reads checked beside decoding (``WindowReader.check_beside_decoding``)."""
        for reader in self.readers:
            reader.check_beside_decoding()

    def close(self) -> None:
        if self.budget is not None:
            self.budget.close()
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            prefetcher.close()
        for reader in self.readers:
            reader.close()


def _tag(samples: list[Any], stream: int) -> None:
    """``sample["__stream__"] = stream`` for every sample, in C (no Python frame per sample)."""
    collections.deque(
        map(operator.setitem, samples, itertools.repeat(STREAM_KEY), itertools.repeat(stream)), maxlen=0
    )
