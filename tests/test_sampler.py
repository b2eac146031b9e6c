"""``ShardSampler``: a drop-in for DistributedSampler, in one process and in two real
processes with a gloo process group."""

from __future__ import annotations

import collections
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import ConcatDataset, DataLoader, DistributedSampler

from shardstream.errors import StateError, UsageError
from shardstream.plan.mixture import Mixture, StreamSpec
from shardstream.sampler import ShardSampler

SIZES = [13, 0, 1, 20, 8, 17, 5]  # 64 samples


def indices(sampler: ShardSampler) -> list[int]:
    return [int(i) for batch in DataLoader(range(sum(SIZES)), batch_size=5, sampler=sampler) for i in batch]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("ranks", [1, 3, 7])
def test_like_distributed_sampler_every_index_once_equal_lengths(ranks, drop_last):
    total = sum(SIZES)
    samplers = [
        ShardSampler(SIZES, num_replicas=ranks, rank=r, seed=4, drop_last=drop_last) for r in range(ranks)
    ]
    reference = [
        DistributedSampler(range(total), num_replicas=ranks, rank=r, drop_last=drop_last)
        for r in range(ranks)
    ]
    got = [indices(s) for s in samplers]
    assert [(s.num_samples, s.total_size) for s in samplers] == [
        (d.num_samples, d.total_size) for d in reference
    ]
    assert [len(g) for g in got] == [len(s) for s in samplers] == [len(d) for d in reference]
    counts = collections.Counter(i for g in got for i in g)
    if drop_last:
        assert set(counts.values()) == {1}
    else:
        assert set(counts) == set(range(total))
        assert sum(counts.values()) - total == len(got[0]) * ranks - total < ranks


def test_indices_are_shard_runs_in_manifest_order_without_shuffle():
    sampler = ShardSampler(SIZES, num_replicas=2, rank=1, shuffle=False)
    assert list(sampler) == list(range(32, 64))


def test_set_epoch_changes_the_order_and_the_same_epoch_repeats_it():
    sampler = ShardSampler(SIZES, num_replicas=2, rank=0, seed=1)
    first = list(sampler)
    assert list(sampler) == first
    sampler.set_epoch(1)
    assert list(sampler) != first
    other_seed = ShardSampler(SIZES, num_replicas=2, rank=0, seed=2)
    assert list(other_seed) != first


def test_rank_and_world_size_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    sampler = ShardSampler(SIZES)
    assert (sampler.rank, sampler.num_replicas) == (2, 3)
    assert list(sampler) == list(ShardSampler(SIZES, num_replicas=3, rank=2))
    with pytest.raises(UsageError):
        ShardSampler(SIZES, num_replicas=2, rank=2)


def test_resume_mid_epoch_same_and_other_world_size():
    full = {r: list(ShardSampler(SIZES, num_replicas=2, rank=r, seed=5)) for r in range(2)}
    states, seen = [], []
    for r in range(2):
        sampler = ShardSampler(SIZES, num_replicas=2, rank=r, seed=5)
        iterator = iter(sampler)
        seen += [next(iterator) for _ in range(10)]
        states.append(json.loads(json.dumps(sampler.state_dict(10))))
    assert states[0] == states[1]  # ranks in lockstep share one state

    same = ShardSampler(SIZES, num_replicas=2, rank=1, seed=5)
    same.load_state_dict(states[1])
    assert len(same) == len(full[1]) - 10
    assert list(same) == full[1][10:]

    for r in range(3):
        other = ShardSampler(SIZES, num_replicas=3, rank=r, seed=5)
        other.set_epoch(7)  # a loaded state sets the epoch; set_epoch to it keeps it
        other.load_state_dict(states[0])
        other.set_epoch(0)
        seen += list(other)
    counts = collections.Counter(seen)
    assert set(counts) == set(range(64))
    assert sum(counts.values()) - 64 <= 2  # padding of the new pass only (64 = 2 x 32)

    other.set_epoch(1)  # the next epoch starts fresh
    assert len(other) == 22


def test_a_state_of_another_dataset_or_seed_is_refused():
    state = ShardSampler(SIZES, num_replicas=2, rank=0, seed=5).state_dict(0)
    with pytest.raises(StateError, match="seed"):
        ShardSampler(SIZES, num_replicas=2, rank=0, seed=6).load_state_dict(state)
    sampler = ShardSampler([*SIZES, 1], num_replicas=2, rank=0, seed=5)
    with pytest.raises(StateError, match="another dataset"):
        sampler.load_state_dict(state)
    assert len(sampler) == 33  # a refused state changes nothing


