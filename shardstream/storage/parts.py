"""Long reads: one GET that is cut into parts in flight where one connection is slow.

When to cut is NOTE [ Reads in parts ] (above the constants below). Each part, and the
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

from shardstream.storage.expect import Expected
from shardstream.storage.read_pool import LINK, ReadPool, trim_read_buffers
from shardstream.storage.retried import RetriedIO
from shardstream.storage.sinks import MemorySink, Sink
from shardstream.types import ByteRange

__all__ = [
    "FAST_CONNECTION",
    "GETS_IN_FLIGHT",
    "LINK",
    "LONG_LATENCY",
    "NEVER_CUT",
    "PARTS",
    "PART_LATENCIES",
    "PART_MAX",
    "PART_MIN",
    "MemorySink",
    "ReadPool",
    "Sink",
    "Tell",
    "read_long",
    "read_parts",
    "split",
    "trim_read_buffers",
]

# NOTE [ Reads in parts ]
# One response is bounded by the wire's latency and by what one connection carries, so a
# long read (a run of large samples, a whole shard) may be cut into parts read by several
# threads at once. But some servers copy the whole object for each GET, ranged or not
# (moto: NOTE [ Whole shards ] in dataset/window_fetch.py), and there every part multiplies the
# server's work. So a long read starts as ONE GET (a plain one for a whole object) whose
# body is read in order, and is cut only when that response shows the connection is the limit:
# - The probe: its first PROBE bytes. The time to the headers is the latency; the rate is
#   the GET's since its first MiB (which also carries the server's start), looked at again
#   after each MiB: bytes that waited in the socket's buffers arrive at once and look fast,
#   and weigh less with every MiB. A read left whole may still be cut later, once the
#   window's other reads are done.
# - A connection carrying FAST_CONNECTION or more is not what limits a worker (its CPU is,
#   and more GETs only add work): the GET reads on. Slower, the rest is cut into parts
#   that last about PART_LATENCIES latencies each (so a part's latency is a small share of
#   its time), at least PART_MIN bytes, at most PARTS of them (the server's copies stay
#   few), longer than PART_MAX only where that keeps them that few. Half that, one
#   latency, where small GETs take LONG_LATENCY or more to answer (NOTE [ A link's latency
#   before its reads ]): there the latency is the wire's round trip, which costs the
#   server nothing, and a read's bytes are held in the read budget from its first GET to
#   its last byte (NOTE [ Read budget ] in dataset/budget.py), so a worker carries at most
#   its budget per such time and parts that end sooner carry more of it. There, too, a
#   read longer than PARTS parts of PART_MAX may have a part per PART_MAX: a shuffled
#   window of large shards is a few long reads at once, and PARTS of each left the
#   connections the wire could carry half used; shorter reads (the pieces of an
#   unshuffled window) keep PARTS, which their number fills, and more parts only shorten
#   them. Elsewhere a long read's latency is mostly the server's work per GET (moto's
#   copy of the object, tens of ms for a large one), which more parts multiply. Where not even two parts would last
#   their latencies (a loaded server answers late), the GET reads on. The first GET reads
#   to the end of the first part; the others are ranged GETs in the pool's threads.
# - Only while the pool's long reads have fewer than GETS_IN_FLIGHT GETs in flight, into no
#   more parts than it takes to get there: a part adds a connection where a worker has few,
#   but only requests where its window's reads keep that many busy (a rate per connection
#   cannot tell the two apart); the bound leaves room for the reads probed last to be cut.
# - Only while the long reads being read carry less than FAST_CONNECTION together (then the
#   connections are slow, not this process or the server), unless the link is a long one:
#   a connection that carries at least PART_MIN bytes in one latency (``_long_link``). On a
#   short link (loopback, a LAN) one connection is not held back by its round trips, so
#   slow ones sharing a fast total are slowed by this process's CPU or the server's, which
#   more GETs only load more. Over a long link each connection is held to what its window
#   carries per round trip whatever the others carry, so the total grows with the GETs in
#   flight: stopping the cuts at a fixed total would hold a worker there, below the wire.
#   A server slow to answer looks like a long link too; the rules on fast GETs still hold.
# - Never once a GET of the pool read FAST_PROOF bytes at FAST_CONNECTION or more since its
#   headers came (every byte of it arrived since then, so no burst of bytes that waited in
#   the socket's buffers can make that rate: it is at most what the connection carried).
#   A connection that carried that much is not capped below it, so a later GET that reads
#   slower is slowed by this process's CPU or the server's, which parts would only load
#   more (a server that copies the object for each GET copies it once more per part).
# - Once the pool measured its connections (the latency and rate of its last GETs, LINK
#   of them) and found them slow, a long read is cut up front, by the same rule, with no
#   probe of its own: a probe holds the read to one connection for its first bytes and
#   the latency of the parts cut after it, so a read of a slow link takes longer than its
#   parts need, and the bytes it holds (NOTE [ Read budget ]) stay held that much longer.
#   A pool proven fast, or whose reads carry FAST_CONNECTION together, probes as before;
#   so does the read after LINK reads cut up front that measured nothing (parts too short
#   to give a rate), so that a verdict of slow is measured again, never kept for good.
#   tools/bench_wan.py measures it.
#
# NOTE [ A link's latency before its reads ]
# A pool that has measured nothing yet would probe its first long reads, each held to one
# connection for its first PROBE bytes and then the latency of the parts cut after it. But
# on object storage a dataset's first long reads come after its manifest and sidecars:
# small GETs whose time to headers is the link's latency already (``RetriedIO.latency``:
# the least of the process's last few GETs of at most ``SMALL_ANSWER`` bytes from the
# storage's endpoint sent while none of its long reads were streaming, which a forked
# DataLoader worker keeps from its parent; a larger one's time to headers also holds the
# server's work on the object, and a small one sent beside streams may wait behind them).
# Where that is LONG_LATENCY or more, a connection faster than PART_MIN / LONG_LATENCY (33
# MiB/s) is held by its round trips (``_long_link``) and a slower one is slow: a probe
# would cut the read either way, so it is cut up front into PARTS parts (a connection
# found fast is then cut no more). Below it the first reads probe as before: loopback and
# a LAN answer small GETs in a few milliseconds, and moto (a server in Python that copies
# the whole object for every ranged GET, where parts up front make the first batch later,
# not sooner) in 5 to 29 as a process of its own on a busy 2-core machine, so it may cross
# the line there now and then: a test server, not a store. So does a spawned worker whose
# storage made no GET yet. A verdict of slow still counts among the reads cut up front
# that measured nothing. tools/bench_matrix.py's WAN cells measure it.
PART_MIN = 1 * 2**20
PART_MAX = 8 * 2**20
PARTS = 4  # a read is cut into at most this many parts (this many where nothing was measured;
# on a long link, a long read into one per PART_MAX where that is more)
CHUNK = PART_MIN  # the first GET's body is read in pieces of this many bytes
PROBE = 2 * CHUNK  # its bytes before it may be cut (NOTE [ Reads in parts ])
FAST_CONNECTION = 256 * 2**20  # bytes/s: a GET this fast is never cut
FAST_PROOF = 4 * 2**20  # bytes a GET reads at FAST_CONNECTION before its pool cuts no more reads
PART_LATENCIES = 2  # a part lasts about this many latencies at the measured rate (half on a long link)
GETS_IN_FLIGHT = 24  # a pool's long reads are cut only while they have fewer GETs in flight
# A streamed read shorter than this is never cut (its rest after the probe is shorter than
# two parts), so it is one plain GET read at once: no chunks, no probe, no buffer to fill.
NEVER_CUT = PROBE + 2 * PART_MIN
# s: a storage answering this late is a long link (NOTE [ A link's latency before its reads ])
LONG_LATENCY = 0.03


# Whom a read tells of its bytes as they arrive (NOTE [ Read budget ] in dataset/budget.py):
# passed down by whoever starts the read, None where nobody counts them.
Tell = Callable[[int], None] | None


def split(
    rng: ByteRange, parts: int = PARTS, *, minimum: int = PART_MIN, maximum: int = PART_MAX
) -> list[ByteRange]:
    """``rng`` cut into about ``parts`` consecutive ranges of ``minimum`` to ``maximum``
    bytes (a range shorter than two minimums stays whole)."""
    size = -(-rng.length // max(1, parts))
    size = min(max(size, minimum), maximum)
    if rng.length < 2 * minimum or size >= rng.length:
        return [rng]
    return [ByteRange(start, min(start + size, rng.end)) for start in range(rng.start, rng.end, size)]


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
    planned = _planned(rng, pool, answers) if pool is not None else [rng]  # cut up front: no probe
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
        parts = _cut(ByteRange(stream.pos, rng.end), stream, pool, answers)
        while len(parts) == 1:  # fast or busy so far: a chunk more, and look again
            stream.read_to(min(rng.end, stream.pos + CHUNK), sink)
            if not pool.fast and stream.carried(FAST_PROOF) >= FAST_CONNECTION:
                pool.proven_fast()  # NOTE [ Reads in parts ]
            parts = _cut(ByteRange(stream.pos, rng.end), stream, pool, answers)
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


def _planned(rng: ByteRange, pool: ReadPool, answers: float | None = None) -> list[ByteRange]:
    """``rng`` cut up front where the pool's last GETs measured a slow link, as ``_cut``
    would cut it after a probe (NOTE [ Reads in parts ]), or, before the pool measured
    any, where its storage's GETs took ``answers`` >= LONG_LATENCY s to answer (NOTE [ A
    link's latency before its reads ]); else whole (it probes)."""
    link = pool.link()
    if link is None:  # no rate yet: as many parts as a read may have, on a long link only
        late = answers is not None and answers >= LONG_LATENCY
        return _cut_up_front(rng, pool, PART_MIN, answers) if late and not pool.fast else [rng]
    latency, rate = link
    if pool.fast or rate >= FAST_CONNECTION:
        return [rng]
    if not _long_link(latency, rate) and pool.rate() >= FAST_CONNECTION:
        return [rng]
    return _cut_up_front(rng, pool, max(PART_MIN, int(_part_bytes(latency, rate, answers))), answers)


