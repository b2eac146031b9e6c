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


# A format's rules live in its ``ShardFormat`` (``shardstream.formats.base``): code outside
# ``shardstream/formats`` asks the format object or the registry, never tests its name.
FORMAT_NAMES = {"tar", "parquet"}
# A pack source that reads tar files shares the tar codec's member reader and naming rule:
# reading a tar is its job, whatever format the pack writes.
FORMAT_INTERNALS_ALLOWED = {
    "pack/sources/tar.py": {"shardstream.formats.tar.header", "shardstream.formats.tar.members"},
}


def outside_formats() -> list[pathlib.Path]:
    root = PACKAGE.parent
    files = [p for p in PACKAGE.rglob("*.py") if (PACKAGE / "formats") not in p.parents]
    return sorted([*files, *(root / "tools").glob("*.py")])


def names_a_format(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in FORMAT_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(names_a_format(item) for item in node.elts)
    return False


def test_no_format_name_tests_outside_formats():
    """``fmt.name == "tar"`` (or ``format in ("tar", ...)``) outside the formats means a
    rule a third format cannot follow; the rule belongs in the ``ShardFormat`` contract.
    Defaults (``format="tar"``) and docs are no comparison, so they stay allowed."""
    bad = []
    for path in outside_formats():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Compare) and any(map(names_a_format, [node.left, *node.comparators])):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} compares with a format name")
    assert not bad, "\n".join(bad)


def test_format_internals_stay_inside_formats():
    """Outside ``shardstream/formats`` the tar and Parquet codecs are used through their
    packages' public names (``shardstream.formats.tar``, ``...parquet``) and the shared
    modules (``base``, ``checks``, ``keys``), never a codec's inner modules or a private one."""
    inner = ("shardstream.formats.tar.", "shardstream.formats.parquet.", "shardstream.formats._")
    bad = []
    for path in outside_formats():
        where = path.relative_to(PACKAGE).as_posix() if PACKAGE in path.parents else ""
        allowed = FORMAT_INTERNALS_ALLOWED.get(where, set())
        for name in imported_modules(path):
            if name.startswith(inner) and name not in allowed:
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not bad, "\n".join(bad)


def test_format_rules_scan_finds_what_it_forbids(tmp_path):
    """The two scans above see the seams they guard (a rule that sees nothing holds always)."""
    tree = ast.parse('if fmt.name == "tar" or kind in ("parquet", "x"):\n    pass\n')
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert len(compares) == 2
    assert all(names_a_format(c.comparators[0]) for c in compares)
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from shardstream.formats.tar.scan import scan_tar\nimport shardstream.formats._sidecar\n"
    )
    assert {"shardstream.formats.tar.scan", "shardstream.formats._sidecar"} <= imported_modules(probe)
