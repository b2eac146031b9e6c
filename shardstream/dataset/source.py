"""``DatasetSource``: one dataset folder as a process reads it.

A source holds what a dataset is (its URL, read options, manifest and fingerprint: read
once, and carried to DataLoader workers when it is pickled) and what a process reads it
with (a ``Storage``, the sidecar LRU, what the manifest says of each object): made
lazily by the process that uses them, and anew in a fork child (``lifecycle.PerProcess``).
A job reads a manifest once and a rank its workers' first sidecars once (NOTE [ One
manifest read per job ] and NOTE [ First sidecars through the parent ] in startup.py).
``StreamingDataset`` holds one source (or one per stream of a mixture),
``MapDataset`` one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shardstream.dataset.config import read_streamable_manifest
from shardstream.dataset.fetch import expectations
from shardstream.dataset.indexes import IndexCache
from shardstream.dataset.options import ReadOptions
from shardstream.dataset.reader import WindowReader
from shardstream.dataset.startup import node_first_sidecars
from shardstream.formats.base import SampleIndex
from shardstream.lifecycle import PerProcess
from shardstream.manifest import Manifest, ShardInfo, dataset_fingerprint
from shardstream.storage import Expected, Storage

__all__ = ["DatasetSource"]

Made = TypeVar("Made")


@dataclass(slots=True)
class _InProcess:
    """What one process reads a source with (NOTE [ Per-process state ] in lifecycle.py)."""

    storage: Storage
    # the sidecar LRU kept across this process's iterations (NOTE [ Sidecars across epochs ])
    indexes: IndexCache = field(default_factory=IndexCache)
    expected: Mapping[str, Expected] | None = None  # O(shards) to make: once
    made: dict[str, Any] = field(default_factory=dict)  # per-process things of the source's users
    making: threading.Lock = field(default_factory=threading.Lock)  # threads at once share one of each


class DatasetSource:
    """The dataset at ``url``, read with ``options``."""

    def __init__(self, url: str, options: ReadOptions) -> None:
        self.url = url
        self.options = options
        self._manifest: Manifest | None = None
        self._fingerprint: str | None = None
        # sidecars of this rank's workers' first windows, read by the main process and
        # carried to its workers (NOTE [ First sidecars through the parent ] in startup.py)
        self._first: dict[ShardInfo, SampleIndex] = {}
        self._here = PerProcess(self._make_here)

    def __repr__(self) -> str:
        return f"DatasetSource({self.url!r})"

    def _make_here(self) -> _InProcess:
        return _InProcess(self.options.open_storage(self.url))

    def _in_process(self) -> _InProcess:
        return self._here.get()

    @property
    def storage(self) -> Storage:
        """This process's storage client: made lazily, and made anew after a fork."""
        return self._in_process().storage

    @property
    def indexes(self) -> IndexCache:
        """This process's sidecar LRU, kept across its iterations."""
        return self._in_process().indexes

    @property
    def manifest(self) -> Manifest:
        """The dataset's manifest, read once (and carried to workers with the source)."""
        if self._manifest is None:
            self._manifest = read_streamable_manifest(self.storage)
        return self._manifest

    def adopt_manifest(self, manifest: Manifest, fingerprint: str) -> bool:
        """Take ``manifest``, read by another process (NOTE [ One manifest read per job ] in
        startup.py), where it is the dataset ``fingerprint`` names and lists shards; False
        (nothing taken, this source reads its own) where not."""
        if not manifest.shards or dataset_fingerprint(manifest) != fingerprint:
            return False
        if self._manifest is None:
            self._manifest, self._fingerprint = manifest, fingerprint
        return self.fingerprint == fingerprint

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint (``manifest.dataset_fingerprint``), kept in states."""
        if self._fingerprint is None:
            self._fingerprint = dataset_fingerprint(self.manifest)
        return self._fingerprint

    def expectations(self) -> Mapping[str, Expected]:
        """What the manifest says of each object, checked on every read: made once per process."""
        here = self._in_process()
        if here.expected is None:
            here.expected = expectations(self.manifest)
        return here.expected

    def in_process(self, name: str, make: Callable[[], Made]) -> Made:
        """``make()``, made once in this process under ``name`` (and anew after a fork)."""
        here = self._here.get()  # not through _in_process: a MapDataset asks once per sample
        made = here.made.get(name)
        if made is None:
            with here.making:
                if name not in here.made:
                    here.made[name] = make()
            made = here.made[name]
        return made  # type: ignore[no-any-return]

    def made_here(self, name: str) -> Any:
        """What ``in_process(name, ...)`` made in this process, or ``None`` (nothing made)."""
        here = self._here.peek()
        return here.made.get(name) if here is not None else None

    def window_reader(
        self,
        *,
        columns: bool = False,
        indexes: IndexCache | None = None,
        prefetch: int | None = None,
        read_concurrency: int | None = None,
        coalesce_gap: int | None = None,
        typed_values: Mapping[str, str] | None = None,
    ) -> WindowReader:
        """A reader of this dataset's windows for one iteration in this process:
        ``columns`` for a decoder (NOTE [ Bulk decode ]), ``indexes`` a sidecar LRU shared
        with other sources (default: this one's), ``typed_values`` the fields a Parquet
        shard may give as its typed columns hold them (NOTE [ Typed values passed through ])."""
        options = self.options
        return WindowReader(
            self.storage,
            self.manifest,
            on_error=options.on_error,
            prefetch=options.prefetch_windows if prefetch is None else prefetch,
            verify_checksums=options.verify_checksums,
            local_reads=options.local_reads,
            read_budget=options.read_budget,
            read_concurrency=options.read_concurrency if read_concurrency is None else read_concurrency,
            indexes=self.indexes if indexes is None else indexes,
            expected=self.expectations(),
            columns=columns,
            coalesce_gap=coalesce_gap,
            typed_values=typed_values,
        )

    def read_first_sidecars(self, shards: Sequence[int], world: int = 1) -> None:
        """In the main process: read the sidecars of ``shards`` (its workers' first windows)
        once, all at once, and carry them to its workers; those carried already are kept,
        others let go. Not for local files or a shard cache (NOTE [ First sidecars through
        the parent ] in startup.py); once per node where ``world`` > 1 (NOTE [ First
        sidecars once per node ])."""
        if self.storage.local_files:
            return
        infos = self.manifest.shards
        wanted = {infos[shard]: shard for shard in shards}
        kept = {info: index for info, index in self._first.items() if info in wanted}
        missing = [shard for info, shard in wanted.items() if info not in kept]
        if missing:
            reader = self.window_reader()
            try:
                loaded = node_first_sidecars(self, missing, reader.sidecars.load, world)
            finally:
                reader.close()
            kept.update((infos[shard], index) for shard, index in loaded.items())
        self._first = kept

    @property
    def carries_sidecars(self) -> bool:
        """Whether first sidecars read by the main process are carried (not yet seeded)."""
        return bool(self._first)

    def seed_first_sidecars(self, shards: Sequence[int], indexes: IndexCache | None = None) -> None:
        """In a worker: put the carried sidecars of ``shards`` (its first window's) in the
        LRU its readers use (default: this process's of this source), and let the carried
        ones go."""
        first, self._first = self._first, {}
        if not first:
            return
        indexes, infos = self.indexes if indexes is None else indexes, self.manifest.shards
        for shard in dict.fromkeys(shards):
            index = first.get(infos[shard])
            if index is not None:
                indexes.put(infos[shard], index)

    def close(self) -> None:
        """Release this process's storage (the source can still be used)."""
        here = self._here.clear()
        if here is not None:
            here.storage.close()

    # -- pickling: configuration and the manifest, never a live client ----------------------

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "options": self.options,
            "manifest": self._manifest,
            "fp": self._fingerprint,
            "first": self._first,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url, self.options = state["url"], state["options"]
        self._manifest, self._fingerprint = state["manifest"], state["fp"]
        self._first = state.get("first") or {}
        self._here = PerProcess(self._make_here)
