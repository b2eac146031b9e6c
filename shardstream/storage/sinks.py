"""Where a long read's bytes go as they arrive: a ``Sink`` (NOTE [ Reads in parts ] in cuts.py).

``MemorySink`` is one buffer allocated up front (NOTE [ Read buffers ]); the cache's sink
writes to its entry's temp file (``cached.py``).
"""

from __future__ import annotations

import contextlib
import mmap
import sys
import threading

from shardstream.types import ByteRange


class Sink:
    """Where a long read's bytes go: ``view(rng)`` is the buffer for the bytes of ``rng``
    and ``done(rng, view)`` takes it once they are in. Parts come in any order and from
    any thread; within one part, in order."""

    def view(self, rng: ByteRange) -> memoryview:
        raise NotImplementedError

    def done(self, rng: ByteRange, view: memoryview) -> None:
        """Nothing to do for a buffer that ``view`` sliced."""


# NOTE [ Read buffers ]
# A long read's buffer (``MemorySink``) is an anonymous private mapping, not a
# ``bytearray``: a bytearray is zeroed when made, so its every page is in the RSS before
# the first byte arrives (a window's reads at once), and one of tens of MB freed by a read
# thread stays in that thread's malloc arena, RSS never given back. A mapping's pages come
# as its bytes arrive and go when it is dropped. MAP_PRIVATE: a fork child's copy is its
# own (a shared anonymous mapping is not).
# Each 4 KiB page of new memory costs a page fault as the first byte lands in it: for large
# samples, a large share of a worker's CPU. A buffer of ``HUGE_BUFFER`` or more asks for
# transparent huge pages (``MADV_HUGEPAGE``: one fault per 2 MiB where the kernel has them,
# as in its default "madvise" mode). Reusing buffers would save as much but keeps memory
# that the next window's reads, started before this one is decoded (NOTE [ Read budget ]),
# cannot use: a window's worth more RSS, unless they are taken again only once nobody
# holds them (NOTE [ Reusing read buffers ]). tools/bench_memory.py measures the RSS.


class MemorySink(Sink):
    """Into one buffer for the bytes of ``rng``, allocated up front (``buffer``; NOTE
    [ Read buffers ]), or taken from ``buffers`` (NOTE [ Reusing read buffers ])."""

    def __init__(self, rng: ByteRange, buffers: Buffers | None = None) -> None:
        self.start = rng.start
        self.buffer = buffers.take(rng.length) if buffers is not None else memoryview(new_buffer(rng.length))

    def view(self, rng: ByteRange) -> memoryview:
        return self.buffer[rng.start - self.start : rng.end - self.start]


# A buffer of at least this many bytes asks for huge pages (NOTE [ Read buffers ]).
HUGE_BUFFER = 4 * 2**20
_HUGE = getattr(mmap, "MADV_HUGEPAGE", None)


def new_buffer(size: int) -> mmap.mmap:
    """``size`` bytes of memory for a long read (NOTE [ Read buffers ])."""
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    if size >= HUGE_BUFFER and _HUGE is not None:
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages
            buffer.madvise(_HUGE)
    return buffer


# NOTE [ Reusing read buffers ]
# The kernel zeroes every page of a new mapping as the first byte lands in it: for a
# stream of large samples, as much of the process's CPU as the copy of the bytes out of
# the socket. So a reader's long reads take their buffers from ``Buffers``, which keeps
# every buffer it handed out and gives one again only once nothing but it holds the
# buffer: no view of it, no array, no sample left anywhere (its reference count, the one
# thing that sees them all; a buffer still held is never written). A buffer is taken for
# a read of at least half its length (a small read never pins a large buffer), and a new
# one is rounded up to huge pages so reads of about one size share them. The buffers are
# the process's, shared by its readers, so the next epoch's reader (a new one) takes the
# last one's. Buffers nobody holds beyond ``IDLE_BUFFERS`` bytes are let go when a buffer
# is taken, when a reader closes, and as each window's reads are let go once it is
# decoded (``trim_read_buffers``: else a shuffled window's reads, freed, stayed kept until
# the next window's first read, beside that window and the samples of this one): the RSS
# is that of the reads held at once, as without reuse, and at most that many bytes of
# buffers waiting to be taken again.
IDLE_BUFFERS = 64 * 2**20  # a default read budget (dataset/budget.py) of buffers
_ROUND = 2 * 2**20  # a new buffer's length is a multiple of this (a huge page)


def _refs(buffers: list[mmap.mmap], at: int) -> int:
    return sys.getrefcount(buffers[at])


_ONLY_HELD_HERE = _refs([mmap.mmap(-1, 1)], 0)  # the count of a buffer held by the list alone


class Buffers:
    """Buffers of long reads, each taken again once nothing else holds it (NOTE [ Reusing
    read buffers ]); thread-safe."""

    def __init__(self, idle: int = IDLE_BUFFERS) -> None:
        self.idle = idle
        self._lock = threading.Lock()
        self._held: list[mmap.mmap] = []

    def take(self, size: int) -> memoryview:
        """A buffer of ``size`` bytes (its bytes undefined until written)."""
        with self._lock:
            free = [i for i in range(len(self._held)) if _refs(self._held, i) == _ONLY_HELD_HERE]
            fits = [i for i in free if size <= len(self._held[i]) <= 2 * size]
            chosen = min(fits, key=lambda i: len(self._held[i])) if fits else None
            if chosen is not None:
                buffer = self._held[chosen]
                free.remove(chosen)
            else:
                buffer = new_buffer(max(size, -(-size // _ROUND) * _ROUND) if size >= HUGE_BUFFER else size)
                self._held.append(buffer)
            self._let_go(free)
            return memoryview(buffer)[:size]

    def _let_go(self, free: list[int]) -> None:
        """Drop free buffers (the largest first) until those left hold at most ``idle`` bytes."""
        left = sum(len(self._held[i]) for i in free)
        dropped = set()
        for i in sorted(free, key=lambda i: -len(self._held[i])):
            if left <= self.idle:
                break
            left -= len(self._held[i])
            dropped.add(i)
        if dropped:
            self._held = [b for i, b in enumerate(self._held) if i not in dropped]

    def trim(self) -> None:
        """Let go of the buffers nobody holds beyond ``idle`` bytes of them."""
        with self._lock:
            self._let_go([i for i in range(len(self._held)) if _refs(self._held, i) == _ONLY_HELD_HERE])

    def clear(self) -> None:
        """Forget every buffer (those still held elsewhere live on with their holders)."""
        with self._lock:
            self._held = []

    @property
    def count(self) -> int:
        """Buffers kept, held elsewhere or not."""
        return len(self._held)
