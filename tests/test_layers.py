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
        "shardstream.tokens",
        "shardstream.storage",
        "shardstream.plan",
        "shardstream.dataset",
        "shardstream.pack",
        "fsspec",
        "torch",
    },
    "storage": {
        "shardstream.tokens",
        "shardstream.formats",
        "shardstream.plan",
        "shardstream.dataset",
        "shardstream.pack",
        "torch",
    },
    "plan": {
        "shardstream.tokens",
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
    # packed token sequences: pure like the plan, and below formats, storage and the dataset
    "tokens": {
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
    """ShardWriter and the pack's ShardJobs both cut with ``ShardCutter``; the pool cuts nothing
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


# -- one name per concept (issue 8's naming pass; README "Words") ---------------------


def class_names() -> dict[str, list[str]]:
    """Every class the package defines, by name: the modules that define one of that name."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(path.relative_to(PACKAGE).as_posix())
    return found


def test_a_public_class_name_means_one_thing():
    """Two public classes of one name (once: two ``Progress``) leave a reader asking which."""
    twice = {
        name: where for name, where in class_names().items() if len(where) > 1 and not name.startswith("_")
    }
    assert not twice, f"one class name, several classes: {twice}"


# A word and the classes that may carry it in their names: only its one meaning's.
WORD_OWNERS = {
    "Source": lambda where, name: where.startswith("pack/sources/"),  # where pack samples come from
    "Plan": lambda where, name: where.startswith("plan/") or name == "PlanError",  # the epoch plan
    "Progress": lambda where, name: name in {"ProgressBar", "PackProgress"},  # the bar, the pack's protocol
}


@pytest.mark.parametrize("word", sorted(WORD_OWNERS))
def test_a_word_names_one_concept(word):
    """A pass of the plan reads a ``PassInput``, the pack's planner is ``ShardJobs``, the
    dataset counts an ``_Iteration``: none is called what another concept is."""
    owns = WORD_OWNERS[word]
    bad = [
        f"{where}: class {name}"
        for name, places in sorted(class_names().items())
        if word in name
        for where in places
        if not owns(where, name)
    ]
    assert not bad, f"{word!r} in a class name outside its one meaning:\n" + "\n".join(bad)


# -- module state -----------------------------------------------------------------------

_MUTATORS = {
    *("append", "appendleft", "extend", "insert", "add", "update", "setdefault"),
    *("pop", "popitem", "clear", "remove", "discard", "move_to_end"),
}
_STATEFUL = {
    *("Lock", "RLock", "Condition", "Event", "Semaphore", "BoundedSemaphore", "local", "ContextVar"),
    *("count", "Counter", "deque", "OrderedDict", "defaultdict", "WeakKeyDictionary", "WeakValueDictionary"),
}

# State a module (or a class, for all its objects) keeps across calls, and why it is not
# an object's. A new entry needs a reason; state that belongs to an object goes into it.
PROCESS_STATE = {
    "formats/__init__.py:_registry": "the format registry (register_format), process-wide by design",
    "plan/kinds.py:_registry": "the plan kind registry (register_plan_kind), process-wide by design",
    "pack/sources/__init__.py:_SOURCES": "the source registry (register_source)",
    "dataset/decode.py:_REGISTRY": "the decoder registry (register_decoder)",
    "formats/tar/header.py:_SIZE_RECIPES": "a bounded memo of a pure function: right in any process",
    "formats/tar/write.py:_TAILS": "a bounded memo of a pure function (checksum -> header bytes)",
    "pack/sources/folder.py:_primed": "what this process's allocator has seen (malloc is per process)",
    "pack/parallel.py:_WORKER": "a pool worker process's own context, set by its initializer",
    "storage/backend.py:_ABANDONED": "file systems of a parent process, kept (never used) in a child",
    "storage/s3read.py:_ABANDONED": "clients of a parent process, kept (never used) in a child",
    "storage/s3read.py:_LOADERS": "botocore's model loaders by data path, shared by every client",
    "storage/s3read.py:_lock": "guards _LOADERS; made anew in a fork child",
    "dataset/reader.py:_SKIPPED": "a log's once-per-shard filter (as warnings' registry): per process",
    "dataset/random_access.py:_OPENING": "guards making a MapDataset's per-process readers; made anew in a fork child",
    "dataset/budget.py:_OPEN": "this process's open read budgets, closed by its exit hook (weak references)",
    "storage/deadline.py:_local": "the deadline of the read this thread is trying (thread-local, never shared)",
    "storage/deadline.py:_watchdog": "the one thread that cuts bodies at their deadlines; made anew in a fork child",
    "storage/parts.py:_ARRIVALS": "whom the reads started in a context tell of their bytes (a context variable: per thread and context, never shared)",
    "dataset/streaming.py:_FROZEN_IN": "the worker process whose collector froze what it inherited (gc is per process)",
}


def _assigned(body: list[ast.stmt]) -> dict[str, ast.expr | None]:
    names: dict[str, ast.expr | None] = {}
    for node in body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        names.update({t.id: node.value for t in targets if isinstance(t, ast.Name)})
    return names


def _made_stateful(value: ast.expr | None) -> bool:
    func = value.func if isinstance(value, ast.Call) else None
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in _STATEFUL


def _changed(scope: ast.AST, owner: str | None) -> set[str]:
    """Names of the module (``owner=None``) or of ``cls`` that code in ``scope`` rebinds or mutates."""

    def name_of(node: ast.expr) -> str | None:
        if owner is None:
            return node.id if isinstance(node, ast.Name) else None
        is_owner = (
            isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == owner
        )
        return node.attr if is_owner else None

    found: set[str] = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Global) and owner is None:
            found.update(node.names)
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else []
        targets = [node.target] if isinstance(node, ast.AugAssign) else targets
        for target in targets:
            name = name_of(target.value) if isinstance(target, ast.Subscript) else None
            found.add(name or (name_of(target) if owner is not None else None) or "")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
        ):
            found.add(name_of(node.func.value) or "")
    return found - {""}


