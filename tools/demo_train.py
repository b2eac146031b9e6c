"""The training side of the demo, run by torchrun: stream a dataset, check exactly-once.

    torchrun --standalone --nproc_per_node=2 tools/demo_train.py s3://demo/stdlib --workers 2

Each rank streams its part of every epoch through ``shardstream.DataLoader``; the keys of
all ranks are gathered (gloo) and rank 0 checks that every sample of the manifest came
exactly once, that every rank got the same count, and that epochs differ in order.
"""

from __future__ import annotations

import argparse
import time

import torch.distributed as dist

import shardstream


def collate(samples: list[dict]) -> list[dict]:
    return samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = shardstream.StreamingDataset(args.url, shuffle=True, seed=0)
    loader = shardstream.DataLoader(
        dataset, batch_size=args.batch_size, num_workers=args.workers, collate_fn=collate
    )
    expected = dataset.manifest.num_samples
    orders = []
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        keys: list[str] = []
        started = time.perf_counter()
        nbytes = 0
        for batch in loader:
            keys.extend(sample["__key__"] for sample in batch)
            nbytes += sum(len(sample["txt"]) for sample in batch)
        elapsed = time.perf_counter() - started
        gathered: list[list[str] | None] = [None] * world
        dist.all_gather_object(gathered, keys)
        if rank == 0:
            everything = [key for part in gathered for key in part or []]
            counts = [len(part or []) for part in gathered]
            unique = len(set(everything))
            padded = len(everything) - expected
            ok = unique == expected and len(set(counts)) == 1 and 0 <= padded < world
            print(
                f"epoch {epoch}: {len(everything)} samples over {world} ranks x {args.workers} workers "
                f"(per rank {counts}), {unique} distinct of {expected}, padding {padded}; "
                f"rank 0 read {len(keys) / elapsed:,.0f} samples/s, {nbytes / elapsed / 1e6:.1f} MB/s: "
                f"{'exactly once' if ok else 'MISMATCH'}",
                flush=True,
            )
            if not ok:
                raise SystemExit("exactly-once check failed")
            orders.append(everything)
    if rank == 0 and len(orders) > 1:
        if orders[0] == orders[1]:
            raise SystemExit("two epochs came in the same order")
        print("epochs 0 and 1 came in different orders", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
