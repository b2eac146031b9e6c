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


# NOTE [ One backend per Storage ] (storage/backend.py): the kind of storage is storage's
# business alone. Other code asks a Storage for a capability, never whether a URL is
# local, and never opens files through fsspec itself (that would skip the retries).
STORAGE_INTERNALS = ("shardstream.storage.local", "shardstream.storage.backend", "shardstream.storage.s3read")
URL_KIND_HELPERS = {"is_local_url", "local_path", "split_protocol"}
FSSPEC_OPENERS = {"url_to_fs", "filesystem", "open", "open_files", "get_filesystem_class"}


def storage_seam_breaches(path: pathlib.Path) -> list[str]:
    """What ``path`` does that only shardstream/storage may: see the comment above."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            modules = []
        for name in modules:
            if any(name == inner or name.startswith(inner + ".") for inner in STORAGE_INTERNALS):
                bad.append(f"imports {name}")
        if isinstance(node, ast.Name) and node.id in URL_KIND_HELPERS:
            bad.append(f"uses {node.id}")
        if isinstance(node, ast.alias) and node.name in URL_KIND_HELPERS:
            bad.append(f"imports {node.name}")
        if isinstance(node, ast.Attribute) and node.attr in URL_KIND_HELPERS:
            bad.append(f"uses .{node.attr}")
        if (
            isinstance(node, ast.Attribute)
            and node.attr in FSSPEC_OPENERS
            and "fsspec" in ast.unparse(node.value).split(".")
        ):
            bad.append(f"calls {ast.unparse(node)}")
    return bad


def test_only_storage_knows_what_kind_of_storage_a_url_is():
    root = PACKAGE.parent
    files = [*PACKAGE.rglob("*.py"), *(root / "tools").glob("*.py")]
    bad = [
        f"{path.relative_to(root)} {breach}"
        for path in sorted(files)
        if (PACKAGE / "storage") not in path.parents
        for breach in storage_seam_breaches(path)
    ]
    assert not bad, "only shardstream/storage may:\n" + "\n".join(bad)


def test_the_storage_seam_check_catches_a_breach(tmp_path):
    code = (
        "from shardstream.storage import local\n"
        "from shardstream.storage.local import is_local_url\n"
        "import fsspec\n"
        "fs, root = fsspec.core.url_to_fs('s3://b/x')\n"
    )
    (tmp_path / "m.py").write_text(code)
    assert set(storage_seam_breaches(tmp_path / "m.py")) == {
        "imports shardstream.storage.local",
        "imports shardstream.storage.local.is_local_url",
        "imports is_local_url",
        "calls fsspec.core.url_to_fs",
    }
