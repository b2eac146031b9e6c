"""The import rule of DESIGN.md: formats, storage and plan never import each other; the
plan does no I/O and never imports torch; only the dataset, sampler and loader need torch.
The dataset folder (names, manifest building), the lease and the version sit below pack
and catalog, and catalog never imports pack; no module imports the package root. Every
package keeps its shape: no import cycle, no module over 400 lines of code, no reach-in to
another module's private names, ``__all__`` on the public faces alone; and one name means
one thing."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import subprocess
import sys
import tokenize

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
    # index, inspect and verify read what a pack wrote through folder and lock, not pack
    "catalog": {
        "shardstream.pack",
        "shardstream.dataset",
        "shardstream.cli",
        "torch",
    },
}

_ABOVE_FOLDER = {"shardstream.pack", "shardstream.catalog", "shardstream.dataset", "shardstream.cli", "torch"}
# Single modules below pack and catalog, both of which import them.
FORBIDDEN_MODULES = {
    # the folder module is naming rules and the manifest's making: no I/O, nothing above it
    "folder.py": _ABOVE_FOLDER | {"shardstream.lock", "shardstream.digests", "shardstream.storage", "fsspec"},
    "lock.py": _ABOVE_FOLDER,
    "digests.py": _ABOVE_FOLDER,
    "manifest.py": _ABOVE_FOLDER | {"shardstream.folder", "shardstream.lock"},
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
        ("from shardstream.folder import writer_name", ["shardstream", "pack"]),
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


# -- the shape of every package: no cycle, no big module, no reach-in, a small face -------------
#
# Each guard below scans the whole package. The violations that dataset/ and storage/ (and
# the sampler beside them) hold while their refactor is under way are listed, each with
# its reason; a guard fails on a violation not listed and on a listed one that no longer
# occurs, so a list only shrinks. Outside dataset/ and storage/ none is listed.

MAX_CODE_LINES = 400


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _where(path: pathlib.Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _import_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in ``module`` names."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def package_imports(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source`` imports, at any depth (a function body and
    ``if TYPE_CHECKING`` too): ``from m import name`` imports submodule ``m.name`` if there
    is one, else ``m``. A module's parent packages, imported implicitly, are no edge: a
    package's ``__init__`` imports its modules to make its face."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(module, is_package, node)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    return (found & known) - {module}


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(tuple(sorted(component)))
    return sorted(cycles)


def package_graph() -> dict[str, set[str]]:
    known = set(MODULES)
    return {
        name: package_imports(path.read_text(), name, path.name == "__init__.py", known)
        for name, path in MODULES.items()
    }


# Import cycles of dataset/ and storage/, by their modules (short names, from the package).
CYCLES_ALLOWED: dict[tuple[str, ...], str] = {}


def test_no_import_cycle():
    """No two modules import each other, directly or round a loop, even in a function body:
    a cycle says two modules are one concept, or that a third is missing."""
    short = len("shardstream.")
    found = {tuple(name[short:] for name in cycle) for cycle in import_cycles(package_graph())}
    new = sorted(found - set(CYCLES_ALLOWED))
    gone = sorted(set(CYCLES_ALLOWED) - found)
    assert not new, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in new)
    assert not gone, "no longer cycles, delete from CYCLES_ALLOWED:\n" + "\n".join(map(str, gone))


def test_cycle_finder_finds_cycles():
    """The guard above can fail: a hidden (function-body) import back is an edge, a loop of
    three is one component, and a chain is none."""
    known = {"p", "p.a", "p.b"}
    assert package_imports("def f():\n    from p import b\n", "p.a", False, known) == {"p.b"}
    assert package_imports("from . import a\nfrom .a import x\n", "p.b", False, known) == {"p.a"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [("a", "b", "c")]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    }
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


# Modules of dataset/ and storage/ over MAX_CODE_LINES lines of code.
BIG_ALLOWED: dict[str, str] = {}


def test_no_module_over_400_lines_of_code():
    """A module a reader can hold in mind: at most 400 lines of code (docstrings, comments
    and blank lines aside), as STYLE asks."""
    found = {
        _where(path): n for path in MODULES.values() if (n := code_lines(path.read_text())) > MAX_CODE_LINES
    }
    new = sorted(f"{where}: {n} lines of code" for where, n in found.items() if where not in BIG_ALLOWED)
    gone = sorted(set(BIG_ALLOWED) - set(found))
    assert not new, f"modules over {MAX_CODE_LINES} lines of code:\n" + "\n".join(new)
    assert not gone, "no longer too big, delete from BIG_ALLOWED:\n" + "\n".join(gone)


def test_code_lines_leave_prose_out():
    source = '"""Doc\nstring."""\n\n# a comment\nx = 1  # why\n\n\ndef f():\n    """Doc."""\n    return """not\na docstring"""\n'
    assert code_lines(source) == 4  # x = 1, def f, and the two lines of the returned string


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# ``obj._name`` that is public API all the same: namedtuple's methods, and os._exit (the
# documented way for a child process to leave without its parent's exit handlers).
PUBLIC_UNDERSCORED = {"_replace", "_make", "_asdict"}
PUBLIC_UNDERSCORED_CALLS = {"os._exit"}


def _own_names(tree: ast.Module) -> set[str]:
    """Private names the module itself defines on its objects or classes: what its own
    code may touch on any object it holds (another instance of its class, say)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else []
                targets = [item.target] if isinstance(item, ast.AnnAssign) else targets
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
                if isinstance(item, ast.Assign) and targets and getattr(targets[0], "id", "") == "__slots__":
                    names |= {e.value for e in ast.walk(item.value) if isinstance(e, ast.Constant)}
    return {name for name in names if isinstance(name, str) and _private(name)}


