"""A resume state names the dataset it was saved on (issue 10, item 9).

Two real tar datasets with the same shard sample counts but other samples: a state of one
is refused by the other, naming the fingerprints; a state written before fingerprints
existed (a literal below, as shardstream wrote it then) still loads and resumes exactly.
"""

from __future__ import annotations

import shutil

import pytest

import shardstream
from shardstream.errors import StateError
from shardstream.manifest import dataset_fingerprint
from shardstream.pack import ShardWriter
from tests.resume_harness import write_dataset


def write(url: str, text: str) -> None:
    """10 samples in shards of 4, 4 and 2, whatever ``text`` is."""
    with ShardWriter(url, format="tar", samples_per_shard=4) as writer:
        for i in range(10):
            writer.write({"__key__": f"k{i:02d}", "txt": f"{text} {i}"})


def mid_epoch_state(url: str, batches: int = 2) -> dict:
    loader = shardstream.DataLoader(shardstream.StreamingDataset(url, seed=1), batch_size=2)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    return loader.state_dict()


def test_a_state_of_another_dataset_with_the_same_shard_sizes_is_refused(tmp_path):
    write(str(tmp_path / "a"), "first")
    write(str(tmp_path / "b"), "second")
    state = mid_epoch_state(str(tmp_path / "a"))
    theirs = dataset_fingerprint(shardstream.StreamingDataset(str(tmp_path / "a")).manifest)
    assert state["dataset_fingerprint"] == theirs
    other = shardstream.StreamingDataset(str(tmp_path / "b"), seed=1)
    with pytest.raises(StateError, match="another dataset") as info:
        shardstream.DataLoader(other, batch_size=2).load_state_dict(state)
    assert theirs in str(info.value)
    assert other.fingerprint in str(info.value)
    assert str(tmp_path / "b") in str(info.value)
    with pytest.raises(StateError, match="another dataset"):
        other.load_state_dict(state)
    assert other.start_state()["plan"]["passes"][0]["steps"] == 0  # the refused state is not kept


def test_a_state_loads_on_the_same_dataset_moved_elsewhere(tmp_path):
    write(str(tmp_path / "a"), "first")
    state = mid_epoch_state(str(tmp_path / "a"))
    shutil.copytree(tmp_path / "a", tmp_path / "moved")
    dataset = shardstream.StreamingDataset(str(tmp_path / "moved"), seed=1)
    loader = shardstream.DataLoader(dataset, batch_size=2)
    loader.load_state_dict(state)
    assert loader.state_dict()["dataset_fingerprint"] == state["dataset_fingerprint"]
    assert len([s for batch in loader for s in batch["__key__"]]) == 6


@pytest.mark.parametrize("fingerprint", [7, "", "0" * 32, ["x"]])
def test_a_state_with_a_bad_fingerprint_is_refused(tmp_path, fingerprint):
    write(str(tmp_path / "a"), "first")
    state = {**mid_epoch_state(str(tmp_path / "a")), "dataset_fingerprint": fingerprint}
    with pytest.raises(StateError, match="another dataset"):
        shardstream.StreamingDataset(str(tmp_path / "a"), seed=1).load_state_dict(state)


# What DataLoader.state_dict() and StreamingDataset.state_dict() wrote before states carried
# a fingerprint: 3 batches of 2 (the loader) and 2 batches of 2 (the dataset) into epoch 0
# of write_dataset(url, [5, 7, 4]) streamed with seed=3, shuffle_window=6.
OLD_LOADER_STATE = {
    "version": 1,
    "epoch": 0,
    "url": "/tmp/tmpzgeiu6ah/ds",
    "plan": {
        "version": 1,
        "epoch": 0,
        "seed": 3,
        "shuffle": True,
        "drop_last": False,
        "shuffle_window": 6,
        "num_samples": 16,
        "num_shards": 3,
        "counts_checksum": "62d2b0991f271088",
        "passes": [{"world_size": 1, "num_workers": 1, "batch_size": 2, "steps": 3}],
    },
}
OLD_DATASET_STATE = {
    **OLD_LOADER_STATE,
    "plan": {
        **OLD_LOADER_STATE["plan"],
        "passes": [{"world_size": 1, "num_workers": 1, "batch_size": 2, "steps": 2}],
    },
}


def test_a_state_written_before_fingerprints_still_resumes_exactly(tmp_path):
    url = str(tmp_path / "ds")
    write_dataset(url, [5, 7, 4])
    uninterrupted = [
        key
        for batch in shardstream.DataLoader(
            shardstream.StreamingDataset(url, seed=3, shuffle_window=6), batch_size=2
        )
        for key in batch["__key__"]
    ]
    dataset = shardstream.StreamingDataset(url, seed=3, shuffle_window=6)
    loader = shardstream.DataLoader(dataset, batch_size=2)
    loader.load_state_dict(OLD_LOADER_STATE)
    assert [k for batch in loader for k in batch["__key__"]] == uninterrupted[6:]
    direct = shardstream.StreamingDataset(url, seed=3, shuffle_window=6, batch_size=2)
    direct.load_state_dict(OLD_DATASET_STATE)
    assert direct.start_state()["dataset_fingerprint"] == direct.fingerprint  # saved again with one
    assert [s["__key__"] for s in direct] == uninterrupted[4:]


def _deep(depth: int = 100_000) -> list:
    nested: list = []
    for _ in range(depth):
        nested = [nested]
    return nested


def _hostile_values() -> list:
    import numpy as np

    return [_deep(), np.array([1, 1]), "x" * 1_000_000, {"k": _deep()}]


@pytest.mark.parametrize(
    "where", ["version", "epoch", "plan.version", "plan.num_shards", "plan.seed", "plan.passes"]
)
def test_hostile_values_in_a_state_give_a_short_state_error(tmp_path, where):
    from shardstream.sampler import ShardSampler

    write(str(tmp_path / "a"), "first")
    good = mid_epoch_state(str(tmp_path / "a"))
    dataset = shardstream.StreamingDataset(str(tmp_path / "a"), seed=1)
    sampler = ShardSampler([4, 4, 2], seed=1)
    for value in _hostile_values():
        state = {**good, "plan": dict(good["plan"])}
        if where.startswith("plan."):
            state["plan"][where[5:]] = value if where != "plan.passes" else [value]
        else:
            state[where] = value
        with pytest.raises(StateError) as info:
            dataset.load_state_dict(state)
        assert len(str(info.value)) < 2000
        if where.startswith("plan."):
            with pytest.raises(StateError) as info:
                sampler.load_state_dict(state["plan"])
            assert len(str(info.value)) < 2000
