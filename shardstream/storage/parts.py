"""Long reads: one GET that is cut into parts in flight where one connection is slow.

When and where to cut is NOTE [ Reads in parts ] (cuts.py). Each part, and the
first GET, is retried alone (NOTE [ One retry layer ] in retry.py): a try that fails after
some of its bytes arrived asks again for the rest only. The bytes go to a ``Sink`` as they
arrive, in order within each part: one buffer allocated up front (on the botocore path the
body is read straight into it; elsewhere one copy; NOTE [ Read buffers ]), or the cache's
temp file, hashed in order as the parts complete (NOTE [ Filling the cache ] in
cached.py). Where the backend cannot stream a body (the fsspec path), the read is cut up
front into ``PARTS`` parts. The threads are a ``ReadPool`` (read_pool.py), which also
keeps what its GETs measured of the link.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any

from shardstream.storage.cuts import (
    CHUNK,
    FAST_PROOF,
    NEVER_CUT,
    PART_MAX,
    PROBE,
    cut,
    planned_parts,
    proves_fast,
    split,
)
from shardstream.storage.expect import Expected
from shardstream.storage.read_pool import ReadPool
from shardstream.storage.retried import RetriedIO
from shardstream.storage.sinks import MemorySink, Sink
from shardstream.types import ByteRange

__all__ = ["Tell", "read_long", "read_parts"]

# Whom a read tells of its bytes as they arrive (NOTE [ Read budget ] in dataset/budget.py):
# passed down by whoever starts the read, None where nobody counts them.
Tell = Callable[[int], None] | None


def read_parts(
    io: RetriedIO,
    path: str,
    rng: ByteRange | None,
    expect: Expected | None,
    pool: ReadPool,
    tell: Tell = None,
) -> bytes | memoryview:
    """``Storage.read_parts`` of an uncached Storage: a plain read where the read is short
    or of unknown size, else ``read_long`` into one buffer."""
    size = expect.size if expect is not None else None
    whole = ByteRange(0, size) if rng is None and size is not None else rng
    if whole is None or not whole.length:
        return io.read(path, rng, expect) if whole is None or rng is None else b""
    if io.streams and whole.length < NEVER_CUT:  # one GET read whole, as its probe would read it
        data = io.read(path, rng, expect)
        if tell is not None:
            tell(len(data))
        return data
    sink = MemorySink(whole, pool.buffers)
    read_long(io, path, whole, size, pool, sink, whole_object=rng is None, tell=tell)
    return sink.buffer


def read_long(
    io: RetriedIO,
    path: str,
    rng: ByteRange,
    size: int | None,
    pool: ReadPool | None,
    sink: Sink,
    *,
    whole_object: bool = False,
    tell: Tell = None,
) -> None:
    """The bytes of ``rng`` into ``sink``: one GET, cut into parts in ``pool``'s threads
    where it shows a slow connection (NOTE [ Reads in parts ]). ``size``: the object's
    expected size; ``whole_object``: ``rng`` is all of it (a plain GET); ``tell(bytes)``
    as they arrive, a chunk at a time."""
    if not io.streams:  # no body to read as it comes: cut up front
        parts = split(rng) if pool is not None else split(rng, -(-rng.length // PART_MAX))
        if pool is None or len(parts) == 1:
            for part in parts:
                _read_part(io, path, part, size, sink, tell)
        else:
            wait_all([pool.submit(_read_part, io, path, part, size, sink, tell) for part in parts])
        return
    answers = io.latency()  # NOTE [ A link's latency before its reads ]
    planned = planned_parts(rng, pool, answers) if pool is not None else [rng]  # cut up front: no probe
    stream = _Stream(io, path, planned[0], size, whole_object and len(planned) == 1, tell)
    if pool is not None:
        pool.count_gets(1)
        pool.reading(stream, True)
    try:
        if pool is not None and len(planned) > 1:
            _read_cut(stream, planned, pool, sink)
            return
        stream.read_to(min(rng.end, rng.start + PROBE), sink)
        if pool is None:
            stream.read_to(rng.end, sink)
            return
        parts = cut(ByteRange(stream.pos, rng.end), stream, pool, answers)
        while len(parts) == 1:  # fast or busy so far: a chunk more, and look again
            stream.read_to(min(rng.end, stream.pos + CHUNK), sink)
            if not pool.fast and proves_fast(stream.carried(FAST_PROOF)):
                pool.proven_fast()  # NOTE [ Reads in parts ]
            parts = cut(ByteRange(stream.pos, rng.end), stream, pool, answers)
        if parts:
            _read_cut(stream, parts, pool, sink)
    finally:
        stream.close()
        if pool is not None:
            pool.reading(stream, False)
            pool.count_gets(-1)
            pool.measured(stream)


def _read_cut(stream: _Stream, parts: list[ByteRange], pool: ReadPool, sink: Sink) -> None:
    """``parts[0]`` by ``stream``, the others in ``pool``'s threads at once."""
    later = [_submit_part(pool, stream, part, sink) for part in parts[1:]]
    try:
        stream.read_to(parts[0].end, sink)
    except BaseException:
        for future in later:
            future.cancel()
        wait(later)  # no thread still writes to the sink
        raise
    wait_all(later)


