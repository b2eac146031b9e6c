"""Benchmark results, kept in one file that ``tools/bench_report.py`` turns into
``docs/benchmarks.md``.

A bench tool run with ``--record`` appends one row per claim it measured::

    from results import record
    record("wan-large", command, {"shardstream tar": 238.5, "litdata": 86.0}, ratios={...})

A row is ``claim`` (an id; its title, unit and what it measures are in the file's
``claims``), ``machine``, ``date`` (UTC), ``load`` (the load average as it ended), ``command`` (what to run to measure it again),
``figures`` (contender -> number, in the claim's unit) and ``ratios`` (name -> x). The
report shows the latest row of each claim; older rows stay in the file as its history.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

# SHARDSTREAM_RESULTS points a run (or a test) at another file.
RESULTS = pathlib.Path(
    os.environ.get("SHARDSTREAM_RESULTS")
    or pathlib.Path(__file__).resolve().parent.parent / "docs" / "benchmarks.json"
)


def machine() -> str:
    """This machine in a few words: CPU count, architecture, OS, Python."""
    cores = os.cpu_count() or 0
    return (
        f"{cores} cores {platform.machine()}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def command_line(argv: Sequence[str] | None = None, drop: Sequence[str] = ("--record",)) -> str:
    """The command that ran this tool, as a user would type it again (``--record`` left out)."""
    argv = list(sys.argv if argv is None else argv)
    script = pathlib.Path(argv[0])
    if script.resolve().parent == pathlib.Path(__file__).resolve().parent:
        argv[0] = f"tools/{script.name}"
    return shlex.join(["python", *(arg for arg in argv if arg not in drop)])


def load(path: pathlib.Path = RESULTS) -> dict[str, Any]:
    """The results file: ``{"claims": {id: {...}}, "results": [row, ...]}``."""
    if not path.exists():
        return {"claims": {}, "results": []}
    data = json.loads(path.read_text())
    data.setdefault("claims", {})
    data.setdefault("results", [])
    return data


def save(data: Mapping[str, Any], path: pathlib.Path = RESULTS) -> None:
    """Written whole through a temporary file, so a killed run leaves the old file."""
    temp = path.with_suffix(".json.tmp")
    temp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    temp.replace(path)


def record(
    claim: str,
    command: str,
    figures: Mapping[str, float],
    *,
    ratios: Mapping[str, float] | None = None,
    note: str = "",
    path: pathlib.Path = RESULTS,
) -> dict[str, Any]:
    """Append one result of ``claim`` to the results file and return its row."""
    row = {
        "claim": claim,
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "load": round(os.getloadavg()[0], 1),  # a shared machine's load moves its figures
        "command": command,
        "figures": {name: round(float(value), 4) for name, value in figures.items()},
        "ratios": {name: round(float(value), 4) for name, value in (ratios or {}).items()},
    }
    if note:
        row["note"] = note
    data = load(path)
    data["results"].append(row)
    save(data, path)
    print(f"  recorded {claim} in {path.name}")
    return row
