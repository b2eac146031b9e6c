"""The benchmark records: tools/results.py appends a result, tools/bench_report.py makes
docs/benchmarks.md (a table per claim, its command, charts) and the README's summary
from them; the committed page is what the committed results give."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import bench_report  # noqa: E402
import results  # noqa: E402


@pytest.fixture
def results_file(tmp_path):
    path = tmp_path / "results.json"
    claims = {"wan-large": {"title": "1 MB over a network", "unit": "MB/s", "chart": True, "target": 100}}
    summary = [{"what": "1 MB cold", "claim": "wan-large", "key": "shardstream tar", "peer": "litdata"}]
    path.write_text(json.dumps({"claims": claims, "results": [], "summary": summary}))
    return path


def test_a_recorded_result_names_its_machine_date_and_command(results_file):
    command = results.command_line(["tools/bench_wan.py", "--only", "large", "--record"])
    assert command == "python tools/bench_wan.py --only large"
    row = results.record(
        "wan-large", command, {"shardstream tar": 200.0}, ratios={"x": 1.5}, path=results_file
    )
    stored = json.loads(results_file.read_text())["results"]
    assert stored == [row]
    assert row["machine"]
    assert row["date"].count("-") == 2
    assert row["figures"] == {"shardstream tar": 200.0}
    assert row["ratios"] == {"x": 1.5}


def test_the_page_shows_the_latest_result_of_each_claim_with_a_chart(results_file, tmp_path):
    results.record("wan-large", "python old", {"shardstream tar": 1.0, "litdata": 1.0}, path=results_file)
    results.record("wan-large", "python new", {"shardstream tar": 238.5, "litdata": 86.0}, path=results_file)
    results.record("unknown-claim", "python other", {}, ratios={"a / b": 0.5}, path=results_file)
    out, img = tmp_path / "benchmarks.md", tmp_path / "img"
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{bench_report.BEGIN}\nold\n{bench_report.END}\nafter\n")
    argv = ["--results", str(results_file), "--out", str(out), "--img", str(img), "--readme", str(readme)]
    assert bench_report.main(argv) == 0
    page = out.read_text()
    assert "## 1 MB over a network" in page
    assert "`python new`" in page
    assert "python old" not in page
    assert "| shardstream tar | 238.5 |" in page
    assert "| litdata | 86 |" in page
    assert "## unknown-claim" in page
    assert "| a / b | 0.50x |" in page
    assert "![1 MB over a network](img/bench-wan-large.svg)" in page
    chart = (img / "bench-wan-large.svg").read_bytes()
    assert chart.startswith(b"<?xml")
    assert b"<svg" in chart
    assert bench_report.main(argv) == 0
    assert (img / "bench-wan-large.svg").read_bytes() == chart, "the same results give the same chart"
    text = readme.read_text()
    assert "\nold\n" not in text
    assert text.endswith("after\n")
    assert "| 1 MB cold | 238.5 MB/s (litdata: 86 MB/s) | `python new` |" in text


def test_the_committed_page_is_what_the_committed_results_give(tmp_path):
    """docs/benchmarks.md is generated: editing it by hand, or the results without
    regenerating it (``python tools/bench_report.py``), fails here."""
    out = tmp_path / "benchmarks.md"
    argv = ["--out", str(out), "--img", str(tmp_path / "img"), "--readme", str(tmp_path / "none.md")]
    subprocess.run([sys.executable, str(ROOT / "tools" / "bench_report.py"), *argv], check=True, cwd=ROOT)
    committed = (ROOT / "docs" / "benchmarks.md").read_text()
    assert out.read_text() == committed
    # the charts' bytes follow matplotlib's version; their names follow the results
    for name in sorted((tmp_path / "img").iterdir()):
        assert (ROOT / "docs" / "img" / name.name).exists(), f"docs/img/{name.name} is not committed"
