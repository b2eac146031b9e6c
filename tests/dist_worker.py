"""One rank of a multi-process test, launched by torchrun (see tests/test_distributed.py).

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/dist_worker.py \
        URL OUT --workers 2 --batch-size 4 --epochs 0 1 [--stop-after K] [--resume STATE]

Streams the dataset at URL through ``shardstream.DataLoader`` with gloo as the process
group, for each epoch given; the keys of every rank are gathered with
``all_gather_object`` and rank 0 writes ``OUT/epoch-E.json``: ``{"ranks": [keys of each
rank, in order], "batches": [batches of each rank], "world_size": W, "len": len(loader)}``.
With ``--stop-after K`` the last epoch stops after K batches and rank 0 also writes the
loader's state to ``OUT/state.json`` (every rank's state must be the same). With
``--resume STATE`` the loader loads that state first. With ``--global-batch-size G``
the dataset has ``order="global"`` and each rank takes batches of ``G // world``. A URL
that is a JSON list of ``Stream`` arguments makes a mixture (``--mix`` its mix), whose
keys are written as ``"STREAM/KEY"``. ``--seq-len S`` (and ``--packing``) streams packed
sequences of token datasets, each keyed by its token and document ids. The record of the i-th epoch given is also
written to ``OUT/pass-i.json`` (an epoch may be given twice).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import shardstream


def keep(samples: list[dict]) -> list[str]:
    """Each sample's key; in a mixture ``"STREAM/KEY"``. A packed sequence's key is its
    token ids and document ids (``--seq-len``), so runs compare token for token."""
    return [f"{s['__stream__']}/{name(s)}" if "__stream__" in s else name(s) for s in samples]


def name(sample: dict) -> str:
    if "__key__" in sample:
        return sample["__key__"]
    return (
        " ".join(map(str, sample["input_ids"].tolist()))
        + "|"
        + " ".join(map(str, sample["document_ids"].tolist()))
    )


def source(url: str) -> object:
    """``url``, or a mixture: a JSON list of ``Stream`` arguments."""
    if not url.startswith("["):
        return url
    return [shardstream.Stream(**stream) for stream in json.loads(url)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, nargs="+", default=[0])
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--start-method", default=None)
    parser.add_argument("--global-batch-size", type=int, default=None)
    parser.add_argument("--mix", default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--packing", default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = pathlib.Path(args.out)
    batch_size, order = args.batch_size, {}
    if args.global_batch_size is not None:
        batch_size = args.global_batch_size // world
        order = dict(order="global", global_batch_size=args.global_batch_size, read_lanes=3)
    if args.mix is not None:
        order["mix"] = args.mix
    if args.seq_len is not None:
        order.update(seq_len=args.seq_len, packing=args.packing)
    dataset = shardstream.StreamingDataset(source(args.url), shuffle=True, seed=7, decode=False, **order)
    loader = shardstream.DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=args.workers,
        collate_fn=keep,
        multiprocessing_context=args.start_method,
    )
    if args.resume:
        loader.load_state_dict(json.loads(pathlib.Path(args.resume).read_text()))
    for number, epoch in enumerate(args.epochs):
        dataset.set_epoch(epoch)
        last = number == len(args.epochs) - 1
        keys: list[str] = []
        batches = 0
        for step, batch in enumerate(loader):
            keys.extend(batch)
            batches += 1
            if last and args.stop_after is not None and step + 1 == args.stop_after:
                break
        state = loader.state_dict()
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, {"keys": keys, "state": state, "batches": batches})
        if rank == 0:
            record = {
                "ranks": [g["keys"] for g in gathered],  # type: ignore[index]
                "batches": [g["batches"] for g in gathered],  # type: ignore[index]
                "world_size": world,
                "len": len(loader),
            }
            (out / f"epoch-{epoch}.json").write_text(json.dumps(record))
            (out / f"pass-{number}.json").write_text(json.dumps(record))
            if last and args.stop_after is not None:
                states = [g["state"] for g in gathered]  # type: ignore[index]
                if any(s != states[0] for s in states):
                    raise SystemExit("ranks disagree on the state after the same steps")
                (out / "state.json").write_text(json.dumps(states[0]))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
