"""The ``shardstream`` command: pack, index, inspect, verify, explain.

Thin: each subcommand is one ``add_*`` function that declares its arguments and one
``run_*`` function that calls the library. Another subcommand is one more pair, added
to ``SUBCOMMANDS``. Exit status: 0 on success, 1 for data errors (and ``verify``
finding bad shards), 2 for usage errors; no traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from shardstream._version import __version__
from shardstream.counts import parse_count
from shardstream.errors import ShardstreamError, UsageError
from shardstream.progress import ProgressBar, human_bytes, plural


def storage_options_for(url: str, endpoint_url: str | None) -> dict[str, Any] | None:
    """fsspec options for ``url``: the S3 endpoint if one was given (else AWS_* variables apply)."""
    if endpoint_url and url.startswith(("s3://", "s3a://")):
        return {"endpoint_url": endpoint_url}
    return None


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--endpoint-url", help="S3 endpoint (MinIO, SeaweedFS...); default: AWS_ENDPOINT_URL")
    common.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    common.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return common


def _count(text: str) -> int:
    """A count from 1 to ``MAX_COUNT`` (argparse type): a clear usage error, never an OverflowError."""
    try:
        return parse_count(text, "a count")
    except UsageError as error:
        raise argparse.ArgumentTypeError(error.message) from None


# -- pack ---------------------------------------------------------------------------


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
    p.add_argument("--samples-per-shard", type=_count, metavar="N", help="most samples in a shard")
    p.add_argument(
        "--workers",
        type=_count,
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
    _sequence_options(tokens)
    p.set_defaults(run=run_pack)


def _sequence_options(group: Any) -> None:
    group.add_argument(
        "--seq-len",
        type=_count,
        metavar="S",
        help="also count the packed sequences of S tokens of each shard and record them in the manifest "
        "(best_fit's bins beside the shards), so a plan needs no sidecar to count them",
    )
    group.add_argument(
        "--packing",
        choices=("best_fit", "pad"),
        default="best_fit",
        help="with --seq-len (default: best_fit)",
    )
    group.add_argument(
        "--long-docs",
        choices=("split", "truncate"),
        default="split",
        help="with --packing pad (default: split)",
    )


def _record_sequences(args: argparse.Namespace, url: str) -> None:
    """With ``--seq-len``: count and record a token dataset's packed sequences (NOTE [ Recorded sequences ])."""
    from shardstream.catalog import record_sequences

    manifest = record_sequences(
        url,
        args.seq_len,
        packing=args.packing,
        long_docs=args.long_docs,
        storage_options=storage_options_for(url, args.endpoint_url),
    )
    if not args.quiet:
        key = next(key for key in manifest.sequences if key.startswith(f"{args.packing}/{args.seq_len}"))
        count = sum(manifest.sequences[key])
        print(
            f"sequences: {plural(count, 'sequence')} of {args.seq_len} tokens ({args.packing}) recorded at {url}"
        )


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
        _record_sequences(args, args.dest)
    return 0


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
    _sequence_options(p.add_argument_group("packed sequences of a token dataset"))
    p.set_defaults(run=run_index)


def run_index(args: argparse.Namespace) -> int:
    from shardstream.catalog import index_dataset
    from shardstream.diagnose import has_manifest

    options = storage_options_for(args.url, args.endpoint_url)
    if args.seq_len is not None and not args.rehash and has_manifest(args.url, options):
        _record_sequences(args, args.url)  # a dataset already: its sequences alone
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
        _record_sequences(args, args.url)
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


# -- explain ------------------------------------------------------------------------


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
    p.add_argument("--global-batch-size", type=_count, required=True, metavar="B")
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shuffle", action="store_true", help="the run had shuffle=False")
    p.add_argument("--read-lanes", type=_count, default=None, metavar="L")
    p.add_argument(
        "--seq-len", type=_count, default=None, metavar="S", help="packed sequences of a token dataset"
    )
    p.add_argument("--packing", default=None, help="concat (default), best_fit or pad")
    p.add_argument("--long-docs", default=None, help="split (default) or truncate, with --packing pad")
    p.add_argument("--mix", default=None, help="a mixture's mix (random, stratified, per_stream)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_explain)


def run_explain(args: argparse.Namespace) -> int:
    from shardstream.dataset.explain import explain_step
    from shardstream.dataset.mixture import Stream

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


# -- main ---------------------------------------------------------------------------

SUBCOMMANDS: list[Callable[[Any, argparse.ArgumentParser], None]] = [
    add_pack,
    add_index,
    add_inspect,
    add_verify,
    add_explain,
]


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="shardstream",
        description="Pack corpora into tar or Parquet shards on object storage, and check them.",
    )
    parser.add_argument("--version", action="version", version=f"shardstream {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(subparsers, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: --help, --version, or a usage error (2)
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return int(args.run(args))
    except ShardstreamError as error:
        return _fail(args, error, 2 if isinstance(error, UsageError) else 1)
    except KeyboardInterrupt:
        print(f"shardstream {args.command}: interrupted{_RESUMES.get(args.command, '')}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the output went to `head` or similar, which stopped reading
        _silence_stdout()
        return 1
    except Exception as error:  # a bug or an environment problem: say so briefly
        return _fail(args, error, 1)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# What Ctrl-C leaves, said as it stops: a pack keeps its shards and its record, so the same
# command finishes the job (NOTE [ Packs in progress ] in pack/dest.py).
_RESUMES = {
    "pack": "; run the same command again to resume: the shards written so far are kept and reused",
    "index": "; nothing was written (the manifest comes last): run it again",
}


def _fail(args: argparse.Namespace, error: BaseException, status: int) -> int:
    if getattr(args, "json", False):  # --json: the error as JSON on stdout, as the answer would be
        print(json.dumps(_error_record(error), indent=1))
    if args.debug:
        traceback.print_exc()
    else:
        text = str(error) if isinstance(error, ShardstreamError) else f"{type(error).__name__}: {error}"
        hint = "" if isinstance(error, ShardstreamError) else " (run with --debug for the traceback)"
        print(f"shardstream {args.command}: error: {text}{hint}", file=sys.stderr)
    return status


def _error_record(error: BaseException) -> dict[str, Any]:
    """An error for ``--json``: its message, kind, and where it is."""
    if not isinstance(error, ShardstreamError):
        return {"error": f"{type(error).__name__}: {error}", "type": type(error).__name__}
    record: dict[str, Any] = {"error": error.message, "type": type(error).__name__}
    for name in ("url", "shard", "offset", "line"):
        if getattr(error, name) is not None:
            record[name] = getattr(error, name)
    return record
