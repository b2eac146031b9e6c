"""Run one benchmark on two revisions of shardstream, side by side in one run.

    python tools/bench_compare.py BASE HEAD [--rounds 3] -- tools/bench_stream.py --only small

BASE and HEAD are git revisions (``.`` is the working tree as it is). Each is checked out
in a temp worktree, and the benchmark command runs ``--rounds`` times on each, the two
alternating (base first in odd rounds, head first in even ones) so that a change of the
machine's load hits both alike. The benchmark runs with the revision's own ``tools/`` and
``shardstream/`` (``PYTHONPATH``), in this Python.

Every figure the benchmark prints is matched by its line (the line with its numbers
blanked out) and its place in the line; for each, the median over the rounds on each side
and the median of the per-round ratios ``head / base`` are printed. A ratio of a rate is
better above 1, of a time or a size better below 1: read it with the line beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["compare", "figures"]

_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
# a verdict a benchmark prints beside a target: blanked, so that the line of a round that met
# it and of one that missed it are the same figure
_VERDICT = re.compile(r"\b(?:met|MISSED)\b")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def figures(output: str) -> dict[tuple[str, int], float]:
    """``{(section | line with numbers blanked, place): value}`` for every number ``output``
    prints. A section is named by the last line not indented (benchmarks print the same
    rows in each of theirs); a line that occurs twice in one section keeps its first figures."""
    found: dict[tuple[str, int], float] = {}
    section = ""
    for line in output.splitlines():
        line = _VERDICT.sub("?", line)
        if line.strip() and not line[0].isspace():
            section = " ".join(_NUMBER.sub("#", line).split())[:40]
        numbers = _NUMBER.findall(line)
        if not numbers:
            continue
        shape = " ".join(_NUMBER.sub("#", line).split())
        if line[0].isspace() and section:
            shape = f"[{section}] {shape}"
        for place, text in enumerate(numbers):
            found.setdefault((shape, place), float(text.replace(",", "")))
    return found


@contextlib.contextmanager
def checkout(revision: str, where: str) -> Iterator[str]:
    """A folder holding ``revision`` of this repository (``.``: the working tree itself)."""
    if revision == ".":
        yield ROOT
        return
    path = os.path.join(where, re.sub(r"\W", "_", revision))
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", path, revision], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path], check=False)


def run(tree: str, command: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run([sys.executable, *command], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"bench_compare: {' '.join(command)} failed in {tree} (exit {done.returncode})")
    return done.stdout


def compare(base: str, head: str, command: list[str], rounds: int) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="bench-compare-") as where,
        checkout(base, where) as base_tree,
        checkout(head, where) as head_tree,
    ):
        seen: dict[str, list[dict[tuple[str, int], float]]] = {"base": [], "head": []}
        for number in range(rounds):
            order = [("base", base_tree), ("head", head_tree)]
            for side, tree in order if number % 2 == 0 else order[::-1]:
                seen[side].append(figures(run(tree, command)))
            print(f"round {number + 1} of {rounds} done", file=sys.stderr)
    show(base, head, command, seen)


def show(
    base: str, head: str, command: list[str], seen: dict[str, list[dict[tuple[str, int], float]]]
) -> None:
    print(f"{' '.join(command)}: base {base}, head {head}, {len(seen['base'])} rounds each, alternating")
    print(
        f"{'base':>11} {'head':>11} {'head/base':>10}  figure (the @ in its line; figures equal in every run left out)"
    )
    keys = [key for key in seen["base"][0] if all(key in run for side in seen.values() for run in side)]
    for shape, place in keys:
        bases = [run[(shape, place)] for run in seen["base"]]
        heads = [run[(shape, place)] for run in seen["head"]]
        if len({*bases, *heads}) == 1:  # a size or a target: the same on both sides
            continue
        ratios = [h / b for b, h in zip(bases, heads, strict=True) if b]
        ratio = f"{statistics.median(ratios):9.3f}x" if ratios else "        -"
        section, _, line = shape.rpartition("] ") if shape.startswith("[") else ("", "", shape)
        pieces = line.split("#")
        label = (
            f"{section}] " * bool(section)
            + "#".join(pieces[: place + 1])
            + "@"
            + "#".join(pieces[place + 1 :])
        )
        print(f"{statistics.median(bases):11.4g} {statistics.median(heads):11.4g} {ratio}  {label[:100]}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("base", help="a git revision, or . for the working tree")
    parser.add_argument("head", help="a git revision, or . for the working tree")
    parser.add_argument("--rounds", type=int, default=3, help="runs of the benchmark on each side")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("give the benchmark after --, e.g. -- tools/bench_plan.py --quick")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if shutil.which("git") is None:
        parser.error("git is needed to check out the two revisions")
    compare(args.base, args.head, command, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
