"""Where a long read is cut into parts, and how many: the rules of NOTE [ Reads in parts ]
and NOTE [ A link's latency before its reads ]; parts.py reads the parts they give.
A GET is known here only by what a pool measures of it (``Measured``: its latency and rate).
"""

from __future__ import annotations

from shardstream.storage.read_pool import Measured, ReadPool
from shardstream.types import ByteRange

__all__ = [
    "CHUNK",
    "FAST_CONNECTION",
    "FAST_PROOF",
    "GETS_IN_FLIGHT",
    "LONG_LATENCY",
    "NEVER_CUT",
    "PARTS",
    "PART_LATENCIES",
    "PART_MAX",
    "PART_MIN",
    "PROBE",
    "cut",
    "long_answers",
    "long_link",
    "part_bytes",
    "planned_parts",
    "proves_fast",
    "split",
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
#   a connection that carries at least PART_MIN bytes in one latency (``long_link``). On a
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
# MiB/s) is held by its round trips (``long_link``) and a slower one is slow: a probe
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


def planned_parts(rng: ByteRange, pool: ReadPool, answers: float | None = None) -> list[ByteRange]:
    """``rng`` cut up front where the pool's last GETs measured a slow link, as ``cut``
    would cut it after a probe (NOTE [ Reads in parts ]), or, before the pool measured
    any, where its storage's GETs took ``answers`` >= LONG_LATENCY s to answer (NOTE [ A
    link's latency before its reads ]); else whole (it probes)."""
    link = pool.link()
    if link is None:  # no rate yet: as many parts as a read may have, on a long link only
        late = long_answers(answers) and not pool.fast
        return _cut_up_front(rng, pool, PART_MIN, answers) if late else [rng]
    latency, rate = link
    if pool.fast or rate >= FAST_CONNECTION:
        return [rng]
    if not long_link(latency, rate) and pool.rate() >= FAST_CONNECTION:
        return [rng]
    return _cut_up_front(rng, pool, max(PART_MIN, int(part_bytes(latency, rate, answers))), answers)


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
    if long_answers(answers):
        return max(PARTS, length // PART_MAX)
    return PARTS


def part_bytes(latency: float, rate: float, answers: float | None) -> float:
    """The bytes of a part that lasts PART_LATENCIES latencies at ``rate``, half that where
    small GETs took ``answers`` >= LONG_LATENCY s: the wire's round trip (NOTE [ Reads in
    parts ])."""
    latencies = PART_LATENCIES / 2 if long_answers(answers) else PART_LATENCIES
    return rate * latencies * latency


def long_answers(answers: float | None) -> bool:
    """Whether small GETs that took ``answers`` s to answer (None: none measured) tell a
    long link (NOTE [ A link's latency before its reads ])."""
    return answers is not None and answers >= LONG_LATENCY


def long_link(latency: float, rate: float) -> bool:
    """Whether a connection of ``latency`` (s) and ``rate`` (bytes/s) carries at least
    PART_MIN bytes in one latency: held by its round trips, so the reads in flight
    together carry more the more of them there are (NOTE [ Reads in parts ])."""
    return latency * rate >= PART_MIN


def cut(
    rest: ByteRange, stream: Measured, pool: ReadPool | None, answers: float | None = None
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
    if not long_link(stream.latency, rate) and pool.rate() >= FAST_CONNECTION:
        return [rest]  # the reads in flight together: CPU-bound, not the wire
    part = max(1.0, part_bytes(stream.latency, rate, answers))
    count = min(_most_parts(rest.length, answers), pool.threads, 1 + room, -(-rest.length // int(part)))
    if count < 2:  # a part would not last its latencies: the GET reads on
        return [rest]
    return split(rest, count, maximum=max(PART_MAX, -(-rest.length // count)))  # at most ``count``


def proves_fast(carried: float) -> bool:
    """Whether a GET that carried ``carried`` bytes/s over its first FAST_PROOF bytes since
    its headers came proves its pool fast, so that it cuts no more reads (NOTE [ Reads in
    parts ])."""
    return carried >= FAST_CONNECTION
