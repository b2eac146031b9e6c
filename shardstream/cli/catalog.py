"""``shardstream index``, ``inspect`` and ``verify``: a dataset's manifest written, shown and checked."""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardstream.cli.common import add_sequence_options, record_sequences_at, storage_options_for
from shardstream.progress import human_bytes, plural

# -- index --------------------------------------------------------------------------


def add_index(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "index",
        parents=[common],
        help="write the manifest and sample indexes for shards another tool wrote (or for --part jobs)",
        description="Index every *.tar or *.parquet shard under URL and write URL/.shardstream/manifest.json.",
    )
    p.add_argument("url", metavar="URL")
    p.add_argument("--threads", type=int, default=4, metavar="N", help="shards read at once (default: 4)")
    p.add_argument(
        "--rehash", action="store_true", help="read every shard, even those listed in part records"
    )
    add_sequence_options(p.add_argument_group("packed sequences of a token dataset"))
    p.set_defaults(run=run_index)


def run_index(args: argparse.Namespace) -> int:
    from shardstream.catalog import index_dataset
    from shardstream.diagnose import has_manifest

    options = storage_options_for(args.url, args.endpoint_url)
    if args.seq_len is not None and not args.rehash and has_manifest(args.url, options):
        record_sequences_at(args, args.url)  # a dataset already: its sequences alone
        return 0
    manifest = index_dataset(
        args.url,
        storage_options=storage_options_for(args.url, args.endpoint_url),
        threads=args.threads,
        rehash=args.rehash,
    )
    if not args.quiet:
        print(
            f"index: {plural(len(manifest.shards), manifest.format + ' shard')}, "
            f"{plural(manifest.num_samples, 'sample')}, "
            f"{human_bytes(manifest.num_bytes)}; wrote .shardstream/manifest.json at {args.url}"
        )
    if args.seq_len is not None:
        record_sequences_at(args, args.url)
    return 0


# -- inspect ------------------------------------------------------------------------


def add_inspect(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("inspect", parents=[common], help="show what a dataset holds")
    p.add_argument("url", metavar="URL")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--keys", type=int, default=5, metavar="N", help="sample keys to show (default: 5)")
    p.set_defaults(run=run_inspect)


def _tokens_line(tokens: dict[str, Any]) -> str:
    """A token dataset's count, id type and tokenizer, for ``inspect``."""
    count = tokens.get("num_tokens")
    parts = [f"{count:,}" if isinstance(count, int) else "?", tokens["dtype"]]
    for key, name in (
        ("vocab_size", "vocabulary"),
        ("eos_id", "eos"),
        ("bos_id", "bos"),
        ("tokenizer", "tokenizer"),
    ):
        if tokens.get(key) is not None:
            parts.append(f"{name} {tokens[key]}")
    return ", ".join(parts)


def run_inspect(args: argparse.Namespace) -> int:
    from shardstream.catalog import inspect_dataset

    summary = inspect_dataset(
        args.url, storage_options=storage_options_for(args.url, args.endpoint_url), sample_keys=args.keys
    )
    if args.json:
        print(json.dumps(summary.to_dict(), indent=1))
        return 0
    sizes, counts = summary.shard_bytes, summary.shard_samples
    rows = [
        ("dataset", summary.url),
        ("format", summary.format),
        ("writer", summary.writer or "-"),
        ("shards", f"{summary.num_shards:,}"),
        ("samples", f"{summary.num_samples:,}"),
        ("bytes", f"{summary.num_bytes:,} ({human_bytes(summary.num_bytes)})"),
        ("fields", ", ".join(summary.fields) or "-"),
    ]
    if summary.schema:
        rows.append(("schema", ", ".join(f"{k}: {v}" for k, v in summary.schema.items())))
    if summary.tokens is not None:
        rows.append(("tokens", _tokens_line(summary.tokens)))
    more = " ..." if len(summary.sample_keys) < summary.num_samples else ""
    rows.append(("sample keys", ", ".join(summary.sample_keys) + more))
    if sizes:
        order = ("min", "p10", "p50", "p90", "max")
        rows.append(("shard bytes", "  ".join(f"{q} {human_bytes(sizes[q])}" for q in order)))
        rows.append(("shard samples", "  ".join(f"{q} {int(counts[q]):,}" for q in order)))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


# -- verify -------------------------------------------------------------------------


def add_verify(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "verify", parents=[common], help="re-read every shard: checksums, sample counts, sample indexes"
    )
    p.add_argument("url", metavar="URL")
    p.add_argument("--threads", type=int, default=4, metavar="N", help="shards read at once (default: 4)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from shardstream.catalog import verify_dataset

    report = verify_dataset(
        args.url, storage_options=storage_options_for(args.url, args.endpoint_url), threads=args.threads
    )
    if args.json:
        print(
            json.dumps(
                {
                    "url": report.url,
                    "ok": report.ok,
                    "num_shards": report.num_shards,
                    "bad_shards": report.bad_shards,
                    "problems": [{"shard": p.shard, "problem": p.problem} for p in report.problems],
                    "unlisted": list(report.unlisted),
                    "unchecked": list(report.unchecked),
                },
                indent=1,
            )
        )
    elif not args.quiet or not report.ok:
        for problem in report.problems:
            print(f"BAD {problem.shard}: {problem.problem}")
        for path in report.unlisted:
            print(f"note: {path} looks like a shard but the manifest does not list it")
        if report.unchecked:
            print(
                f"note: {plural(len(report.unchecked), 'shard has', 'shards have')} sample indexes without checksums (an older "
                f"shardstream wrote them), so reads of them are not checked; `shardstream index {args.url}` adds them"
            )
        bad = len(report.bad_shards)
        verdict = "OK" if report.ok else f"{bad} of {plural(report.num_shards, 'shard')} bad"
        shards, samples = plural(report.num_shards, "shard"), plural(report.num_samples, "sample")
        print(f"verify: {shards}, {samples} checked: {verdict}")
    return 0 if report.ok else 1
