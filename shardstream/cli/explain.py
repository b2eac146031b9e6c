"""``shardstream explain``: which samples a step of training reads, and from where."""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardstream.cli.common import count_arg, storage_options_for
from shardstream.errors import UsageError


def add_explain(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "explain",
        parents=[common],
        help="which samples (or documents and tokens) global batch K of an epoch holds, without reading data",
        description="Lay out global batch K of order='global' from the plan alone (manifests and sidecars, "
        "no shard read). URL is a dataset, or a JSON list of Stream arguments for a mixture.",
    )
    p.add_argument("url", metavar="URL")
    p.add_argument("--step", type=int, required=True, metavar="K", help="the global batch, counted from 0")
    p.add_argument("--global-batch-size", type=count_arg, required=True, metavar="B")
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shuffle", action="store_true", help="the run had shuffle=False")
    p.add_argument("--read-lanes", type=count_arg, default=None, metavar="L")
    p.add_argument(
        "--seq-len", type=count_arg, default=None, metavar="S", help="packed sequences of a token dataset"
    )
    p.add_argument("--packing", default=None, help="concat (default), best_fit or pad")
    p.add_argument("--long-docs", default=None, help="split (default) or truncate, with --packing pad")
    p.add_argument("--mix", default=None, help="a mixture's mix (random, stratified, per_stream)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_explain)


def run_explain(args: argparse.Namespace) -> int:
    from shardstream.dataset import Stream
    from shardstream.dataset.explain import explain_step

    options = storage_options_for(args.url, args.endpoint_url)
    url: Any = args.url
    if url.lstrip().startswith("["):
        try:
            url = [Stream(**stream) for stream in json.loads(url)]
        except (ValueError, TypeError) as error:
            raise UsageError(
                f"URL is a JSON list of Stream arguments, and this one is not: {error}"
            ) from None
    extra = {"mix": args.mix} if args.mix is not None else {}
    found = explain_step(
        url,
        step=args.step,
        global_batch_size=args.global_batch_size,
        epoch=args.epoch,
        seed=args.seed,
        shuffle=not args.no_shuffle,
        read_lanes=args.read_lanes,
        seq_len=args.seq_len,
        packing=args.packing,
        long_docs=args.long_docs,
        storage_options=options,
        **extra,
    )
    if args.json:
        print(json.dumps([entry.to_dict() for entry in found], indent=1))
        return 0
    for entry in found:
        where = f"{entry.stream}:" if entry.stream is not None else ""
        if entry.key is not None:
            print(f"{entry.position:>6}  {where}{entry.shard}  sample {entry.index}  {entry.key}")
            continue
        documents = ", ".join(f"{key} [{lo}, {hi})" for key, _, lo, hi in entry.pieces) or "padding"
        print(f"{entry.position:>6}  {where}{entry.shard}  sequence {entry.index}  {documents}")
    return 0
