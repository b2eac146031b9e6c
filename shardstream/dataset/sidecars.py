"""A reader's sample indexes (sidecars): from the LRU, or read, checked and kept.

# NOTE [ One read per sidecar ]
# On object storage the first windows of an epoch are fetched at once (AHEAD_THREADS),
# and each reads the sidecars of its shards that are not in the LRU yet: where two
# windows share shards, as every window of order="global" shares all of a worker's,
# both would read them, each sidecar read (and parsed) twice per worker and epoch.
# So a sidecar being read is a Future that the other windows wait for; a failed read
# fails them all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import cast

from shardstream.dataset.fetch import ByteFetcher
from shardstream.dataset.indexes import IndexCache
from shardstream.dataset.read_checks import ReadAgain
from shardstream.errors import FormatError, StorageError
from shardstream.formats.base import SampleIndex, ShardFormat
from shardstream.manifest import Manifest, ShardInfo
from shardstream.storage.parts import Tell
from shardstream.types import ByteRange

__all__ = ["Sidecars"]

# What names a read's error: the error and the ``(path, range or None)`` read.
Named = Callable[[StorageError, tuple[str, "ByteRange | None"]], Exception]


class Sidecars:
    """The sample indexes of one dataset's shards (by position in ``manifest``), kept in
    ``indexes`` (the dataset's LRU, across its iterations) and read by ``fetcher``."""

    def __init__(
        self,
        manifest: Manifest,
        fmt: ShardFormat,
        fetcher: ByteFetcher,
        indexes: IndexCache,
        *,
        read_again: ReadAgain,
        named: Named,
    ) -> None:
        self.manifest, self.format, self.fetcher, self.indexes = manifest, fmt, fetcher, indexes
        self._read_again, self._named = read_again, named
        # sidecars being read, by shard, for the windows fetched at once (NOTE [ One read per sidecar ])
        self._loading: dict[int, Future[SampleIndex]] = {}
        self._loading_lock = threading.Lock()

    def index(self, shard: int) -> SampleIndex:
        """The sample index of ``shard``, from the LRU."""
        found = self.cached(shard)
        if found is not None:
            return found
        info = self.manifest.shards[shard]
        return self._keep(shard, self.fetcher.read(info.index, None))

    def sidecar(self, name: str) -> bytes:
        """The file ``name`` of the dataset folder."""
        return bytes(self.fetcher.read(name, None))

    def cached(self, shard: int) -> SampleIndex | None:
        """The sample index of ``shard`` where the LRU holds it, else None."""
        info = self.manifest.shards[shard]
        index = self.indexes.get(info)
        if index is not None and index.checks is not None:  # kept by an earlier iteration's reader
            self.fetcher.know_checks(info.path, index.checks.whole_crc)
        return index

    def load(self, shards: Sequence[int], tell: Tell = None) -> dict[int, SampleIndex]:
        """The sample indexes of ``shards``: from the LRU, the missing ones read all at once
        (``tell(bytes)`` as they arrive; NOTE [ One read per sidecar ])."""
        found: dict[int, SampleIndex | Future[SampleIndex] | None] = {
            shard: self.cached(shard) for shard in dict.fromkeys(shards)
        }
        with self._loading_lock:  # NOTE [ One read per sidecar ]
            for shard in [shard for shard, index in found.items() if index is None]:
                found[shard] = self._loading.get(shard) or self.cached(shard)
            mine = [shard for shard, index in found.items() if index is None]
            loading = {shard: self._loading.setdefault(shard, Future()) for shard in mine}
        found.update(loading)
        items: list[tuple[str, ByteRange | None]] = [
            (self.manifest.shards[shard].index, None) for shard in mine
        ]
        try:
            for shard, data in zip(mine, self.fetcher.read_all(items, self._named, tell), strict=True):
                loading[shard].set_result(self._keep(shard, data))
        except BaseException as error:
            for future in loading.values():
                if not future.done():
                    future.set_exception(error)
            raise
        finally:
            with self._loading_lock:
                for shard in mine:
                    del self._loading[shard]
        return {
            shard: got.result() if isinstance(got, Future) else cast(SampleIndex, got)
            for shard, got in found.items()
        }

    def _keep(self, shard: int, data: bytes | memoryview) -> SampleIndex:
        info = self.manifest.shards[shard]
        try:
            index = self._checked(info, data)
        except FormatError as error:
            healed = self._read_again(info.index, None, error.offset or 0)  # NOTE [ Healing the cache ]
            if healed is None:
                raise
            index = self._checked(info, healed)
        if index.checks is not None:  # what the shard's cache fill is checked against
            self.fetcher.know_checks(info.path, index.checks.whole_crc)
        self.indexes.put(info, index)
        return index

    def _checked(self, info: ShardInfo, data: bytes | memoryview) -> SampleIndex:
        """The sample index in ``data`` (a sidecar's bytes), checked against ``info``."""
        index = self.format.load_index(bytes(data), name=info.path)
        url = self.fetcher.storage.full_url
        # Before any window lays out this shard's samples: a manifest that claims more
        # samples than the shard holds must not size anything (see Window.shards).
        if index.num_samples != info.samples:
            raise FormatError(
                f"sample index has {index.num_samples} samples, the manifest says {info.samples}",
                url=url(info.index),
                shard=info.path,
            )
        other = index.checks.other_shard(info.bytes, info.sha256) if index.checks is not None else None
        if other is not None:
            raise FormatError(other, url=url(info.index), shard=info.path)
        return index
