"""order="global" through the real stack: StreamingDataset and shardstream.DataLoader
(real worker processes) on simulated ranks, and ShardSampler, give the same global
batches on every topology, and a state saved on one resumes on another."""

from __future__ import annotations

import pytest

from shardstream import DataLoader, ShardSampler, StreamingDataset
from shardstream.errors import PlanError, StateError, UsageError
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