def _cut_up_front(rng: ByteRange, pool: ReadPool, part: int, answers: float | None) -> list[ByteRange]:
    """``rng`` in parts of about ``part`` bytes, as many as the pool allows (at least two:
    else whole, as after LINK reads cut up front that measured nothing)."""
    count = min(
        _most_parts(rng.length, answers), pool.threads, GETS_IN_FLIGHT - pool.gets, -(-rng.length // part)
    )
    if count < 2 or not pool.cut_up_front():
        return [rng]
    return split(rng, count, maximum=max(PART_MAX, -(-rng.length // count)))


def _most_parts(length: int, answers: float | None) -> int:
    """The most parts a read of ``length`` bytes is cut into: PARTS, or on a long link
    (small GETs took ``answers`` >= LONG_LATENCY s) one per PART_MAX where that is more
    (NOTE [ Reads in parts ])."""
    if answers is not None and answers >= LONG_LATENCY:
        return max(PARTS, length // PART_MAX)
    return PARTS


def _part_bytes(latency: float, rate: float, answers: float | None) -> float:
    """The bytes of a part that lasts PART_LATENCIES latencies at ``rate``, half that where
    small GETs took ``answers`` >= LONG_LATENCY s: the wire's round trip (NOTE [ Reads in
    parts ])."""
    latencies = PART_LATENCIES / 2 if answers is not None and answers >= LONG_LATENCY else PART_LATENCIES
    return rate * latencies * latency


def _long_link(latency: float, rate: float) -> bool:
    """Whether a connection of ``latency`` (s) and ``rate`` (bytes/s) carries at least
    PART_MIN bytes in one latency: held by its round trips, so the reads in flight
    together carry more the more of them there are (NOTE [ Reads in parts ])."""
    return latency * rate >= PART_MIN


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


def _cut(
    rest: ByteRange, stream: _Stream, pool: ReadPool | None, answers: float | None = None
) -> list[ByteRange]:
    """The parts of ``rest``: one (the probing GET reads on) while its connection is fast
    or not yet measured, or the pool's long reads have ``GETS_IN_FLIGHT`` GETs in flight
    (this one among them), else the first for the probing GET and the others for the pool."""
    rate = stream.rate()
    if not rest.length:
        return []
    room = GETS_IN_FLIGHT - pool.gets if pool is not None else 0
    if pool is None or room < 1 or stream.latency is None or rate is None or rate >= FAST_CONNECTION:
        return [rest]
    if pool.fast:  # a GET of it read fast: slower ones are slowed by CPU, not the wire
        return [rest]
    if not _long_link(stream.latency, rate) and pool.rate() >= FAST_CONNECTION:
        return [rest]  # the reads in flight together: CPU-bound, not the wire
    part = max(1.0, _part_bytes(stream.latency, rate, answers))
    count = min(_most_parts(rest.length, answers), pool.threads, 1 + room, -(-rest.length // int(part)))
    if count < 2:  # a part would not last its latencies: the GET reads on
        return [rest]
    return split(rest, count, maximum=max(PART_MAX, -(-rest.length // count)))  # at most ``count``


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
