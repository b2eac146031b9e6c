"""One rank of the chaos test, launched by torchrun (see tests/test_chaos.py).

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/chaos_worker.py \
        URL OUT --workers 2 --batch-size 4 --epoch 0 [--resume STATE] [--kill KIND:RANK:STEP]

Streams one epoch through ``shardstream.DataLoader`` and checkpoints after every step:
rank r appends ``{"step": k, "keys": [...], "state": ...}`` to ``OUT/rank-r.jsonl`` and
flushes, as a training loop that saves its data state with each checkpoint would; the
ranks then meet at a barrier, in lockstep as DDP keeps them (else one rank could crash
before the other took a step, and the run would test nothing). With
``--kill worker:R:N`` DataLoader worker 0 of rank R kills itself (SIGKILL) when it makes
its N-th batch; with ``--kill rank:R:N`` rank R kills itself after N steps. The run then
ends as a real crash does: torchrun tears the other rank down and exits non-zero.

    python tests/chaos_worker.py fleet URL OUT CACHE --epochs 3 --cache-limit BYTES

is one reader of the cache fleet (``test_a_cache_fleet_...`` in tests/test_chaos.py):
it streams ``--epochs`` epochs of URL with a cache in CACHE, shared with the other
readers, checks every sample's bytes against ``fleet_payload(key)`` and writes the keys
of each epoch to ``OUT/epoch-E.json``; it exits 0 only if every sample was exact.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys

import torch.distributed as dist
import torch.utils.data

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import shardstream


class Collate:
    """Keys of a batch; kills its DataLoader worker at the batch the chaos plan names."""

    def __init__(self, kill_at: int | None) -> None:
        self.kill_at = kill_at
        self.made = 0

    def __call__(self, samples: list[dict]) -> list[str]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 0 and self.kill_at is not None:
            self.made += 1
            if self.made == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return [sample["__key__"] for sample in samples]


def fleet_payload(key: str) -> bytes:
    """The bytes of sample ``key``'s ``bin`` field in the fleet's dataset."""
    import hashlib

    return hashlib.sha256(key.encode()).digest() * 100  # 3200 bytes


def fleet_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("cache")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--cache-limit", type=int, required=True)
    args = parser.parse_args(argv)
    wrong = 0
    for epoch in range(args.epochs):
        dataset = shardstream.StreamingDataset(
            args.url,
            shuffle=True,
            seed=epoch,
            decode=False,
            cache_dir=args.cache,
            cache_limit=args.cache_limit,
        )
        keys = []
        for sample in dataset:
            keys.append(sample["__key__"])
            if bytes(sample["bin"]) != fleet_payload(sample["__key__"]):
                wrong += 1
        dataset.storage.close()
        (pathlib.Path(args.out) / f"epoch-{epoch}.json").write_text(json.dumps(keys))
    return 3 if wrong else 0


def main() -> int:
    if sys.argv[1:2] == ["fleet"]:
        return fleet_main(sys.argv[2:])
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--kill", default=None, help="worker:RANK:BATCH or rank:RANK:STEP")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kind, victim, at = args.kill.split(":") if args.kill else ("", "-1", "0")
    mine = int(victim) == rank
    dataset = shardstream.StreamingDataset(args.url, shuffle=True, seed=3, shuffle_window=8, decode=False)
    loader = shardstream.DataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.workers,
        collate_fn=Collate(int(at) if mine and kind == "worker" else None),
    )
    dataset.set_epoch(args.epoch)
    if args.resume:
        loader.load_state_dict(json.loads(pathlib.Path(args.resume).read_text()))
    with open(pathlib.Path(args.out) / f"rank-{rank}.jsonl", "a") as log:
        for step, batch in enumerate(loader, start=1):
            record = {"step": step, "keys": batch, "state": loader.state_dict()}
            log.write(json.dumps(record) + "\n")
            log.flush()
            dist.barrier()  # ranks step in lockstep, as DDP's gradient all-reduce makes them
            if mine and kind == "rank" and step == int(at):
                os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
