"""One resume state type, one epoch comparison, one topology detector, one loader binding
and one integer validator (issue 8, refactor 5)."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

import shardstream
from shardstream.counts import check_int
from shardstream.dataset import DataLoader, StreamingDataset
from shardstream.dataset.binding import Epoch, LoaderBinding
from shardstream.errors import PlanError, StateError, UsageError
from shardstream.plan import EpochPlan, PlanConfig
from shardstream.plan.config import check_count
from shardstream.plan.state import Key, ResumeState, same_epoch
from shardstream.topology import Detector
from tests.resume_harness import collate_keys, write_dataset

SIZES = [5, 7, 4, 6]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("state-type") / "ds")
    write_dataset(url, SIZES)
    return url


def keys(dataset):
    return [sample["__key__"] for sample in dataset]


def no_dist():
    return None


def no_worker():
    return None


def second_of_two_workers():
    return SimpleNamespace(id=1, num_workers=2)


# -- the state type ----------------------------------------------------------------------------


def test_same_epoch_is_strict_about_types():
    assert same_epoch(3, 3)
    assert same_epoch(np.int64(3), 3)
    assert not same_epoch(True, 1)
    assert not same_epoch("3", 3)
    assert not same_epoch(None, 0)
    assert not same_epoch(np.array([3, 3]), 3)


def test_resume_state_round_trips_the_dataset_wire_format(url):
    dataset = StreamingDataset(url, decode=False, seed=2)
    state = dataset.state_dict()
    loaded = ResumeState.read(json.loads(json.dumps(state)), url=dataset.url)
    assert loaded.epoch == 0
    assert loaded.dataset_fingerprint == dataset.fingerprint
    assert loaded.to_dict() == state
    assert set(state) == {Key.VERSION, Key.EPOCH, Key.URL, Key.DATASET_FINGERPRINT, Key.PLAN}
    with pytest.raises(StateError, match="version"):
        ResumeState.read({**state, Key.VERSION: 2}, url=dataset.url)
    with pytest.raises(StateError, match="plan of epoch"):
        ResumeState.read({**state, Key.EPOCH: 1}, url=dataset.url)
    with pytest.raises(StateError, match="integer 'epoch'"):
        ResumeState.read({**state, Key.EPOCH: True}, url=dataset.url)


def test_resume_state_is_frozen():
    state = ResumeState(epoch=0, plan={})
    with pytest.raises(AttributeError):
        state.epoch = 1  # type: ignore[misc]


def test_sampler_state_is_a_plan_state():
    sampler = shardstream.ShardSampler(SIZES, num_replicas=1, rank=0)
    state = sampler.state_dict(3)
    assert ResumeState.from_plan(state).plan == state
    with pytest.raises(StateError, match="integer 'epoch'"):
        ResumeState.from_plan({**state, Key.EPOCH: False})
    with pytest.raises(StateError, match="integer"):
        sampler.load_state_dict({**state, Key.EPOCH: "1"})
    assert sampler.epoch == 0  # a refused state changes nothing


def test_plan_knows_its_epoch():
    plan = EpochPlan(SIZES, PlanConfig(), epoch=2, world_size=1)
    assert plan.of_epoch(2)
    assert not plan.of_epoch(3)


# -- one integer validator ---------------------------------------------------------------------


def test_one_integer_validator_raises_the_callers_error():
    assert check_int(np.int32(4), "n") == 4
    with pytest.raises(UsageError, match="n must be an integer"):
        check_int(True, "n")
    with pytest.raises(PlanError, match="at least 1"):
        check_int(0, "n", minimum=1, error=PlanError)
    with pytest.raises(StateError, match="too large"):
        check_int(11, "n", maximum=10, error=StateError)
    with pytest.raises(PlanError, match="epoch must be an integer"):
        check_count(1.0, "epoch")


# -- DatasetConfig holds a PlanConfig -----------------------------------------------------------


def test_dataset_config_holds_the_plan_config(url):
    dataset = StreamingDataset(url, shuffle=False, seed=7, drop_last=True, shuffle_window=9)
    cfg = dataset.config
    assert cfg.plan == PlanConfig(shuffle=False, seed=7, drop_last=True, shuffle_window=9)
    assert (cfg.shuffle, cfg.seed, cfg.drop_last, cfg.shuffle_window) == (False, 7, True, 9)
    assert dataset.plan_config() is cfg.plan
    with pytest.raises(UsageError, match="seed"):
        StreamingDataset(url, seed="7")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="shuffle_window"):
        StreamingDataset(url, shuffle_window=0)


# -- the injected topology detector ------------------------------------------------------------


def test_injected_detector_gives_rank_and_world(url):
    detected = StreamingDataset(
        url, decode=False, topology=Detector(dist_fn=no_dist, environ={"RANK": "1", "WORLD_SIZE": "2"})
    )
    explicit = StreamingDataset(url, decode=False, num_replicas=2, rank=1)
    assert detected.rank_and_world() == (1, 2)
    assert keys(detected) == keys(explicit)
    assert keys(detected) != keys(StreamingDataset(url, decode=False, num_replicas=2, rank=0))


def test_injected_detector_gives_the_worker(url):
    dataset = StreamingDataset(
        url,
        decode=False,
        topology=Detector(dist_fn=no_dist, environ={}, worker_info_fn=second_of_two_workers),
    )
    plan = EpochPlan(SIZES, PlanConfig(), epoch=0, world_size=1, num_workers=2)
    want = [f"s{shard:03d}-{index:04d}" for shard, index in plan.worker_samples(0, 1)]
    assert keys(dataset) == want
    # in a worker the in-process progress is not kept: state_dict() is the epoch's start
    assert dataset.state_dict()[Key.PLAN][Key.PASSES][0][Key.STEPS] == 0


def test_detector_pickles_with_the_dataset(url):
    dataset = StreamingDataset(url, topology=Detector(dist_fn=no_dist, environ={}, worker_info_fn=no_worker))
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy._detector == dataset._detector


def test_topology_must_be_a_detector(url):
    with pytest.raises(UsageError, match="Detector"):
        StreamingDataset(url, topology=lambda: None)  # type: ignore[arg-type]


# -- the loader binding and the epoch's one owner ------------------------------------------------


def test_loader_acts_on_its_dataset_through_one_binding(url):
    dataset = StreamingDataset(url, decode=False)
    for gone in ("use_loader", "drop_loaded_state", "share_epoch"):
        assert not hasattr(dataset, gone)
    loader = DataLoader(dataset, batch_size=3, num_workers=0, collate_fn=collate_keys)
    assert isinstance(loader._binding, LoaderBinding)
    assert loader._binding.dataset is dataset
    assert dataset.batch_size() == 3
    batches = list(loader)
    assert len(batches) == len(loader) == -(-sum(SIZES) // 3)


def test_epoch_pickles_as_a_plain_value_outside_a_spawn():
    class Cell:
        value = 0

    epoch = Epoch(4)
    cell = Cell()
    epoch.share(cell)
    assert cell.value == 4
    epoch.set(6)
    assert cell.value == 6
    assert epoch.get() == 6
    copy = pickle.loads(pickle.dumps(epoch))
    assert copy.get() == 6
    assert copy._cell is None
