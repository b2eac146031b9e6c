"""Resume states written before the state type was shared (issue 8, refactor 5) still
load, and the resumed stream is what the code that wrote them yielded.

tests/golden/*.json were written by the code of commit b0b638a on the dataset below
(deterministic tar shards, so the fingerprint is the same on every machine): the state
of a ShardSampler, a StreamingDataset iterated directly and a shardstream DataLoader
(in-process, and 2 ranks x 2 workers), mid epoch 1 and at its end, each with the rest of
the epoch and the head of epoch 2 that the old code yielded after loading it.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from shardstream import ShardSampler
from shardstream.dataset import DataLoader, StreamingDataset
from tests.resume_harness import collate_keys, write_dataset

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
FILES = sorted(GOLDEN.glob("*.json"))
SIZES = [7, 13, 10, 4, 16, 9, 11, 8, 12, 6, 14, 10]
OPTIONS = {"seed": 5, "shuffle_window": 20}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("golden") / "ds")
    write_dataset(url, SIZES)
    return url


def _keys(dataset):
    return [sample["__key__"] for sample in dataset]


def _resume(golden, url):
    """``(rest of the epoch, head of the next one)`` after loading the golden state."""
    world, rank, state = golden["world_size"], golden["rank"], golden["state"]
    if golden["kind"] == "sampler":
        sampler = ShardSampler(SIZES, num_replicas=world, rank=rank, **OPTIONS)
        sampler.load_state_dict(state)
        rest = list(sampler)
        sampler.set_epoch(2)
        return rest, list(sampler)[:10]
    dataset = StreamingDataset(url, num_replicas=world, rank=rank, decode=False, **OPTIONS)
    if golden["kind"] == "dataset":
        dataset = StreamingDataset(
            url, num_replicas=world, rank=rank, batch_size=golden["batch_size"], decode=False, **OPTIONS
        )
        dataset.load_state_dict(state)
        rest = _keys(dataset)
        dataset.set_epoch(2)
        return rest, _keys(dataset)[:10]
    loader = DataLoader(
        dataset, batch_size=golden["batch_size"], num_workers=golden["num_workers"], collate_fn=collate_keys
    )
    loader.load_state_dict(state)
    rest = list(loader)
    dataset.set_epoch(2)
    return rest, list(loader)[:3]


def test_golden_states_exist():
    kinds = {json.loads(path.read_text())["kind"] for path in FILES}
    assert kinds == {"sampler", "dataset", "loader"}
    assert len(FILES) == 18


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_golden_state_resumes_as_before(path, url):
    golden = json.loads(path.read_text())
    rest, head = _resume(golden, url)
    assert rest == golden["expected_rest"]
    assert head == golden["expected_next_epoch_head"]
    if golden["state"]["epoch"] == 1 and path.stem.endswith("-end"):
        assert rest == []
