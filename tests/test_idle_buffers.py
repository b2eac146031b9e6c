"""Read buffers nobody holds are let go past ``IDLE_BUFFERS`` as each window's reads are let
go, not only when a buffer is next taken (NOTE [ Reusing read buffers ] in
shardstream/storage/sinks.py): a shuffled window's reads, freed once it is decoded, stay no
longer than the idle bound while its samples are taken."""

from __future__ import annotations

import os

import pytest

import shardstream
from shardstream.pack import ShardWriter
from shardstream.storage import ranged, read_pool, sinks

MB = 2**20


@pytest.fixture
def buffers(monkeypatch):
    """This process's read buffers, with an idle bound of one MiB; local reads of 64 KiB or
    more go into them."""
    monkeypatch.setattr(ranged, "LOCAL_BUFFERED", 64 * 1024)
    held = read_pool._BUFFERS.get()
    held.clear()
    monkeypatch.setattr(held, "idle", MB)
    yield held
    held.clear()


def _idle(buffers: sinks.Buffers) -> int:
    kept = buffers._held
    return sum(len(kept[i]) for i in range(len(kept)) if sinks._refs(kept, i) == sinks._ONLY_HELD_HERE)


def test_a_window_s_freed_reads_stay_no_longer_than_the_idle_bound(tmp_path, buffers):
    url = str(tmp_path / "ds")
    with ShardWriter(url, format="tar", samples_per_shard=8) as writer:
        for i in range(64):  # 8 shards of ~2 MiB: two shuffled windows of four
            writer.write({"__key__": f"{i:04d}", "bin": os.urandom(256 * 1024)})
    dataset = shardstream.StreamingDataset(url, shuffle=True, seed=0, decode=False, local_reads="copy")
    idle, keys = [], []
    for sample in dataset:
        keys.append(sample["__key__"])
        idle.append(_idle(buffers))
    assert sorted(keys) == [f"{i:04d}" for i in range(64)]
    assert buffers.count > 0, "no read went into a buffer"
    assert max(idle) <= MB  # each window's reads, once freed, were let go but one MiB
