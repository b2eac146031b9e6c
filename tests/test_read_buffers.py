"""NOTE [ Reusing read buffers ] in storage/sinks.py: a long read's buffer is taken again
only once nothing else holds it, and idle ones beyond the bound are let go."""

from __future__ import annotations

import gc

import numpy as np

from shardstream.storage.read_pool import ReadPool
from shardstream.storage.sinks import Buffers, MemorySink
from shardstream.types import ByteRange

MB = 2**20


def _owner(view: memoryview) -> int:
    """Which buffer ``view`` is of (its id: holding the buffer itself would keep it taken)."""
    return id(view.obj)


def test_a_buffer_is_taken_again_only_once_nothing_holds_it():
    buffers = Buffers()
    first = buffers.take(5 * MB)
    first[:3] = b"abc"
    owner = _owner(first)
    second = buffers.take(5 * MB)  # the first is still held: a new one
    assert _owner(second) != owner
    kept = bytes(first[:3])  # a copy does not hold it
    del first
    gc.collect()
    third = buffers.take(4 * MB)
    assert _owner(third) == owner  # free, and long enough
    assert len(third) == 4 * MB
    assert kept == b"abc"
    assert buffers.count == 2


def test_any_view_of_a_buffer_keeps_it_from_being_taken():
    buffers = Buffers()
    data = buffers.take(5 * MB)
    owner = _owner(data)
    sample = data[10:20]  # a sample's view
    array = np.frombuffer(data[100:200], dtype=np.uint8)  # an array over it
    del data
    assert _owner(buffers.take(5 * MB)) != owner
    del sample
    assert _owner(buffers.take(5 * MB)) != owner  # the array still holds it
    del array
    assert _owner(buffers.take(5 * MB)) == owner


def test_a_small_read_never_takes_a_much_larger_buffer_and_idle_ones_are_let_go():
    buffers = Buffers(idle=8 * MB)
    big = buffers.take(16 * MB)
    big_owner = _owner(big)
    del big
    small = buffers.take(6 * MB)  # the free 16 MB one is more than twice as long
    assert _owner(small) != big_owner
    assert buffers.count == 1  # and it was let go: idle beyond 8 MB
    del small
    buffers.clear()
    assert buffers.count == 0


def test_a_memory_sink_of_a_pool_fills_a_reused_buffer_exactly():
    pool = ReadPool(2)
    pool.buffers.clear()  # the process's: none left by an earlier test to be taken instead
    try:
        sink = MemorySink(ByteRange(100, 100 + 5 * MB), pool.buffers)
        sink.view(ByteRange(100, 100 + 5 * MB))[:] = b"x" * (5 * MB)
        assert bytes(sink.buffer) == b"x" * (5 * MB)
        owner = _owner(sink.buffer)
        del sink
        again = MemorySink(ByteRange(0, 5 * MB - 7), pool.buffers)
        assert _owner(again.buffer) == owner
        assert len(again.buffer) == 5 * MB - 7
        del again
    finally:
        pool.close()
    other = ReadPool(2)  # the next reader (the next epoch's) takes the buffers the last one kept
    try:
        assert _owner(MemorySink(ByteRange(0, 5 * MB), other.buffers).buffer) == owner
    finally:
        other.close()


def test_a_closing_pool_keeps_at_most_the_idle_bound():
    buffers = Buffers(idle=8 * MB)
    views = [buffers.take(6 * MB) for _ in range(3)]
    assert buffers.count == 3
    del views
    buffers.trim()
    assert buffers.count == 1  # 6 MB kept, within 8 MB
