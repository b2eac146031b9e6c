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


# -- refactor 5: one topology detector, one place that spells the state's keys ----------------

TOPOLOGY_MODULE = PACKAGE / "topology.py"
STATE_MODULE = PACKAGE / "plan" / "state.py"
# The modules that make, read and pass states around (the sampler, the dataset, the loader
# and the plan): they name a state's keys through ``plan.state.Key``.
STATE_USERS = sorted(
    [PACKAGE / "sampler.py", *(PACKAGE / "dataset").rglob("*.py"), *(PACKAGE / "plan").rglob("*.py")]
)


def topology_leaks(path: pathlib.Path) -> list[str]:
    """Where a module asks for the topology itself: ``get_worker_info`` named (imported,
    called or looked up) or the ``RANK``/``WORLD_SIZE`` environment variables spelled."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None)
        if isinstance(node, (ast.Name, ast.Attribute, ast.alias)) and name == "get_worker_info":
            found.append(f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)} get_worker_info")
        if isinstance(node, ast.Constant) and node.value in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} reads {node.value}")
    return found


def test_only_topology_detects_the_topology():
    bad = [
        leak
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != TOPOLOGY_MODULE
        for leak in topology_leaks(path)
    ]
    assert not bad, "topology is detected outside shardstream/topology.py:\n" + "\n".join(bad)
    assert topology_leaks(TOPOLOGY_MODULE), "the check no longer sees what topology.py does"


def spelled_state_keys(path: pathlib.Path) -> list[str]:
    """String literals equal to a state key used as one: a subscript, ``.get``/``.pop``'s
    key (but a ``kwargs.get``, torch's own arguments) or a dict literal's key."""
    from shardstream.plan.state import Key

    keys = {value for name, value in vars(Key).items() if name.isupper()}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Subscript):
            used = [node.slice]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            receiver = getattr(node.func.value, "id", None)
            used = [node.args[0]] if node.func.attr in ("get", "pop") and receiver != "kwargs" else []
        elif isinstance(node, ast.Dict):
            used = [key for key in node.keys if key is not None]
        else:
            used = []
        found += [
            f"{path.relative_to(PACKAGE)}:{node.lineno} {u.value!r}"
            for u in used
            if isinstance(u, ast.Constant) and u.value in keys
        ]
    return found


def test_state_keys_are_spelled_only_in_the_state_module():
    bad = [hit for path in STATE_USERS if path != STATE_MODULE for hit in spelled_state_keys(path)]
    assert not bad, "state keys spelled outside plan/state.py (use plan.state.Key):\n" + "\n".join(bad)
    assert STATE_MODULE in STATE_USERS
    assert not spelled_state_keys(STATE_MODULE), "plan/state.py spells its keys through Key too"