def process_state(source: str, module: str) -> set[str]:
    """``module:name`` (``module:Class.name``) of the state ``source`` keeps across calls."""
    tree = ast.parse(source)
    state = {
        f"{module}:{n}"
        for n, v in _assigned(tree.body).items()
        if n in _changed(tree, None) or _made_stateful(v)
    }
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        changed = _changed(cls, "cls")
        state |= {
            f"{module}:{cls.name}.{n}"
            for n, v in _assigned(cls.body).items()
            if n in changed or _made_stateful(v)
        }
    return state


def test_module_state_is_process_wide_or_named():
    """No new module-level (or class-level) mutable state: what belongs to an object is
    kept in it, so two datasets, Storages or packs in one process never share it."""
    found = set().union(
        *(process_state(p.read_text(), p.relative_to(PACKAGE).as_posix()) for p in PACKAGE.rglob("*.py"))
    )
    new = sorted(found - set(PROCESS_STATE))
    assert not new, (
        "module state without a reason in PROCESS_STATE (or move it into its object):\n" + "\n".join(new)
    )


@pytest.mark.parametrize(
    "source",
    [
        "_seen = {}\ndef f(k):\n    _seen[k] = 1",
        "_n = 0\ndef f():\n    global _n\n    _n += 1",
        "import threading\n_lock = threading.Lock()",
        "_runs = []\ndef f():\n    _runs.append(1)",
        "class C:\n    _all = {}\n    @classmethod\n    def f(cls):\n        cls._all[1] = 2",
    ],
)
def test_module_state_check_finds_what_it_forbids(source):
    """The check above can fail: each kind of kept state is found..."""
    assert process_state(source, "m.py")


def test_module_state_check_leaves_constants_alone():
    """...and tables that are only read are not state."""
    assert not process_state(
        "_TABLE = {1: 2}\n_ITEMS = [1]\ndef f(k):\n    return _TABLE[k] + _ITEMS[0]", "m.py"
    )


def test_names_before_the_naming_pass_still_import():
    """The old names stay importable where they were public (aliases, not second classes)."""
    from shardstream.pack import jobs, parallel
    from shardstream.pack.api import PackProgress
    from shardstream.progress import Progress, ProgressBar

    assert Progress is ProgressBar
    assert jobs.Progress is jobs.PackProgress is PackProgress
    assert jobs.ShardPlan is jobs.ShardJobs is parallel.ShardPlan
