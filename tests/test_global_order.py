"""order="global" through the real stack: StreamingDataset and shardstream.DataLoader
(real worker processes) on simulated ranks, and ShardSampler, give the same global
batches on every topology, and a state saved on one resumes on another."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from shardstream import DataLoader, EpochPlan, MapDataset, PlanConfig, ShardSampler, StreamingDataset
from shardstream.errors import PlanError, StateError, UsageError
from shardstream.plan.config import GLOBAL_SMALL_SAMPLE, GLOBAL_WINDOW_BYTES, global_window, shard_sizes_array
from tests.resume_harness import collate_keys, write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SIZES = [17, 9, 22, 14, 6, 20, 0, 5]  # 93 samples: the last global batch of 12 is padded
GLOBAL = 12
OPTIONS = dict(seed=3, order="global", global_batch_size=GLOBAL, read_lanes=4, shuffle_window=36)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("global") / "ds")
    write_dataset(url, SIZES)
    return url


def loaders(url, world, workers, state=None):
    made = []
    for rank in range(world):
        dataset = StreamingDataset(url, num_replicas=world, rank=rank, decode=False, **OPTIONS)
        loader = DataLoader(dataset, batch_size=GLOBAL // world, num_workers=workers, collate_fn=collate_keys)
        if state is not None:
            loader.load_state_dict(state)
        made.append(loader)
    return made


def global_batches(made, stop=None):
    """Global batch k: every rank's k-th batch (ranks step in lockstep)."""
    iterators = [iter(loader) for loader in made]
    batches = []
    for number, parts in enumerate(zip(*iterators, strict=True)):
        batches.append([key for part in parts for key in part])
        if stop is not None and number + 1 == stop:
            break
    return batches, [loader.state_dict() for loader in made]


