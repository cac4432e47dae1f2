"""The public paths of the old layout keep working for one release, and say where to go.

``sessionfold.workers.client`` (the README's import until the restructure) and
``python -m sessionfold.workers.cli`` re-export what replaced them and warn
(:class:`DeprecationWarning`); ``celery -A sessionfold.workers.celery_app`` did not move.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _fresh_import(name: str) -> object:
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_the_old_client_path_reexports_the_client_and_warns() -> None:
    import sessionfold.client as client
    from sessionfold.workers.wiring import store_url

    with pytest.warns(DeprecationWarning, match="import from sessionfold.client"):
        old = _fresh_import("sessionfold.workers.client")
    for name in ("connect", "Client", "SessionHandle", "AsyncClient", "AsyncSessionHandle",
                 "WindowView", "place_cache_breakpoints", "OverBudget"):
        assert getattr(old, name) is getattr(client, name), name
    assert old.database_url_for is store_url  # type: ignore[attr-defined]


def test_the_old_cli_module_reexports_main_and_warns() -> None:
    from sessionfold.cli import main as new

    with pytest.warns(DeprecationWarning, match="python -m sessionfold.cli"):
        old = _fresh_import("sessionfold.workers.cli")
    assert old.main is new.main and old.build_parser is new.build_parser  # type: ignore[attr-defined]


def test_python_m_the_old_cli_still_runs_the_command_and_says_it_moved(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONWARNINGS")}
    proc = subprocess.run([sys.executable, "-m", "sessionfold.workers.cli", "--help"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "compact" in proc.stdout and "migrate" in proc.stdout
    assert "DeprecationWarning" in proc.stderr and "sessionfold.cli" in proc.stderr


def test_the_new_cli_runs_as_a_module(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sessionfold.cli", "--help"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "compact" in proc.stdout and "deprecated" not in proc.stderr


def test_the_celery_app_path_did_not_move() -> None:
    module = importlib.import_module("sessionfold.workers.celery_app")
    assert callable(module.make_celery) and callable(module.app_from_env)
