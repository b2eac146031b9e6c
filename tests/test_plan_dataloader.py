"""The plan's model of torch's DataLoader is torch's DataLoader: real worker processes
taking batches round-robin, fresh and after a resume (rotated to ``first_worker()``)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from shardstream.plan import EpochPlan, PlanConfig

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SIZES = [7, 0, 1, 12, 5, 9, 3, 0, 11]  # 48 samples: uneven worker slices, partial batches


class PlanDataset(IterableDataset):
    """Worker ``i`` of the DataLoader reads plan worker ``(i + first_worker) % W``, so
    torch's round-robin, which starts at its worker 0, starts at ``first_worker``."""

    def __init__(self, config: PlanConfig, topology: dict, rank: int, state: dict | None = None) -> None:
        self.config, self.topology, self.rank, self.state = config, topology, rank, state

    def plan(self) -> EpochPlan:
        if self.state is None:
            return EpochPlan(SIZES, self.config, epoch=1, **self.topology)
        return EpochPlan.resume(SIZES, self.config, self.state, **self.topology)

    def __iter__(self):
        plan, info = self.plan(), get_worker_info()
        worker = (info.id + plan.first_worker()) % plan.num_workers
        for shard, index in plan.worker_samples(self.rank, worker):
            yield torch.tensor([shard, index])


def loader_samples(dataset: PlanDataset) -> list[tuple[int, int]]:
    loader = DataLoader(
        dataset, batch_size=dataset.topology["batch_size"], num_workers=dataset.topology["num_workers"]
    )
    return [tuple(row) for batch in loader for row in batch.tolist()]


@pytest.mark.parametrize(
    ("config", "topology", "steps"),
    [
        (PlanConfig(seed=3, shuffle_window=5), {"world_size": 2, "num_workers": 3, "batch_size": 4}, 4),
        (PlanConfig(shuffle=False), {"world_size": 3, "num_workers": 2, "batch_size": 3}, 3),
    ],
)
def test_torch_dataloader_yields_rank_samples_and_resumes_exactly(config, topology, steps):
    rank = topology["world_size"] - 1
    plan = EpochPlan(SIZES, config, epoch=1, **topology)
    whole = loader_samples(PlanDataset(config, topology, rank))
    assert whole == list(plan.rank_samples(rank))
    state = plan.state_dict(steps)
    rest = loader_samples(PlanDataset(config, topology, rank, state))
    resumed = EpochPlan.resume(SIZES, config, state, **topology)
    assert resumed.first_worker() != 0  # the rotation is exercised
    assert rest == list(resumed.rank_samples(rank))
    assert whole[len(whole) - len(rest) :] == rest
    assert len(whole) - len(rest) == steps * topology["batch_size"]
