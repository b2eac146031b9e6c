"""Benchmark token streams (docs/tokens.md): each section prints its rates and its ratio
against the baseline it names.

    python tools/bench_tokens.py                      # every section
    python tools/bench_tokens.py --only bestfit       # best-fit bins against a Python best-fit
    python tools/bench_tokens.py --only build         # building packed sequences against numpy chunking
    python tools/bench_tokens.py --only bestfit --tokens 10000000   # a quick run

Sections register themselves in SECTIONS (name -> function taking the parsed arguments);
each adds its own options in its ``_options_*`` function.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {}
OPTIONS: list[Callable[[argparse.ArgumentParser], None]] = []


def section(
    name: str,
) -> Callable[[Callable[[argparse.Namespace], None]], Callable[[argparse.Namespace], None]]:
    def register(func: Callable[[argparse.Namespace], None]) -> Callable[[argparse.Namespace], None]:
        SECTIONS[name] = func
        return func

    return register


# -- sections: each between its own markers, so that edits to one never touch another --

# -- section tokenize (begin) --
# -- section tokenize (end) --

# -- sections bestfit, build (begin) --
# -- sections bestfit, build (end) --


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only these sections")
    for add in OPTIONS:
        add(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for name in args.only or list(SECTIONS):
        print(f"== {name}", flush=True)
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
