"""Write docs/benchmarks.md (and its charts, docs/img/bench-*.svg) from the results file.

    python tools/bench_report.py                    # docs/benchmarks.json -> docs/benchmarks.md
    python tools/bench_report.py --results R.json --out OUT.md --img DIR

The results file (written by the bench tools' ``--record``, see tools/results.py) holds
the claims (title, unit, what is measured, a target) and rows of results; the page shows
the latest row of each claim: one table, the command that measures it, the machine and
the date, and a chart where the claim asks for one. The charts are SVG, written with a
fixed hash salt and no date, so the same results give the same files.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from results import RESULTS, load

HEADER = """# Benchmarks

Every figure here is the latest result of its claim, with the command that measures it
again, the machine and the date. The page is generated: run the command, then
`python tools/bench_report.py`, and commit the results file
(`docs/benchmarks.json`, which keeps the older rows as history), this page and its
charts. The bench tools `tools/bench_wan.py` and `tools/bench_stream.py` append their
results with `--record`.

How to read the figures: rates are medians over rounds, and a ratio `a / b` is the
median of the ratios within each round, so a slow drift of a shared machine's load
cancels out of it. Above 1.0x means `a` is faster (or, for memory and time, larger).
The machines are small and shared: take ratios, not absolute rates, and expect about
10-20% between runs.
"""


def latest(rows: list[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The last row of each claim, in file order (a later row replaces an earlier one)."""
    found: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        found[row["claim"]] = row
    return found


def number(value: float, unit: str) -> str:
    if unit.startswith("x"):
        return f"{value:.2f}x"
    if abs(value) >= 1000 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:,.2f}".rstrip("0")


def _load(row: Mapping[str, Any]) -> str:
    """The load average a row was measured under, where it was recorded."""
    return f" (load average {row['load']:g} as the run ended)" if "load" in row else ""


def chart(claim: str, meta: Mapping[str, Any], row: Mapping[str, Any], img: pathlib.Path) -> str | None:
    """A horizontal bar chart of the row's figures (else its ratios), as SVG; its file name."""
    values, unit = row["figures"], meta.get("unit", "")
    if not values:
        values, unit = row["ratios"], "x"
    if not meta.get("chart") or not values:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "shardstream"
    plt.rcParams["svg.fonttype"] = "none"
    names = list(values)[::-1]
    heights = [values[name] for name in names]
    ours = [name.startswith("shardstream") for name in names]
    colors = ["#3f51b5" if mine or not any(ours) else "#9e9e9e" for mine in ours]
    figure, axes = plt.subplots(figsize=(7.5, 0.45 * len(names) + 1.0))
    axes.barh(names, heights, color=colors)
    for y, value in enumerate(heights):
        axes.text(value, y, " " + number(value, unit), va="center", fontsize=9)
    if "target" in meta:
        axes.axvline(meta["target"], color="#e53935", linestyle="--", linewidth=1)
    axes.set_xlabel(
        unit + ("  (higher is better)" if meta.get("better") == "higher" else "  (lower is better)")
    )
    axes.set_xlim(0, max([*heights, meta.get("target", 0)]) * 1.2)
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    img.mkdir(parents=True, exist_ok=True)
    name = f"bench-{claim}.svg"
    figure.savefig(img / name, format="svg", metadata={"Date": None})
    plt.close(figure)
    return name


def section(claim: str, meta: Mapping[str, Any], row: Mapping[str, Any], img: pathlib.Path, rel: str) -> str:
    unit = meta.get("unit", "")
    lines = [f"## {meta.get('title', claim)}", "", meta.get("about", ""), ""]
    lines += [
        f"- Command: `{row['command']}`",
        f"- Machine: {row['machine']}{_load(row)}",
        f"- Date: {row['date']}",
        "",
    ]
    if row["figures"]:
        lines += [f"| | {unit} |", "|---|---|"]
        lines += [f"| {name} | {number(value, unit)} |" for name, value in row["figures"].items()]
        lines.append("")
    if row["ratios"]:
        lines += ["| Ratio | |", "|---|---|"]
        lines += [f"| {name} | {value:.2f}x |" for name, value in row["ratios"].items()]
        lines.append("")
    if row.get("note"):
        lines += [row["note"], ""]
    name = chart(claim, meta, row, img)
    if name:
        lines += [f"![{meta.get('title', claim)}]({rel}/{name})", ""]
    return "\n".join(lines)


def value_of(data: Mapping[str, Any], row: Mapping[str, Any], key: str) -> str:
    """``key`` of ``row``: a ratio (``1.04x``) or a figure in its claim's unit."""
    if key in row["ratios"]:
        return f"{row['ratios'][key]:.2f}x"
    unit = data["claims"].get(row["claim"], {}).get("unit", "")
    return f"{number(row['figures'][key], unit)} {unit}"


def summary(data: Mapping[str, Any], link: str = "") -> str:
    """The table of headline figures (the file's ``summary``): what, the figure, the command."""
    rows = latest(data["results"])
    lines = ["| What | Figure | Command |", "|---|---|---|"]
    for entry in data.get("summary", []):
        row = rows[entry["claim"]]
        figure = value_of(data, row, entry["key"])
        if "peer" in entry:
            figure += f" ({entry['peer']}: {value_of(data, row, entry['peer'])})"
        what = f"[{entry['what']}]({link}#{anchor(data, entry['claim'])})" if link else entry["what"]
        lines.append(f"| {what} | {figure} | `{row['command']}` |")
    return "\n".join(lines) + "\n"


def anchor(data: Mapping[str, Any], claim: str) -> str:
    """The heading id MkDocs gives a claim's section (its toc slug)."""
    title = data["claims"].get(claim, {}).get("title", claim).lower()
    kept = "".join(c for c in title if c.isalnum() or c in " -_")
    return "-".join(kept.split())


def render(data: Mapping[str, Any], img: pathlib.Path, rel: str = "img") -> str:
    """The page: the header, then a section per claim (the claims' order, then the rest)."""
    rows = latest(data["results"])
    claims = data["claims"]
    order = [c for c in claims if c in rows] + [c for c in rows if c not in claims]
    parts = [HEADER, "## Summary\n", summary(data)]
    parts += [section(c, claims.get(c, {}), rows[c], img, rel) for c in order]
    return "\n".join(parts).rstrip() + "\n"


BEGIN, END = "<!-- bench_report: begin -->", "<!-- bench_report: end -->"


def update_readme(readme: pathlib.Path, data: Mapping[str, Any]) -> bool:
    """Replace the summary between the README's markers; False where it has none."""
    if not readme.exists():
        return False
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{summary(data)}{END}{tail}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS, help="the results file (JSON)")
    parser.add_argument(
        "--out", type=pathlib.Path, default=RESULTS.with_suffix(".md"), help="the page to write"
    )
    parser.add_argument(
        "--img", type=pathlib.Path, help="where the charts go (default: img/ beside the page)"
    )
    parser.add_argument(
        "--readme",
        type=pathlib.Path,
        default=HERE.parent / "README.md",
        help="whose summary table (between its bench_report markers) to rewrite",
    )
    args = parser.parse_args(argv)
    img = args.img or args.out.parent / "img"
    rel = img.relative_to(args.out.parent) if img.is_relative_to(args.out.parent) else img
    data = load(args.results)
    args.out.write_text(render(data, img, rel=rel.as_posix()))
    print(f"wrote {args.out} and the charts in {img}")
    if update_readme(args.readme, data):
        print(f"wrote the summary in {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
