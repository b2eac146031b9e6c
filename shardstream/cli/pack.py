"""``shardstream pack``: a source in, a dataset out (and a token dataset's sequences recorded)."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from shardstream.cli.common import add_sequence_options, count_arg, record_sequences_at, storage_options_for
from shardstream.progress import ProgressBar, plural


def add_pack(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "pack",
        parents=[common],
        help="pack a folder of files, JSON Lines, CSV, Parquet or tar shards into a dataset",
        description="Pack SOURCE into shards, sample indexes and a manifest at DEST (any fsspec URL).",
    )
    p.add_argument(
        "source", metavar="SOURCE", help="folder, .jsonl, .csv, .parquet (or folder of them), .tar"
    )
    p.add_argument("dest", metavar="DEST", help="dataset folder: a path, s3://bucket/prefix, ...")
    # Imported here, not at the top: ``import shardstream.cli`` stays light; every command
    # that parses arguments goes on to use the formats anyway.
    from shardstream.formats import available_formats

    formats = list(available_formats())  # the registered ones, a user's format too
    p.add_argument("--format", choices=formats, help="shard format (default: tar; tokens with --tokenizer)")
    p.add_argument(
        "--shard-size", help="largest shard, as 256MB or 64MiB (default: 256MB unless --samples-per-shard)"
    )
    p.add_argument("--samples-per-shard", type=count_arg, metavar="N", help="most samples in a shard")
    p.add_argument(
        "--workers",
        type=count_arg,
        metavar="N",
        help="worker processes (default: the core count; at most twice that)",
    )
    p.add_argument("--compression", help="Parquet compression: zstd (default), snappy, gzip, none")
    # No choices= here: listing the registered sources would import the pack (and numpy)
    # for every command; an unknown one is a usage error naming them all.
    p.add_argument(
        "--source-type", metavar="TYPE", help="folder, jsonl, csv, parquet, tar (default: detected)"
    )
    p.add_argument(
        "--part", metavar="I/N", help="pack only part I of N (0 <= I < N); then `shardstream index DEST`"
    )
    p.add_argument("--overwrite", action="store_true", help="replace another dataset already at DEST")
    tokens = p.add_argument_group("tokenizing (with --format tokens or parquet)")
    tokens.add_argument(
        "--tokenizer", metavar="T", help="tokenize text: a tokenizer.json, or a name tokenizers can load"
    )
    tokens.add_argument(
        "--text-field", metavar="F", help="the field holding the text (default: text, or txt)"
    )
    tokens.add_argument(
        "--append-eos",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="end each document with the tokenizer's EOS (default: when it has one)",
    )
    add_sequence_options(tokens)
    p.set_defaults(run=run_pack)


def run_pack(args: argparse.Namespace) -> int:
    from shardstream.pack import pack

    progress = ProgressBar("pack", enabled=False if args.quiet else None)
    try:
        with contextlib.nullcontext() if args.quiet else progress.messages():
            manifest = pack(
                args.source,
                args.dest,
                format=args.format,
                shard_size=args.shard_size,
                samples_per_shard=args.samples_per_shard,
                workers=args.workers,
                storage_options=storage_options_for(args.dest, args.endpoint_url),
                source_options=storage_options_for(args.source, args.endpoint_url),
                compression=args.compression,
                source_type=args.source_type,
                overwrite=args.overwrite,
                part=args.part,
                progress=progress,
                tokenizer=args.tokenizer,
                text_field=args.text_field,
                append_eos=args.append_eos,
            )
    finally:
        progress.close()
    if not args.quiet:
        where = f"into {plural(len(manifest.shards), 'shard')} at {args.dest}"
        print(progress.summary(where))
        if args.part:
            print(f"part {args.part} done; when every part is, run: shardstream index {args.dest}")
    if args.seq_len is not None and not args.part:
        record_sequences_at(args, args.dest)
    return 0