def _rank_main(rank: int, world_size: int, folder: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size
    )
    try:
        sampler = ShardSampler(SIZES, seed=11)  # rank and world size from torch.distributed
        loader = DataLoader(range(sum(SIZES)), batch_size=4, sampler=sampler)
        epochs = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            epochs.append([int(i) for batch in loader for i in batch])
        gathered: list = [None] * world_size
        dist.all_gather_object(
            gathered, {"rank": sampler.rank, "world": sampler.num_replicas, "epochs": epochs}
        )
        if rank == 0:
            with open(f"{folder}/result.json", "w") as f:
                json.dump(gathered, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_real_processes_with_gloo_see_every_index_once(tmp_path):
    mp.spawn(_rank_main, args=(2, str(tmp_path)), nprocs=2, join=True)
    result = json.loads((tmp_path / "result.json").read_text())
    assert [(r["rank"], r["world"]) for r in result] == [(0, 2), (1, 2)]
    for epoch in range(2):
        per_rank = [r["epochs"][epoch] for r in result]
        assert len(per_rank[0]) == len(per_rank[1]) == 32
        assert sorted(per_rank[0] + per_rank[1]) == list(range(64))
    assert result[0]["epochs"][0] != result[0]["epochs"][1]
    assert torch.distributed.is_initialized() is False


# -- over a mixture (NOTE [ Mixtures ], NOTE [ Composed batches ]) --------------------------

STREAMS = [([9, 4, 13], {"repeat": 0.5}), ([6, 6], {"repeat": 2.5}), ([11, 0, 7], {"choose": 10})]
MIXED = {
    "random local": ("random", {}),
    "random global": ("random", dict(order="global", global_batch_size=12, read_lanes=3)),
    "stratified": ("stratified", dict(order="global", global_batch_size=12, read_lanes=3)),
    "per_stream": ("per_stream", dict(order="global", global_batch_size=12, read_lanes=3)),
}


def mixture_of(mix, *, choose_last=10):
    specs = [StreamSpec(f"s3://b/{s}", sizes, f"fp{s}", **how) for s, (sizes, how) in enumerate(STREAMS)]
    specs[-1] = StreamSpec("s3://b/2", STREAMS[-1][0], "fp2", choose=choose_last)
    return Mixture(specs, mix=mix)


def concat_dataset():
    """Each stream's samples as (stream, shard, index): what ConcatDataset indexing gives."""
    return ConcatDataset(
        [
            [(s, shard, i) for shard, n in enumerate(sizes) for i in range(n)]
            for s, (sizes, _) in enumerate(STREAMS)
        ]
    )


def mixed_batches(mixture, options, ranks, state=None, size=12):
    """Every rank's indices, cut into global batches of ``size`` (rank r's k-th part in order)."""
    parts = []
    for rank in range(ranks):
        sampler = ShardSampler(mixture, num_replicas=ranks, rank=rank, seed=5, **options)
        if state is not None:
            sampler.load_state_dict(state)
        parts.append(list(sampler))
    per = size // ranks
    return [[i for part in parts for i in part[k * per : (k + 1) * per]] for k in range(len(parts[0]) // per)]


@pytest.mark.parametrize("name", MIXED)
def test_mixture_indices_are_concat_dataset_indices_with_each_stream_its_quota(name):
    mix, options = MIXED[name]
    mixture, dataset = mixture_of(mix), concat_dataset()
    sampler = ShardSampler(mixture, num_replicas=1, rank=0, seed=5, **options)
    got = collections.Counter(dataset[i][0] for i in sampler)
    quotas = sampler.plan().quotas if mix != "random" else mixture.quotas
    padding = sum(got.values()) - sum(quotas)
    assert 0 <= padding < 12
    assert all(got[s] >= q for s, q in enumerate(quotas))
    if mix != "random":
        assert [got[s] for s in range(len(STREAMS))] == list(quotas)
    assert mixture.sample_offsets.tolist()[1:] == dataset.cumulative_sizes


@pytest.mark.parametrize("name", ["random global", "stratified", "per_stream"])
def test_mixture_global_batches_on_any_world_size_and_resume_on_another(name):
    mix, options = MIXED[name]
    mixture = mixture_of(mix)
    whole = mixed_batches(mixture, options, 1)
    assert mixed_batches(mixture, options, 4) == mixed_batches(mixture, options, 3) == whole
    sampler = ShardSampler(mixture, num_replicas=2, rank=1, seed=5, **options)
    state = sampler.state_dict(2 * 6)  # two batches of 6 on each of 2 ranks
    assert state["mix"] == mix
    assert mixed_batches(mixture, options, 6, state=state) == whole[2:]


def test_a_list_of_streams_mixes_at_random_and_states_name_the_stream():
    specs = list(mixture_of("random").streams)
    sampler = ShardSampler(specs, num_replicas=2, rank=0, seed=5)
    assert sampler.mixture is not None
    assert sampler.mixture.mix == "random"
    state = sampler.state_dict(3)
    other = ShardSampler(mixture_of("random", choose_last=11), num_replicas=2, rank=0, seed=5)
    with pytest.raises(StateError, match=r"stream 2 \(s3://b/2\) was saved with quota=10"):
        other.load_state_dict(state)
    with pytest.raises(StateError, match="of a mixture of datasets"):
        ShardSampler([5, 4], num_replicas=1, rank=0).load_state_dict(state)
