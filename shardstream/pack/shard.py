"""One shard written to storage: encoded, hashed on the way, stored atomically, with its sidecar.

# NOTE [ Restartable shards ]
# A shard goes to its final name only when it is whole (``Storage.writer`` is atomic),
# and its sidecar index is written after it, the manifest after all of them. A pack
# killed at any moment therefore leaves whole shards, maybe without sidecars, and no
# manifest. When the same pack runs again, each shard is encoded again (that is cheap
# next to moving its bytes) and hashed as it is written to the local spool; a shard
# already at its final name is kept, and the new bytes discarded, when its size and
# sha256 are those of the new bytes. So a rerun uploads only what is missing, and an
# existing object is replaced only by the exact bytes a clean run would write.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import IO, Any, cast

# ShardResult, checks_of and sha256_of live below pack, since catalog needs them too; they
# stay importable from here
from shardstream.digests import checks_of as checks_of
from shardstream.digests import sha256_of
from shardstream.errors import ShardstreamError, StorageError, UsageError
from shardstream.folder import ShardResult, fields_and_schema, sidecar_name
from shardstream.formats import ShardFormat
from shardstream.formats.base import Sample
from shardstream.formats.checks import BlockHasher, ShardChecks
from shardstream.manifest import ShardInfo
from shardstream.storage import Storage

_CHUNK = 4 << 20  # bytes gathered before one hash update and one write
_QUEUED_CHUNKS = 3  # chunks waiting for the hashing thread, at most
_DIRECT = 256 << 10  # writes this large skip the buffer


class HashingSink:
    """A write-only file object that hashes what goes through it, on another thread.

    Encoders write a sample at a time; the sink gathers small writes into 4 MiB chunks
    (large ones go as they are), writes each chunk to the file and hands it to a helper
    thread that hashes it (sha256 and the block CRCs of NOTE [ Checksummed reads ]).
    ``hashlib`` and ``zlib`` release the GIL on large buffers, so hashing runs on
    another core while this thread writes and encodes the next chunk. ``close``
    (or ``hexdigest``) waits for the helper; it is a daemon thread, so a sink that is
    never closed cannot hang the program.
    """

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._hash = BlockHasher()
        self._buffer = bytearray()
        self._written = 0
        self._error: BaseException | None = None
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=_QUEUED_CHUNKS)
        self._thread: threading.Thread | None = threading.Thread(
            target=self._drain, name="shardstream-hash", daemon=True
        )
        self._thread.start()
        self.closed = False

    def _drain(self) -> None:
        update = self._hash.update
        while (chunk := self._queue.get()) is not None:
            if self._error is None:
                try:
                    update(chunk)
                except BaseException as error:  # reported to the writing thread at close
                    self._error = error

    def write(self, data: Any) -> int:
        n = len(data) if type(data) is bytes else memoryview(data).nbytes
        if n >= _DIRECT:  # a large sample goes as it is, without a copy into the buffer
            self._flush()
            self._emit(data if type(data) is bytes else bytes(data))
            return n
        buffer = self._buffer
        buffer += data
        if len(buffer) >= _CHUNK:
            self._flush()
        return n

    def _emit(self, chunk: bytes) -> None:
        if self._error is not None or self._thread is None:
            self._finish()
        self._file.write(chunk)
        self._queue.put(chunk)
        self._written += len(chunk)

    def _flush(self) -> None:
        if self._buffer:
            self._emit(bytes(self._buffer))
            self._buffer.clear()

    def _finish(self) -> None:
        """Stop the helper thread; raise what it met."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        if self._error is not None:
            raise self._error
        if thread is None:
            raise ValueError("write to a closed HashingSink")

    def flush(self) -> None:
        self._flush()

    def tell(self) -> int:
        return self._written + len(self._buffer)

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        """Write what is buffered and stop the helper (encoders leave the sink open; its owner closes it)."""
        if self._thread is not None:
            try:
                self._flush()
            finally:
                self._finish()
        self.closed = True

    @property
    def size(self) -> int:
        return self.tell()

    def hexdigest(self) -> str:
        self.close()
        return self._hash.hexdigest()

    def checks(self) -> ShardChecks:
        """The size, sha256 and block CRCs of everything written (closes the sink)."""
        self.close()
        return self._hash.checks()


class _Discard(Exception):
    """Thrown into a storage writer to make it drop what was written."""