def _submit_part(pool: ReadPool, first: _Stream, part: ByteRange, sink: Sink) -> Future[None]:
    """``_stream_part`` of ``first``'s read in ``pool``, counted among its GETs in flight
    until it is done or cancelled."""
    pool.count_gets(1)
    try:
        future = pool.submit(_stream_part, first, part, sink, pool)
    except BaseException:
        pool.count_gets(-1)
        raise
    future.add_done_callback(lambda _: pool.count_gets(-1))
    return future


def _stream_part(first: _Stream, part: ByteRange, sink: Sink, pool: ReadPool) -> None:
    """A part as the first GET is read: into ``sink`` in pieces of ``CHUNK`` bytes as they
    arrive (a cache fill writes and hashes each while the next arrives, in buffers of one
    size it reuses), a failed try asking again for the rest only."""
    stream = _Stream(first.io, first.path, part, first.size, False, first.tell)
    pool.reading(stream, True)
    try:
        stream.read_to(part.end, sink)
    finally:
        pool.reading(stream, False)
        stream.close()
        pool.measured(stream)


def _read_part(io: RetriedIO, path: str, part: ByteRange, size: int | None, sink: Sink, tell: Tell) -> None:
    view = sink.view(part)
    io.read_into(path, part, size, view)
    sink.done(part, view)
    if tell is not None:
        tell(part.length)


class _Stream:
    """The first GET of a long read: its body read in order into a sink, up to a stop
    that the caller moves; a failed try asks again for the bytes not yet read (a ranged
    GET), in ``io``'s retries; ``tell(bytes)`` as each chunk is in. It measures the latency (time to the headers of the
    first GET that answers) and the rate of the GET being read (NOTE [ Reads in parts ])."""

    def __init__(
        self, io: RetriedIO, path: str, rng: ByteRange, size: int | None, whole: bool, tell: Tell
    ) -> None:
        self.io, self.path, self.rng, self.size, self.whole, self.tell = io, path, rng, size, whole, tell
        self.pos = rng.start
        self.body: Any = None
        self.latency: float | None = None
        self._mark: tuple[int, float] | None = None  # (pos, time) once a GET's first CHUNK is in
        self._opened_at = rng.start  # where the GET being read began
        self._opened_time = 0.0  # when its headers came
        self._last = 0.0  # when its last chunk came

    def read_to(self, stop: int, sink: Sink) -> None:
        self.io.retry(lambda: self._try(stop, sink), "read", self.path, ByteRange(self.pos, stop))

    def _try(self, stop: int, sink: Sink) -> None:
        try:
            if self.body is None:
                self._open()
            while self.pos < stop:
                chunk = ByteRange(self.pos, min(stop, self.pos + CHUNK))
                view = sink.view(chunk)
                got = _read_into(self.body, view)
                if got != chunk.length:
                    self.io.short_read(self.path, chunk, got, self.size)
                sink.done(chunk, view)
                if self.tell is not None:
                    self.tell(chunk.length)
                self.pos = chunk.end
                self._last = time.monotonic()
                self._measure()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        rng = None if self.whole and self.pos == 0 else ByteRange(self.pos, self.rng.end)
        started = time.monotonic()
        self.body = self.io.stream(self.path, rng, self.size)
        if self.latency is None:  # the first GET that answered
            self.latency = time.monotonic() - started
        self._opened_at, self._mark, self._opened_time = self.pos, None, time.monotonic()

    def _measure(self) -> None:
        if self._mark is None and self.pos - self._opened_at >= CHUNK:
            self._mark = (self.pos, self._last)

    def carried(self, least: int) -> float:
        """Bytes/s the GET being read carried since its headers came, once it read ``least``
        bytes (0.0 before): at most what its connection carried."""
        got = self.pos - self._opened_at
        return got / max(time.monotonic() - self._opened_time, 1e-6) if got >= least else 0.0

    def rate(self) -> float | None:
        """Bytes/s of the GET being read, from its first CHUNK to its last byte in (None
        before a second chunk is in): a burst of bytes that waited in the socket's buffers
        while this thread was busy weighs less and less as the GET goes on, and time spent
        after the last byte (waiting for the read's other parts) is not the connection's."""
        if self._mark is None or self.pos - self._mark[0] < CHUNK:
            return None
        return (self.pos - self._mark[0]) / max(self._last - self._mark[1], 1e-6)

    def close(self) -> None:
        body, self.body = self.body, None
        if body is not None:
            body.close()


def _read_into(body: Any, view: memoryview) -> int:
    """Bytes of ``body`` into ``view`` until it is full or the body ends; how many."""
    got = 0
    while got < len(view) and (n := body.readinto(view[got:])):
        got += n
    return got


def wait_all(futures: Sequence[Future[Any]]) -> None:
    """Wait for every future; raise the first error in submission order (after the others
    finished or were cancelled, so no thread still writes a buffer being dropped)."""
    error: BaseException | None = None
    for future in futures:
        if future.cancelled():
            continue
        try:
            future.result()
        except BaseException as failed:  # re-raised below: the first one wins
            if error is None:
                error = failed
                for later in futures:
                    later.cancel()
    if error is not None:
        raise error
