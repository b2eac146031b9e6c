"""The import rule of DESIGN.md: formats, storage and plan never import each other; the
plan does no I/O and never imports torch; only the dataset, sampler and loader need torch.
The dataset layout (names, manifest building), the lease and the version sit below pack
and catalog, and catalog never imports pack; no module imports the package root."""

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
    # index, inspect and verify read what a pack wrote through layout and lock, not pack
    "catalog": {
        "shardstream.pack",
        "shardstream.dataset",
        "shardstream.cli",
        "torch",
    },
}

_ABOVE_LAYOUT = {"shardstream.pack", "shardstream.catalog", "shardstream.dataset", "shardstream.cli", "torch"}
# Single modules below pack and catalog, both of which import them.
FORBIDDEN_MODULES = {
    # the layout is naming rules and the manifest's making: no I/O, nothing above it
    "layout.py": _ABOVE_LAYOUT | {"shardstream.lock", "shardstream.digests", "shardstream.storage", "fsspec"},
    "lock.py": _ABOVE_LAYOUT,
    "digests.py": _ABOVE_LAYOUT,
    "manifest.py": _ABOVE_LAYOUT | {"shardstream.layout", "shardstream.lock"},
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


def _breaks(path: pathlib.Path, forbidden: set[str]) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for name in sorted(imported_modules(path))
        for banned in forbidden
        if name == banned or name.startswith(banned + ".")
    ]


@pytest.mark.parametrize("module", sorted(FORBIDDEN_MODULES))
def test_module_imports(module):
    bad = _breaks(PACKAGE / module, FORBIDDEN_MODULES[module])
    assert not bad, "layer rule broken:\n" + "\n".join(bad)


def _package_of(path: pathlib.Path) -> list[str]:
    """The package a module's relative imports start from, as name parts."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return parts[:-1]  # a module's package, or for ``__init__`` the package itself


def _root_imports(source: str, package: list[str]) -> list[str]:
    """The imports in ``source`` (a module of ``package``) of the package root itself:
    ``from shardstream import x``, ``import shardstream``, or a relative one resolving to it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name == "shardstream"]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            if target == "shardstream":
                found.append(f"from {'.' * node.level}{node.module or ''} import ...")
    return found


def test_no_module_imports_the_package_root():
    """The root re-exports the API (lazily); a module that imported it would run upward
    (the root importing it back) and tie the layers to the public surface: ``__version__``
    is read from ``shardstream._version``."""
    bad = [
        f"{path.relative_to(PACKAGE)}: {line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "__init__.py"
        for line in _root_imports(path.read_text(), _package_of(path))
    ]
    assert not bad, "upward import of the package root:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "package"),
    [
        ("from shardstream import __version__", ["shardstream", "pack"]),
        ("import shardstream", ["shardstream"]),
        ("def f():\n    from shardstream import catalog", ["shardstream"]),
        ("from .. import errors", ["shardstream", "pack"]),
        ("from . import errors", ["shardstream"]),
    ],
)
def test_root_imports_are_found(source, package):
    """The check above can fail: each spelling of an import of the root is caught..."""
    assert _root_imports(source, package)


@pytest.mark.parametrize(
    ("source", "package"),
    [
        ("from shardstream.layout import writer_name", ["shardstream", "pack"]),
        ("import shardstream.errors", ["shardstream"]),
        ("from . import dest", ["shardstream", "pack"]),
    ],
)
def test_imports_below_the_root_pass(source, package):
    """...and an import of a module below it is not."""
    assert not _root_imports(source, package)


def test_version_has_one_source():
    """``_version`` imports nothing (anything may read it), and pyproject takes the version from it."""
    tree = ast.parse((PACKAGE / "_version.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imports)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "shardstream._version.__version__"}


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
