"""The import rule of DESIGN.md: formats, storage and plan never import each other; the
plan does no I/O and never imports torch; only the dataset, sampler and loader need torch."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "shardstream"

FORBIDDEN = {
    "formats": {
        "shardstream.storage",
        "shardstream.plan",
        "shardstream.dataset",
        "shardstream.pack",
        "fsspec",
        "torch",
    },
    "storage": {
        "shardstream.formats",
        "shardstream.plan",
        "shardstream.dataset",
        "shardstream.pack",
        "torch",
    },
    "plan": {
        "shardstream.formats",
        "shardstream.storage",
        "shardstream.dataset",
        "shardstream.pack",
        "fsspec",
        "torch",
        "os",
        "io",
        "socket",
        "pathlib",
        "random",
    },
}


def imported_modules(path: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports(layer):
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files, f"layer {layer} has no modules"
    bad = []
    for path in files:
        for name in imported_modules(path):
            for forbidden in FORBIDDEN[layer]:
                if name == forbidden or name.startswith(forbidden + "."):
                    bad.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not bad, "layer rule broken:\n" + "\n".join(bad)


def test_import_shardstream_does_not_import_torch():
    code = "import shardstream, shardstream.cli, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_public_modules_declare_all():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.startswith("_") and path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        has_all = any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
            for node in tree.body
        )
        if not has_all and tree.body:
            missing.append(str(path.relative_to(PACKAGE)))
    assert not missing, f"modules without __all__: {missing}"


def test_product_does_not_lean_on_test_code():
    """The package, the tools (the README's demo among them) and the Docker image work
    without tests/: the S3 servers they share live in ``shardstream.testing``."""
    root = PACKAGE.parent
    bad = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(root / "tools").glob("*.py")]):
        for name in imported_modules(path):
            if name == "tests" or name.startswith("tests."):
                bad.append(f"{path.relative_to(root)} imports {name}")
    dockerfile = (root / "docker" / "Dockerfile").read_text()
    if any(line.split()[:1] == ["COPY"] and "tests" in line for line in dockerfile.splitlines()):
        bad.append("docker/Dockerfile copies tests/")
    assert not bad, "\n".join(bad)


# The shard cutter (NOTE [ Shard boundaries ]) is pure: sizes and counts in, cuts out.
# What it may import; anything else (os, io, storage, fsspec, a format) would let I/O in.
CUTTER_MAY_IMPORT = {"__future__", "collections.abc", "typing", "dataclasses", "shardstream.errors"}


def test_shard_cutter_is_pure():
    names = imported_modules(PACKAGE / "pack" / "cutter.py")
    assert names <= CUTTER_MAY_IMPORT, f"pack/cutter.py imports {sorted(names - CUTTER_MAY_IMPORT)}"


def names_imported_from(path: pathlib.Path, module: str) -> set[str]:
    return {
        alias.name
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.ImportFrom) and node.module == module
        for alias in node.names
    }


def test_writer_and_pack_cut_with_the_one_cutter():
    """ShardWriter and the pack's ShardPlan both cut with ``ShardCutter``; the pool cuts nothing
    itself and sizes nothing itself (``parallel`` is processes and results; ``jobs`` is the work)."""
    for module in ("writer.py", "jobs.py"):
        names = names_imported_from(PACKAGE / "pack" / module, "shardstream.pack.cutter")
        assert "ShardCutter" in names, f"pack/{module} does not cut with ShardCutter"
    pool = imported_modules(PACKAGE / "pack" / "parallel.py")
    work = {"shardstream.pack.cutter", "shardstream.pack.sizing", "shardstream.pack.writer"}
    assert not pool & work, f"pack/parallel.py imports {sorted(pool & work)}: jobs.py holds the work"


@pytest.mark.parametrize("path", sorted((PACKAGE / "pack").rglob("*.py")), ids=lambda p: p.name)
def test_pack_modules_stay_small(path):
    """parallel.py was 686 lines doing five jobs; no pack module grows past ~400 again."""
    lines = len(path.read_text().splitlines())
    assert lines <= 400, f"{path.relative_to(PACKAGE)} has {lines} lines"
