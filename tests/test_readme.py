"""The README is for users: short, its test command the one CI runs, its links alive."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short():
    assert len(README.splitlines()) < 250


def test_ci_runs_exactly_the_readmes_test_command():
    commands = [
        line for line in README.splitlines() if "pytest" in line and line.startswith("python3 -m venv")
    ]
    assert len(commands) == 1, commands
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == commands[0]
    assert "mkdocs build --strict" in ci


def test_the_readmes_links_to_files_exist():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if "://" not in t]
    assert local, "no links found"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing


def test_every_docs_page_is_in_the_sites_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert [p for p in pages if p not in nav] == []