def _private_module_outside(dotted: str, module: str) -> bool:
    """Whether ``dotted`` passes through a private module whose package ``module`` is not in."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        owner = ".".join(parts[:i])
        if _private(part) and not (module == owner or module.startswith(owner + ".")):
            return True
    return False


def reach_ins(source: str, module: str, is_package: bool = False) -> set[str]:
    """Where ``source`` (the module ``module``) touches another module's private names:
    ``from m import _name``, a private module from outside its package, ``m._name`` on an
    imported module, and ``obj._name`` read, written or named in ``setattr``/``getattr``
    where ``obj`` is not ``self``/``cls`` and the module defines no ``_name`` itself."""
    tree = ast.parse(source)
    own = _own_names(tree)
    modules: dict[str, str] = {}  # local name -> shardstream module it is bound to
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("shardstream") and _private_module_outside(alias.name, module):
                    found.add(f"import {alias.name}")
                if alias.asname:
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(module, is_package, node)
            if not base.startswith("shardstream"):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in MODULES or full.startswith("shardstream._"):
                    modules[alias.asname or alias.name] = full
                    if _private_module_outside(full, module):
                        found.add(f"from {base} import {alias.name}")
                elif _private(alias.name) or _private_module_outside(base, module):
                    found.add(f"from {base} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in modules:
                if _private_module_outside(f"{modules[owner.id]}.{node.attr}", module):
                    found.add(ast.unparse(node))
                continue
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if (
                node.attr in own
                or node.attr in PUBLIC_UNDERSCORED
                or ast.unparse(node) in PUBLIC_UNDERSCORED_CALLS
            ):
                continue
            found.add(ast.unparse(node))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
            "setattr",
            "getattr",
            "object.__setattr__",
        ):
            target, name = [*node.args, None, None][:2]
            named = getattr(name, "value", None) if isinstance(name, ast.Constant) else None
            mine = isinstance(target, ast.Name) and target.id in ("self", "cls")
            if isinstance(named, str) and _private(named) and not mine and named not in own:
                found.add(f"{ast.unparse(node.func)}({ast.unparse(target)}, {named!r})")
    return found


# Reach-ins of dataset/, storage/ and the sampler: "module: what it touches".
REACH_INS_ALLOWED: dict[str, str] = {
    "dataset/loader.py: iterator._num_yielded": "torch's DataLoader iterator has no public resume; the dataset refactor",
    "dataset/loader.py: iterator._shutdown_workers": "torch's DataLoader iterator has no public shutdown; the dataset refactor",
    "storage/backend.py: fs._s3": "s3fs's client, for ranged GETs; the storage refactor",
    "storage/backend.py: getattr(fs, '_s3')": "s3fs's client, for ranged GETs; the storage refactor",
    "storage/backend.py: getattr(fs, '_s3creator')": "s3fs's client factory; the storage refactor",
    "storage/backend.py: fs_class._strip_protocol": "fsspec's path normaliser (underscored there); the storage refactor",
    "storage/cached.py: hashlib._Hash": "CPython private type name; the storage refactor",
    "storage/s3read.py: getattr(body, '_raw_stream')": "botocore's body stream, to cut a read at its deadline; the storage refactor",
    "storage/s3read.py: getattr(response['Body'], '_raw_stream')": "botocore's body stream; the storage refactor",
}


# The one owner of process lifecycle may use CPython's private API where no public one
# exists (its own tests fail on a Python where that API vanished); nothing else may.
LIFECYCLE_MODULE = "lifecycle.py"
CPYTHON_MODULES = ("threading", "weakref", "gc", "sys", "os", "multiprocessing")


def _cpython_private(hit: str) -> bool:
    return hit.removeprefix("getattr(").startswith(CPYTHON_MODULES)


def test_no_reach_in_to_private_names():
    """A private name (leading underscore) is its module's own: another module that imports,
    reads or writes one is tied to an inside that may change without notice."""
    found = {
        f"{_where(path)}: {hit}"
        for name, path in MODULES.items()
        for hit in reach_ins(path.read_text(), name, path.name == "__init__.py")
        if not (_where(path) == LIFECYCLE_MODULE and _cpython_private(hit))
    }
    new = sorted(found - set(REACH_INS_ALLOWED))
    gone = sorted(set(REACH_INS_ALLOWED) - found)
    assert not new, "reach-ins to private names:\n" + "\n".join(new)
    assert not gone, "no longer occur, delete from REACH_INS_ALLOWED:\n" + "\n".join(gone)


def test_reach_in_scan_finds_what_it_forbids():
    """The guard above can fail: each kind of reach-in is found, and a module's own
    privates, namedtuple's methods and a package's own private module are not."""
    source = (
        "from shardstream.catalog.index import _hidden\n"
        "import shardstream.formats._sidecar\n"
        "from shardstream.plan import global_order as g\n"
        "def f(storage, other):\n"
        "    storage._cache = None\n"
        "    object.__setattr__(other, '_x', 1)\n"
        "    return g._CACHED, other._fields\n"
        "class C:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def same(self, other):\n"
        "        return other._mine, other._replace(a=1)\n"
    )
    assert reach_ins(source, "shardstream.pack.x") == {
        "from shardstream.catalog.index import _hidden",
        "import shardstream.formats._sidecar",
        "storage._cache",
        "object.__setattr__(other, '_x')",
        "g._CACHED",
        "other._fields",
    }
    inside = "from shardstream.formats import _sidecar\nfrom shardstream.formats._sidecar import read_array\n"
    assert not reach_ins(inside, "shardstream.formats.tar.index")


# The documented faces: the package root, the subpackages users import, and the modules
# docs/reference and the guide name. Only these declare ``__all__``; every other module
# is internal and free to change (zarr's and fsspec's way), whatever its file name.
FACES = {
    *("__init__.py", "errors.py", "manifest.py", "topology.py", "sampler.py", "spark.py", "ray.py"),
    *("catalog/__init__.py", "dataset/__init__.py", "pack/__init__.py", "pack/sources/__init__.py"),
    *("plan/__init__.py", "storage/__init__.py", "testing/__init__.py", "tokens/__init__.py"),
    *("formats/__init__.py", "formats/parquet/__init__.py", "formats/tar/__init__.py"),
    "formats/tokens/__init__.py",
}
# Internal modules that still declare ``__all__`` (the rule before this one asked every
# module to), in the folders and files other changes hold.
ALL_NOT_YET = {
    "dataset/": "internal modules of the dataset, under its refactor: drop __all__ as it settles",
    "storage/": "internal modules of storage, under its refactor: drop __all__ as it settles",
    "crc.py": "internal; not in the files of this change",
    "diagnose.py": "internal; not in the files of this change",
    "digests.py": "internal; not in the files of this change",
}


def declares_all(source: str) -> bool:
    return any(
        isinstance(node, ast.Assign | ast.AnnAssign)
        and any(
            getattr(t, "id", None) == "__all__" for t in (getattr(node, "targets", None) or [node.target])
        )
        for node in ast.parse(source).body
    )


def test_only_the_faces_declare_all():
    """``__all__`` marks a face; an internal module (or a private one) has none, so what is
    API is what the faces list, and the reference documents."""
    declaring = {_where(p) for p in MODULES.values() if declares_all(p.read_text())}
    pending = {
        w for w in declaring if any(w == k or (k.endswith("/") and w.startswith(k)) for k in ALL_NOT_YET)
    }
    internal = sorted(w for w in declaring - FACES - pending if not pathlib.PurePath(w).name.startswith("_"))
    assert not internal, "internal modules declaring __all__ (drop it; faces re-export):\n" + "\n".join(
        internal
    )
    faceless = sorted(w for w in FACES if w not in declaring)
    assert not faceless, f"faces without __all__: {faceless}"
    gone = sorted(k for k in ALL_NOT_YET if not any(w == k or w.startswith(k) for w in pending))
    assert not gone, f"no longer declare __all__, delete from ALL_NOT_YET: {gone}"


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


PICKLE_METHODS = {"__getstate__", "__setstate__", "__reduce__", "__reduce_ex__"}


def spelled_state_keys(path: pathlib.Path) -> list[str]:
    """String literals equal to a state key used as one: a subscript, ``.get``/``.pop``'s
    key (but a ``kwargs.get``, torch's own arguments) or a dict literal's key. What an
    object pickles (``__getstate__``/``__setstate__``) is its own, not a resume state."""
    from shardstream.plan.state import Key

    keys = {value for name, value in vars(Key).items() if name.isupper()}
    tree = ast.parse(path.read_text(), filename=str(path))
    pickling = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name in PICKLE_METHODS
        for inner in ast.walk(node)
    }
    found = []
    for node in (n for n in ast.walk(tree) if id(n) not in pickling):
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


def function_signatures() -> dict[str, set[tuple[str, ...]]]:
    """Every public module-level function, by name: the parameter lists it has, where defined."""
    found: dict[str, set[tuple[str, ...]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                args = node.args
                names = tuple(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
                found.setdefault(node.name, set()).add(names)
    return found


def test_a_function_name_takes_one_argument_list():
    """Two functions of one name taking other arguments (once: ``check_count(name, value)``
    beside ``check_count(value, name)``) are two meanings under one name: a caller who
    knows one calls the other wrongly."""
    drift = {name: sorted(lists) for name, lists in function_signatures().items() if len(lists) > 1}
    assert not drift, f"one function name, several argument lists: {drift}"


def test_renamed_names_still_import():
    """The plan state's version keeps its earlier public name."""
    from shardstream.plan import PLAN_STATE_VERSION, STATE_VERSION

    assert STATE_VERSION == PLAN_STATE_VERSION


# A word and the classes that may carry it in their names: only its one meaning's.
WORD_OWNERS = {
    # where pack samples come from; and DESIGN's per-process source of a dataset (storage,
    # manifest, sidecars, reader), named so by the dataset refactor: two meanings, one to rename
    "Source": lambda where, name: where.startswith("pack/sources/") or name == "DatasetSource",
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
    "storage/s3read.py:_STREAMING": "this process's open stream bodies, counted (emptied in a fork child)",
    "storage/s3read.py:_ANSWERS": "this process's small GETs' times to headers per endpoint: the link's, which a fork child shares",
    "storage/s3read.py:_lock": "guards _LOADERS; made anew in a fork child",
    "dataset/window_decode.py:_SKIPPED": "a log's once-per-shard filter (as warnings' registry): per process",
    "dataset/budget.py:_OPEN": "this process's open read budgets, closed by its exit hook (weak references)",
    "storage/deadline.py:_local": "the deadline of the read this thread is trying (thread-local, never shared)",
    "storage/deadline.py:_watchdog": "the one thread that cuts bodies at their deadlines; made anew in a fork child",
    "lifecycle.py:_AFTER_FORK": "the hooks a fork child runs, registered once with os.register_at_fork: per process",
    "lifecycle.py:_FROZEN_IN": "the process whose collector froze what it inherited (gc is per process)",
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
    gone = [
        key
        for key in PROCESS_STATE
        if not re.search(rf"\b{key.split(':')[1]}\b", (PACKAGE / key.split(":")[0]).read_text())
    ]
    assert not gone, "PROCESS_STATE names what is no longer there:\n" + "\n".join(gone)


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
