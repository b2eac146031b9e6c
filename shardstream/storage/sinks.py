"""Where a long read's bytes go as they arrive: a ``Sink`` (NOTE [ Reads in parts ] in parts.py).

``MemorySink`` is one buffer allocated up front (NOTE [ Read buffers ]); the cache's sink
writes to its entry's temp file (``cached.py``).
"""

from __future__ import annotations

import contextlib
import mmap

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
# cannot use: a window's worth more RSS. tools/bench_memory.py measures the RSS.


class MemorySink(Sink):
    """Into one buffer for the bytes of ``rng``, allocated up front (``buffer``; NOTE
    [ Read buffers ])."""

    def __init__(self, rng: ByteRange) -> None:
        self.start = rng.start
        self.buffer = memoryview(new_buffer(rng.length))

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
