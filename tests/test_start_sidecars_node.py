"""Start at scale: the first-window sidecars of a node's ranks, read once per node without
a cache directory (NOTE [ First sidecars once per node ] in shardstream/dataset/startup.py).
Two ranks of one node run in this process, one after the other, over moto behind a proxy
that counts GETs; each still gets its exact plan.
"""

from __future__ import annotations

import os
import tempfile

import shardstream
from shardstream.dataset.startup import first_window_shards
from tests import test_start_storm
from tests.test_start_storm import BATCH, MANIFEST, CountingProxy, keys_of, planned_keys

counted = test_start_storm.counted  # the fixture: a dataset behind a counting proxy


def run_rank(url: str, options: dict, rank: int, world: int) -> tuple[set[int], list[str], list[str]]:
    """Rank ``rank``'s epoch through a DataLoader of 2 workers: its workers' first shards,
    the keys it got and the keys its plan says."""
    dataset = shardstream.StreamingDataset(
        url, num_replicas=world, rank=rank, shuffle=True, seed=3, decode=False, storage_options=options
    )
    loader = shardstream.DataLoader(
        dataset, batch_size=BATCH, num_workers=2, collate_fn=keys_of, multiprocessing_context="fork"
    )
    plan = dataset.make_plan(num_workers=2, consume=False)
    firsts = {shard for worker in (0, 1) for shard in first_window_shards(plan, rank, worker)}
    got = [key for batch in loader for key in batch]
    return firsts, got, planned_keys(dataset, rank)


def sidecar_gets(proxy: CountingProxy, shard: int) -> int:
    return proxy.of(f"/shard-{shard:06d}.tar.idx")


def test_two_ranks_of_a_node_read_a_first_sidecar_once(counted, tmp_path, monkeypatch):
    url, options, proxy = counted
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the node's folder
    firsts = []
    for rank in (0, 1):
        shards, got, planned = run_rank(url, options, rank, world=2)
        assert got == planned, f"rank {rank} did not get its plan"
        firsts.append(shards)
    shared = firsts[0] & firsts[1]
    assert shared, "the ranks' first windows share no shard: pick another seed"
    assert proxy.of(MANIFEST) == 1
    for shard in firsts[0] | firsts[1]:
        assert sidecar_gets(proxy, shard) == 1, proxy.per_sidecar()
    assert max(proxy.per_sidecar().values()) == 1, proxy.per_sidecar()


def test_a_bad_copy_is_read_again_and_one_rank_keeps_none(counted, tmp_path, monkeypatch):
    url, options, proxy = counted
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    firsts, got, planned = run_rank(url, options, 0, world=2)
    assert got == planned
    folder = tmp_path / f"shardstream-start-{os.getuid()}"
    copies = sorted(folder.glob("sidecar-*.idx"))
    assert len(copies) == len(firsts)
    for copy in copies:  # another shard's sidecar (or garbage) under each name
        copy.write_bytes(copies[0].read_bytes() if copy != copies[0] else b"not a sidecar")
    firsts_again, got, planned = run_rank(url, options, 0, world=2)
    assert got == planned
    assert firsts_again == firsts
    for shard in firsts:  # every copy failed its check, so the main process read each again
        assert sidecar_gets(proxy, shard) == 2, proxy.per_sidecar()
    alone = tmp_path / "alone"
    alone.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(alone))
    run_rank(url, options, 0, world=1)
    assert list(alone.iterdir()) == []
