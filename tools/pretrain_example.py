"""A small pretraining loop on packed sequences (docs/tokens.md): a token dataset read with
``seq_len`` and ``packing``, a tiny causal transformer whose attention stays inside each
document (a block-diagonal causal mask built from ``document_ids``; a varlen kernel would
take ``cu_seqlens`` instead), and an exact resume from a checkpoint.

    python tools/pretrain_example.py DATASET --steps 20 --checkpoint ckpt.pt
    torchrun --standalone --nproc_per_node=2 tools/pretrain_example.py DATASET --steps 20

Run again with the same ``--checkpoint`` to go on from the step it saved, on any number
of ranks: the data goes on with the global batch after the last one trained on.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import shardstream


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, -1).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(
        self, vocab: int, width: int = 64, heads: int = 4, layers: int = 2, length: int = 4096
    ) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, document_ids: torch.Tensor
    ) -> torch.Tensor:
        x = self.embed(input_ids) + self.position(position_ids)
        mask = document_mask(document_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)


def document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """(batch, S, S) bool: token i sees token j <= i of its own document (padding, -1, sees itself)."""
    length = document_ids.shape[1]
    same = document_ids[:, :, None] == document_ids[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=document_ids.device).tril()
    return (same & causal) | torch.eye(length, dtype=torch.bool, device=document_ids.device)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "dataset", help="a token dataset (shardstream pack ... --format tokens --tokenizer T)"
    )
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--packing", default="best_fit", choices=["concat", "best_fit", "pad"])
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="train until this many steps in all")
    parser.add_argument("--checkpoint", default=None, help="saved every step, resumed from when it exists")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    dataset = shardstream.StreamingDataset(
        args.dataset,
        seq_len=args.seq_len,
        packing=args.packing,
        order="global",  # the same global batches on any number of ranks
        global_batch_size=args.global_batch_size,
    )
    vocab = dataset.manifest.tokens.vocab_size or 65536  # type: ignore[union-attr]
    model = TinyLM(vocab, length=args.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = shardstream.DataLoader(
        dataset, batch_size=args.global_batch_size // world, num_workers=args.workers
    )
    step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["data"])
        dataset.set_epoch(saved["data"]["epoch"])
        step = saved["step"]
    trained = DistributedModel(model) if distributed else model
    while step < args.steps:
        for batch in loader:
            logits = trained(batch["input_ids"], batch["position_ids"], batch["document_ids"])
            loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if args.checkpoint and (not distributed or dist.get_rank() == 0):
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                torch.save({**state, "data": loader.state_dict()}, args.checkpoint)
            if not distributed or dist.get_rank() == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step >= args.steps:
                break
        else:
            dataset.set_epoch(dataset.epoch + 1)
    if distributed:
        dist.destroy_process_group()
    return 0


def DistributedModel(model: nn.Module) -> nn.Module:  # as torch names it
    return nn.parallel.DistributedDataParallel(model)


if __name__ == "__main__":
    raise SystemExit(main())
