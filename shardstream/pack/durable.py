"""Shards made durable after they are stored, in the background, and always before the manifest.

# NOTE [ Durable before the manifest ]
# What a crash may not do is leave a manifest whose shards are torn: the manifest is the
# only thing that makes a folder a dataset (DESIGN: written last, atomically). A torn
# shard without a manifest is harmless, since a rerun finds that its size or sha256
# differs and writes it again (NOTE [ Restartable shards ] in ``shard``). So a local
# shard must be durable before the manifest is written, not at the moment it is renamed
# into place. The local writer would fsync each shard before its rename, on the writing
# thread, and the next shard waited for the disk; instead a pack writes shards and
# sidecars with ``Storage.writer(name, durable=False)`` (renamed without an fsync) and
# hands their names to a ``ShardSync``, whose thread has the storage ``sync`` them while
# the next shard is encoded. Before the manifest (or a part's record) is written,
# ``ShardSync.finish`` waits for that thread, fsyncs every file the manifest lists that
# this run did not (shards reused from an earlier run may still be in the page cache
# only), then the folder (the renames), and only then is the manifest written, with its
# own fsync before its rename. Readers never see a partial file either way: every file
# is still renamed into place whole. Object stores have no fsync (an object is durable
# when its upload returns): a destination whose Storage does not ``needs_sync`` skips
# all of this.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

from shardstream.errors import StorageError
from shardstream.storage import Storage


class ShardSync:
    """Makes the files of a pack durable on a helper thread; see the NOTE above.

    ``add(name)`` takes each file written with ``durable=False`` (the ``on_stored`` of
    ``ShardOutput``); ``finish(names)`` makes those files, the named ones and the folder
    durable and raises what failed. Where the storage does not ``needs_sync`` (object
    stores) ``enabled`` is False and every method does nothing.
    """

    def __init__(self, storage: Storage) -> None:
        self.enabled = storage.needs_sync
        self._storage = storage
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._synced: set[str] = set()
        self._error: OSError | None = None

    def add(self, path: str) -> None:
        """Make ``path`` (relative to the folder) durable soon, in the background."""
        if not self.enabled:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shardstream-fsync", daemon=True)
            self._thread.start()
        self._queue.put(path)

    def _run(self) -> None:
        while (path := self._queue.get()) is not None:
            try:
                self._storage.sync(path)
                self._synced.add(path)
            except OSError as error:
                self._error = self._error or error

    def close(self) -> None:
        """Stop the helper thread once it has done what it was given (no error raised)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def finish(self, names: Iterable[str]) -> None:
        """Make the files ``names`` (relative to the folder), all added ones and the folders
        holding ``names`` (``.shardstream/`` for sidecars) durable."""
        if not self.enabled:
            return
        self.close()
        try:
            folders = {""}
            for name in names:
                if name not in self._synced:
                    self._storage.sync(name)
                    self._synced.add(name)
                folders.add(name.rpartition("/")[0])
            for folder in sorted(folders):  # the renames of the files into place
                self._storage.sync(folder)
        except OSError as error:
            self._error = self._error or error
        failed, self._error = self._error, None
        if failed is not None:
            raise StorageError(
                f"cannot make the shards durable before the manifest: {failed}",
                url=failed.filename or self._storage.url,
            ) from failed
