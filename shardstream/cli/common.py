"""What the subcommands share: the common options, the S3 endpoint, counts as arguments,
and the packed-sequence options of ``pack`` and ``index``."""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.counts import parse_count
from shardstream.errors import UsageError
from shardstream.progress import plural


def storage_options_for(url: str, endpoint_url: str | None) -> dict[str, Any] | None:
    """fsspec options for ``url``: the S3 endpoint if one was given (else AWS_* variables apply)."""
    if endpoint_url and url.startswith(("s3://", "s3a://")):
        return {"endpoint_url": endpoint_url}
    return None


def common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--endpoint-url", help="S3 endpoint (MinIO, SeaweedFS...); default: AWS_ENDPOINT_URL")
    common.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    common.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return common


def count_arg(text: str) -> int:
    """A count from 1 to ``MAX_COUNT`` (argparse type): a clear usage error, never an OverflowError."""
    try:
        return parse_count(text, "a count")
    except UsageError as error:
        raise argparse.ArgumentTypeError(error.message) from None


def add_sequence_options(group: Any) -> None:
    """``--seq-len``, ``--packing`` and ``--long-docs``: of ``pack`` and ``index``."""
    group.add_argument(
        "--seq-len",
        type=count_arg,
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


def record_sequences_at(args: argparse.Namespace, url: str) -> None:
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