class ShardOutput:
    """A shard being written: ``write`` samples, then ``finish`` (or ``abort``).

    ``expected`` is the manifest entry the shard must match when the destination
    already holds a dataset that may not be replaced (no ``overwrite``). With
    ``on_stored``, the files (the shard, its sidecar) are written with ``durable=False``
    and the name of each one stored goes to ``on_stored``, which must make them durable
    before the manifest (NOTE [ Durable before the manifest ] in ``durable``).
    """

    def __init__(
        self,
        storage: Storage,
        fmt: ShardFormat,
        name: str,
        *,
        compression: str | None = None,
        expected: ShardInfo | None = None,
        on_stored: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self._storage = storage
        self._expected = expected
        self._on_stored = on_stored
        self._durable = on_stored is None
        self._context: AbstractContextManager[IO[bytes]] | None = storage.writer(name, durable=self._durable)
        self._sink = HashingSink(self._context.__enter__())
        try:
            self._encoder = fmt.encoder(cast(IO[bytes], self._sink), name=name, compression=compression)
        except BaseException:
            self.abort()
            raise
        # the hot path: no wrapper call per sample
        self.write = self._encoder.write
        self.write_within: Callable[[Sample, int], int] | None = getattr(self._encoder, "write_within", None)

    @property
    def num_samples(self) -> int:
        return self._encoder.num_samples

    @property
    def num_bytes(self) -> int:
        """Bytes of the shard so far."""
        return self._sink.tell()

    def finish(self) -> ShardResult:
        """Close the shard; store it (or keep an identical one already there), then its sidecar."""
        try:
            index = self._encoder.close()
            digest, size = self._sink.hexdigest(), self._sink.size
            reused = self._matches_existing(digest, size)
        except BaseException:
            self.abort()
            raise
        self._end(keep=not reused)
        index.bind_checks(self._sink.checks())  # the sidecar names these bytes
        sidecar = index.to_bytes()
        info = ShardInfo(
            path=self.name,
            samples=index.num_samples,
            bytes=size,
            sha256=digest,
            index=sidecar_name(self.name),
            index_bytes=len(sidecar),
            tokens=index.num_tokens,
        )
        if reused:
            written = _write_if_changed(self._storage, info.index, sidecar, durable=self._durable)
        else:  # a new shard: whatever sidecar was there belonged to other bytes
            self._storage.write(info.index, sidecar, durable=self._durable)
            written = True
        if written and self._on_stored is not None:
            self._on_stored(info.index)
        origins = dict(getattr(self._encoder, "schema_origins", {}))  # NOTE [ One schema per dataset ]
        return ShardResult(
            info, *fields_and_schema(index), reused=reused, token_dtype=index.token_dtype, origins=origins
        )

    def abort(self) -> None:
        """Drop the shard: nothing of it becomes visible."""
        self._end(keep=False)

    def _end(self, *, keep: bool) -> None:
        context, self._context = self._context, None
        if context is None:
            return
        if not keep:
            with contextlib.suppress(Exception):  # what failed is already being raised
                self._sink.close()
        if keep:
            context.__exit__(None, None, None)
            if self._on_stored is not None:
                self._on_stored(self.name)
            return
        with contextlib.suppress(_Discard):
            context.__exit__(_Discard, _Discard(), None)

    def _matches_existing(self, digest: str, size: int) -> bool:
        """Whether the object at the shard's name already holds these bytes (see NOTE above)."""
        expected = self._expected
        if expected is not None:
            if expected.sha256 == digest and expected.bytes == size:
                return self._storage.exists(self.name)
            ours = f"{self.num_samples:,} samples, {size:,} bytes"
            theirs = f"{expected.samples:,} samples, {expected.bytes:,} bytes"
            raise UsageError(
                f"the destination holds another dataset: shard {self.name} differs from the one in its "
                f"manifest (there {theirs}; this pack's {ours}): that dataset was packed from another "
                "source or with other --samples-per-shard, --shard-size or --compression (the same source "
                "and options give the same shards); pass overwrite=True (--overwrite) to replace it",
                url=self._storage.url,
                shard=self.name,
            )
        storage = self._storage
        try:
            if storage.size(self.name) != size:
                return False
        except StorageError:  # not there (or not readable: then it is written again)
            return False
        return sha256_of(storage, self.name) == digest


def _write_if_changed(storage: Storage, path: str, data: bytes, *, durable: bool) -> bool:
    """Write ``data`` unless ``path`` already holds it; whether it was written."""
    try:
        if storage.size(path) == len(data) and storage.read(path) == data:
            return False
    except ShardstreamError:
        pass  # unreadable: write it again
    storage.write(path, data, durable=durable)
    return True


def write_shard(
    storage: Storage,
    fmt: ShardFormat,
    name: str,
    samples: Iterable[Sample],
    *,
    compression: str | None = None,
    expected: ShardInfo | None = None,
) -> ShardResult:
    """Write all of ``samples`` as the shard ``name``."""
    output = ShardOutput(storage, fmt, name, compression=compression, expected=expected)
    try:
        for sample in samples:
            output.write(sample)
    except BaseException:
        output.abort()
        raise
    return output.finish()