def test_dataloader_global_batches_are_the_same_on_every_topology_and_resume(url):
    whole, _ = global_batches(loaders(url, 2, 2))
    assert len(whole) == -(-sum(SIZES) // GLOBAL)
    assert all(len(batch) == GLOBAL for batch in whole)
    assert len({key for batch in whole for key in batch}) == sum(SIZES)
    assert global_batches(loaders(url, 1, 3))[0] == whole
    assert global_batches(loaders(url, 3, 0))[0] == whole
    head, states = global_batches(loaders(url, 2, 2), stop=3)
    assert head == whole[:3]
    assert all(state == states[0] for state in states)
    assert states[0]["plan"]["global_batches"] == 3
    assert global_batches(loaders(url, 1, 3, state=states[0]))[0] == whole[3:]
    assert global_batches(loaders(url, 4, 1, state=states[0]))[0] == whole[3:]


def test_dataset_refuses_what_cannot_keep_the_order(url):
    dataset = StreamingDataset(url, num_replicas=5, rank=0, decode=False, **OPTIONS)
    with pytest.raises(PlanError, match="world size that divides it"):
        len(dataset)
    dataset = StreamingDataset(url, num_replicas=2, rank=0, decode=False, **OPTIONS)
    assert len(dataset) == 8 * GLOBAL // 2  # batch_size defaults to this rank's part
    with pytest.raises(PlanError, match="batches of 6 samples per rank"):
        len(DataLoader(dataset, batch_size=4))
    state = DataLoader(dataset, batch_size=6).state_dict()
    five = StreamingDataset(url, num_replicas=5, rank=0, decode=False, **OPTIONS)
    with pytest.raises(StateError, match="not on 5 ranks"):
        five.load_state_dict(state)
    local = StreamingDataset(url, num_replicas=2, rank=0, decode=False, seed=3, shuffle_window=36)
    with pytest.raises(StateError, match="order='global'"):
        local.load_state_dict(state)
    with pytest.raises(UsageError, match="needs a global_batch_size"):
        StreamingDataset(url, order="global")


def sampler_batches(world, state=None, stop=None):
    size = GLOBAL // world
    samplers = [ShardSampler(SIZES, num_replicas=world, rank=r, **OPTIONS) for r in range(world)]
    if state is not None:
        for sampler in samplers:
            sampler.load_state_dict(state)
    parts = [list(sampler) for sampler in samplers]
    count = len(parts[0]) // size if stop is None else stop
    batches = [[i for part in parts for i in part[k * size : (k + 1) * size]] for k in range(count)]
    return batches, samplers[0].state_dict(count * size)


def test_shard_sampler_global_order_on_every_world_size():
    whole, _ = sampler_batches(1)
    for world in (2, 3, 4, 6, 12):
        assert sampler_batches(world)[0] == whole
    head, state = sampler_batches(4, stop=2)
    assert head == whole[:2]
    assert sampler_batches(3, state=state)[0] == whole[2:]
    sampler = ShardSampler(SIZES, num_replicas=2, rank=0, **OPTIONS)
    with pytest.raises(StateError, match="whole number of this rank's batches of 6"):
        sampler.state_dict(4)


def test_the_global_default_window_follows_the_dataset_bytes():
    """NOTE [ Global window ]: sixteen mean shards of small samples, cut to
    GLOBAL_WINDOW_BYTES, never below the local default; big samples or no bytes, no change."""
    sizes = shard_sizes_array([100, 0, 50, 150])  # mean non-empty shard: 100 samples
    config = PlanConfig(order="global", global_batch_size=8)
    assert config.window_for(sizes) == 400  # not told the bytes: four mean shards
    small = dataclasses.replace(config, dataset_bytes=300 * 100)
    assert small.window_for(sizes) == 1600
    assert small.hold_for(sizes) == 400
    assert dataclasses.replace(config, dataset_bytes=300 << 20).window_for(sizes) == 400  # 1 MiB samples
    assert dataclasses.replace(config, dataset_bytes=300 * GLOBAL_SMALL_SAMPLE).window_for(sizes) == 400
    assert dataclasses.replace(config, dataset_bytes=300 * GLOBAL_SMALL_SAMPLE - 1).window_for(sizes) == 1600
    big = shard_sizes_array([10_000] * 3)  # 8 KiB samples: 16 shards are 1.2 GiB, more than the bytes hold
    assert (
        dataclasses.replace(config, dataset_bytes=30_000 << 13).window_for(big) == GLOBAL_WINDOW_BYTES >> 13
    )
    assert (
        dataclasses.replace(config, dataset_bytes=30_000 << 15).window_for(big) == 40_000
    )  # never below 4 shards
    assert dataclasses.replace(config, dataset_bytes=0).window_for(sizes) == 1600
    wide = dataclasses.replace(small, shuffle_window=24)
    assert wide.window_for(sizes) == wide.hold_for(sizes) == 24
    assert PlanConfig(dataset_bytes=300).window_for(sizes) == 400  # the local order's never moves
    numpy = PlanConfig(order="global", global_batch_size=8, dataset_bytes=np.int64(300 * 100))
    assert type(numpy.dataset_bytes) is int  # a numpy int would overflow in the window's product
    assert global_window(shard_sizes_array([10**10] * 4), np.int64(10**12)) == 4 * 10**10  # no overflow
    with pytest.raises(PlanError, match="dataset_bytes"):
        PlanConfig(order="global", global_batch_size=8, dataset_bytes=-1)


@pytest.mark.parametrize(("world", "workers"), [(1, 1), (2, 1), (4, 2), (8, 4)])
def test_a_worker_of_the_long_default_window_holds_what_a_local_one_does(world, workers):
    """A worker's Windows take whole windows of the sequence, as many as the local
    order's window holds, and one when its share of a window is more."""
    sizes = [64] * 200  # 12.5 windows of 16 shards
    config = PlanConfig(seed=5, order="global", global_batch_size=64, dataset_bytes=200 * 64 * 100)
    plan = EpochPlan(sizes, config, epoch=1, world_size=world, num_workers=workers, batch_size=64 // world)
    assert plan.shuffle_window == 16 * 64
    share = plan.shuffle_window // (world * workers)  # a worker's part of one window
    held = [len(window) for worker in range(workers) for window in plan.worker_windows(0, worker)]
    assert max(held) == max(share, 4 * 64 // share * share)
    assert sum(held) == plan.samples_per_rank()


def test_dataset_and_sampler_share_the_long_default_window_and_refuse_the_old_one(url):
    """StreamingDataset sizes the default window by its manifest's bytes, a ShardSampler
    told them (and MapDataset's sampler) gives the same global batches, and a state of
    the old default names its window and resumes with it."""
    options = {key: value for key, value in OPTIONS.items() if key != "shuffle_window"}
    made = [StreamingDataset(url, num_replicas=2, rank=rank, decode=False, **options) for rank in range(2)]
    total = made[0].manifest.num_bytes
    sizes = shard_sizes_array(SIZES)
    plan = made[0].make_plan(consume=False)
    assert plan.shuffle_window == global_window(sizes, total) == 16 * 14  # the whole epoch, 4 windows before
    loaders = [
        DataLoader(part, batch_size=GLOBAL // 2, num_workers=2, collate_fn=collate_keys) for part in made
    ]
    whole, states = global_batches(loaders)
    keys = [f"s{shard:03d}-{i:04d}" for shard, count in enumerate(SIZES) for i in range(count)]
    told = [ShardSampler(SIZES, num_replicas=2, rank=r, dataset_bytes=total, **options) for r in range(2)]
    parts = [[keys[i] for i in sampler] for sampler in told]
    assert [parts[0][k * 6 : (k + 1) * 6] + parts[1][k * 6 : (k + 1) * 6] for k in range(len(whole))] == whole
    mapped = MapDataset(url).sampler(num_replicas=2, rank=0, **options)  # told the manifest's bytes
    assert [keys[i] for i in mapped] == parts[0]
    untold = ShardSampler(SIZES, num_replicas=2, rank=0, **options)
    assert untold.plan().shuffle_window == 4 * 14
    untold_keys = [keys[i] for i in untold]
    assert untold_keys != parts[0]
    old = untold.state_dict(6)  # saved under the earlier default: four mean shards
    with pytest.raises(
        StateError, match=r"shuffle_window=56, this plan has shuffle_window=224.*shuffle_window=56\)"
    ):
        made[0].load_state_dict(dict(states[0], plan=old))
    named = StreamingDataset(url, num_replicas=2, rank=0, decode=False, shuffle_window=56, **options)
    resumed = DataLoader(named, batch_size=6, collate_fn=collate_keys)
    resumed.load_state_dict(dict(states[0], plan=old))  # the window it names: the rest of that epoch
    assert [key for batch in resumed for key in batch] == untold_keys[6:]


MANY = [3, 7, 5, 4, 6, 5, 0, 5] * 3  # 105 samples in 24 shards: the default window is 2 of them


def test_the_long_default_window_keeps_the_batches_and_resumes_on_another_topology(tmp_path):
    """With the default window (16 mean shards of these small samples) the DataLoader's
    global batches are the same on every topology, and a state resumes on another."""
    url = str(tmp_path / "many")
    write_dataset(url, MANY)
    options = {key: value for key, value in OPTIONS.items() if key != "shuffle_window"}

    def made(world, workers, state=None):
        loaders = []
        for rank in range(world):
            dataset = StreamingDataset(url, num_replicas=world, rank=rank, decode=False, **options)
            loader = DataLoader(
                dataset, batch_size=GLOBAL // world, num_workers=workers, collate_fn=collate_keys
            )
            if state is not None:
                loader.load_state_dict(state)
            loaders.append(loader)
        return loaders

    first = made(2, 2)
    plan = first[0].dataset.make_plan(num_workers=2, consume=False)
    assert plan.shuffle_window == 16 * 5 < sum(MANY)  # more than one window of the sequence
    share = plan.sequence.per_window * (GLOBAL // 2) // 2  # a worker's part of one window: 18
    assert max(len(window) for window in plan.worker_windows(0, 0)) == share  # < 4 mean shards: one a Window
    whole, _ = global_batches(first)
    assert len({key for batch in whole for key in batch}) == sum(MANY)
    assert global_batches(made(1, 3))[0] == whole
    head, states = global_batches(made(2, 2), stop=4)
    assert head == whole[:4]
    assert global_batches(made(1, 3, states[0]))[0] == whole[4:]
    assert global_batches(made(4, 1, states[0]))[0] == whole[4:]


def test_a_shard_sampler_over_a_mixture_refuses_dataset_bytes():
    from shardstream.plan.mixture import StreamSpec

    streams = [StreamSpec("a", [4, 4]), StreamSpec("b", [6])]
    with pytest.raises(PlanError, match="dataset_bytes sizes the global window of one dataset"):
        len(ShardSampler(streams, num_replicas=1, rank=0, dataset_bytes=100, **OPTIONS))
