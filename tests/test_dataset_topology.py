"""Topology detection: explicit values, torch.distributed, RANK/WORLD_SIZE, workers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from shardstream.errors import UsageError
from shardstream.topology import detect, detect_rank, detect_worker, torch_distributed
from shardstream.types import Topology


def no_dist():
    return None


def test_defaults_without_anything():
    assert detect(dist_fn=no_dist, environ={}, worker_info_fn=lambda: None) == Topology(0, 1, 0, 1)


def test_environment_variables():
    assert detect_rank(dist_fn=no_dist, environ={"RANK": "3", "WORLD_SIZE": "4"}) == (3, 4)


def test_torch_distributed_wins_over_environment():
    assert detect_rank(dist_fn=lambda: (1, 2), environ={"RANK": "3", "WORLD_SIZE": "4"}) == (1, 2)


def test_explicit_values_win_each_on_its_own():
    assert detect_rank(rank=0, world_size=8, dist_fn=lambda: (1, 2)) == (0, 8)
    assert detect_rank(rank=1, dist_fn=no_dist, environ={"WORLD_SIZE": "3"}) == (1, 3)
    assert detect_rank(world_size=5, dist_fn=no_dist, environ={"RANK": "4"}) == (4, 5)


def test_worker_from_worker_info():
    info = SimpleNamespace(id=2, num_workers=3)
    assert detect_worker(worker_info_fn=lambda: info) == (2, 3)
    topo = detect(dist_fn=lambda: (1, 2), worker_info_fn=lambda: info)
    assert topo == Topology(rank=1, world_size=2, worker=2, num_workers=3)


@pytest.mark.parametrize(
    ("rank", "world", "environ"),
    [(2, 2, {}), (-1, 2, {}), (0, 0, {}), (None, None, {"RANK": "x"}), (None, None, {"RANK": "1"})],
)
def test_bad_values_raise_usage_error(rank, world, environ):
    with pytest.raises(UsageError):
        detect_rank(rank=rank, world_size=world, dist_fn=no_dist, environ=environ)


def test_real_torch_without_process_group():
    # In this test process no process group is initialised.
    assert torch_distributed() is None
    assert detect_worker() == (0, 1)
