"""A training loop with shardstream: set_epoch, checkpoints, and exact resume.

    python tools/train_example.py DATASET_URL --checkpoint ckpt.pt [--stop-after-steps 5]
    torchrun --standalone --nproc_per_node=2 tools/train_example.py DATASET_URL --checkpoint ckpt.pt

The model is a toy (it learns the mean byte of each text sample from its first bytes);
the data handling is the real thing. Rerun the same command after stopping it and it
resumes from the checkpoint at the exact batch where it stopped, on any number of ranks
(one process, or torchrun with several, in either direction) or workers. ``--keys-log FILE`` appends the keys each rank trains on, one per line, so a
test can check that an epoch saw every sample exactly once across a stop and a resume.
"""

from __future__ import annotations

import argparse
import os
import pathlib

import torch
import torch.distributed as dist

import shardstream

PREFIX = 64  # bytes of each text the model sees


def to_tensors(samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Collate: the first PREFIX bytes of each text, and its mean byte as the target."""
    inputs = torch.zeros(len(samples), PREFIX)
    targets = torch.zeros(len(samples), 1)
    for row, sample in enumerate(samples):
        data = sample["txt"].encode() if isinstance(sample["txt"], str) else bytes(sample["txt"])
        head = torch.frombuffer(bytearray(data[:PREFIX].ljust(PREFIX, b"\0")), dtype=torch.uint8)
        inputs[row] = head.float() / 255
        targets[row] = (sum(data) / max(1, len(data))) / 255
    return inputs, targets, [sample["__key__"] for sample in samples]


def unwrapped(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A model state without DDP's ``module.`` prefix: checkpoints are saved from the bare
    model, so one from a run under torchrun (older ones kept the prefix) loads in one
    process and the other way round."""
    prefix = "module."
    if state and all(name.startswith(prefix) for name in state):
        return {name.removeprefix(prefix): value for name, value in state.items()}
    return state


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url")
    parser.add_argument(
        "--checkpoint", required=True, help="saved every --save-every steps and at each epoch end"
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--stop-after-steps", type=int, default=None, help="simulate a crash after N steps")
    parser.add_argument("--keys-log", default=None)
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0

    dataset = shardstream.StreamingDataset(args.url, shuffle=True, seed=0)
    loader = shardstream.DataLoader(
        dataset, batch_size=args.batch_size, num_workers=args.workers, collate_fn=to_tensors
    )
    model = torch.nn.Linear(PREFIX, 1)  # the bare model: what a checkpoint holds
    checkpoint_path = pathlib.Path(args.checkpoint)
    checkpoint = torch.load(checkpoint_path, weights_only=False) if checkpoint_path.exists() else None
    if checkpoint is not None:  # before DDP wraps it: the same keys on any number of ranks
        model.load_state_dict(unwrapped(checkpoint["model"]))
    trained = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    start_epoch = 0
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["data"])  # exact, also on another number of ranks
        start_epoch = checkpoint["data"]["epoch"]
        print(f"rank {rank}: resumed in epoch {start_epoch}", flush=True)

    def save() -> None:
        if rank == 0:  # ranks step in lockstep: rank 0's loader state speaks for all
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "data": loader.state_dict(),
            }
            torch.save(state, checkpoint_path.with_suffix(".tmp"))
            os.replace(checkpoint_path.with_suffix(".tmp"), checkpoint_path)

    keys_log = open(f"{args.keys_log}.rank{rank}", "a") if args.keys_log else None  # noqa: SIM115
    steps = 0
    for epoch in range(start_epoch, args.epochs):
        dataset.set_epoch(epoch)
        for inputs, targets, keys in loader:
            loss = torch.nn.functional.mse_loss(trained(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if keys_log:
                keys_log.write("".join(f"{epoch} {key}\n" for key in keys))
                keys_log.flush()
            if steps % args.save_every == 0:
                save()
            if args.stop_after_steps is not None and steps >= args.stop_after_steps:
                save()
                print(f"rank {rank}: stopping after {steps} steps (loss {loss.item():.4f})", flush=True)
                return 0
        save()
        print(f"rank {rank}: epoch {epoch} done, loss {loss.item():.4f}", flush=True)
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
