"""Shards made durable after they are stored, in the background, and always before the manifest.

# NOTE [ Durable before the manifest ]
# What a crash may not do is leave a manifest whose shards are torn: the manifest is the
# only thing that makes a folder a dataset (DESIGN: written last, atomically). A torn
# shard without a manifest is harmless, since a rerun finds that its size or sha256
# differs and writes it again (NOTE [ Restartable shards ] in ``shard``). So a local
# shard must be durable before the manifest is written, not at the moment it is renamed
# into place. The local writer would fsync each shard before its rename, on the writing
# thread, and the next shard waited for the disk; instead a pack renames shards and
# sidecars without an fsync (``shardstream.storage.local.deferred_fsync``) and hands
# their paths to a ``ShardSync``, whose thread fsyncs them while the next shard is
# encoded. Before the manifest (or a part's record) is written, ``ShardSync.finish``
# waits for that thread, fsyncs every file the manifest lists that this run did not
# (shards reused from an earlier run may still be in the page cache only), then the
# folder (the renames), and only then is the manifest written, with its own fsync
# before its rename. Readers never see a partial file either way: every file is still
# renamed into place whole. Object stores have no fsync (an object is durable when its
# upload returns), so a remote destination skips all of this.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable

from shardstream.errors import StorageError
from shardstream.pack.sources.base import is_local
from shardstream.storage.local import fsync_path, local_path

__all__ = ["ShardSync"]


class ShardSync:
    """fsyncs the files of a pack to a local folder on a helper thread; see the NOTE above.

    ``add(path)`` is the ``on_replace`` callback of ``deferred_fsync``; ``finish(names)``
    makes those files, the named ones and the folder durable and raises what failed.
    For a remote destination ``enabled`` is False and every method does nothing.
    """

    def __init__(self, url: str) -> None:
        self.enabled = is_local(url)
        self._root = local_path(url) if self.enabled else url
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._synced: set[str] = set()
        self._error: OSError | None = None

    def add(self, path: str) -> None:
        """fsync ``path`` (absolute, or relative to the folder) soon, in the background."""
        if not self.enabled:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shardstream-fsync", daemon=True)
            self._thread.start()
        self._queue.put(os.path.join(self._root, path))

    def _run(self) -> None:
        while (path := self._queue.get()) is not None:
            try:
                fsync_path(path)
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
        """Make the files ``names`` (relative to the folder), all added ones and the folder durable."""
        if not self.enabled:
            return
        self.close()
        try:
            for name in names:
                path = os.path.join(self._root, name)
                if path not in self._synced:
                    fsync_path(path)
                    self._synced.add(path)
            fsync_path(self._root)  # the renames of the files into place
        except OSError as error:
            self._error = self._error or error
        failed, self._error = self._error, None
        if failed is not None:
            raise StorageError(
                f"cannot make the shards durable before the manifest: {failed}",
                url=failed.filename or self._root,
            ) from failed
