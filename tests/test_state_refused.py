"""A refused state changes nothing: not the epoch, nor a state loaded before (issue 10)."""

from __future__ import annotations

import pytest

import shardstream
from shardstream.errors import StateError
from shardstream.pack import ShardWriter


def write(url: str, text: str) -> None:
    with ShardWriter(url, format="tar", samples_per_shard=4) as writer:
        for i in range(10):
            writer.write({"__key__": f"k{i:02d}", "txt": f"{text} {i}"})


def state_at(url: str, epoch: int, batches: int = 2) -> dict:
    dataset = shardstream.StreamingDataset(url, seed=1, decode=False)
    dataset.set_epoch(epoch)
    loader = shardstream.DataLoader(dataset, batch_size=2)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    return loader.state_dict()


@pytest.fixture
def datasets(tmp_path):
    write(str(tmp_path / "a"), "first")
    write(str(tmp_path / "b"), "second")
    return str(tmp_path / "a"), str(tmp_path / "b")


def test_a_state_of_another_dataset_leaves_the_epoch(datasets):
    a, b = datasets
    theirs = state_at(a, epoch=5)
    ours = shardstream.StreamingDataset(b, seed=1, decode=False)
    ours.set_epoch(3)
    before = ours.start_state()
    with pytest.raises(StateError, match="another dataset"):
        ours.load_state_dict(theirs)
    assert ours.epoch == 3
    assert ours.start_state() == before


def test_a_state_whose_plan_is_refused_leaves_the_epoch_and_a_loaded_state(datasets):
    a, _ = datasets
    loaded = state_at(a, epoch=2)
    ours = shardstream.StreamingDataset(a, seed=1, decode=False)
    ours.load_state_dict(loaded)
    bad = {**loaded, "epoch": 7, "plan": {**loaded["plan"], "epoch": 7, "num_samples": 11}}
    with pytest.raises(StateError):
        ours.load_state_dict(bad)
    assert ours.epoch == 2
    assert ours.start_state() == ours.make_state(loaded["plan"])
