"""The ``shardstream`` command: pack, index, inspect, verify, explain.

Thin: each subcommand is one ``add_*`` function that declares its arguments and one
``run_*`` function that calls the library, in a module by job (``pack``; ``catalog``:
index, inspect, verify; ``explain``). Another subcommand is one more pair, added to
``SUBCOMMANDS``. Exit status: 0 on success, 1 for data errors (and ``verify``
finding bad shards), 2 for usage errors; no traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from shardstream._version import __version__
from shardstream.cli.catalog import add_index, add_inspect, add_verify
from shardstream.cli.catalog import run_index as run_index
from shardstream.cli.catalog import run_inspect as run_inspect
from shardstream.cli.catalog import run_verify as run_verify
from shardstream.cli.common import common_parser
from shardstream.cli.common import storage_options_for as storage_options_for
from shardstream.cli.explain import add_explain
from shardstream.cli.explain import run_explain as run_explain
from shardstream.cli.pack import add_pack
from shardstream.cli.pack import run_pack as run_pack
from shardstream.errors import ShardstreamError, UsageError

SUBCOMMANDS: list[Callable[[Any, argparse.ArgumentParser], None]] = [
    add_pack,
    add_index,
    add_inspect,
    add_verify,
    add_explain,
]


def build_parser() -> argparse.ArgumentParser:
    common = common_parser()
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
