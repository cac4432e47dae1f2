"""One rule for where embedded data lives, followed by every entry point, and said at start.

The rule: ``SESSIONFOLD_DATA_DIR``, else ``./.sessionfold`` in the working folder; the embedded
SQLite store is ``<data dir>/sessionfold.db`` and the embedded Redis lives in ``<data dir>/redis``.
The settings read the variable; the wiring builds every connection from them; the store itself
reads no environment.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from sessionfold.client import connect
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.wiring import open_store, store_url
from sessionfold.store import SessionStore
from sessionfold.store.engine import default_sqlite_url


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("SESSIONFOLD_") or name in ("DATABASE_URL", "REDIS_URL",
                                                       "ANTHROPIC_API_KEY"):
            monkeypatch.delenv(name)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")


def _sqlite_path(url: str) -> Path:
    assert url.startswith("sqlite"), url
    return Path(url.split(":///", 1)[1])


def _every_entry_points_store(monkeypatch: pytest.MonkeyPatch) -> set[Path]:
    """The SQLite file each entry point opens, its settings read from the environment."""
    settings = Settings()
    # What `up`, the worker, the scheduler, `migrate`... and connect() open: the wiring's store.
    with open_store(settings) as store:
        opened = store.engine.url.database
    assert opened is not None
    return {_sqlite_path(store_url(settings)), _sqlite_path(settings.store_url), Path(opened),
            settings.data_dir / "sessionfold.db"}


def test_without_a_data_dir_every_entry_point_uses_dot_sessionfold_here(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    here = (tmp_path / "elsewhere").resolve()
    assert _every_entry_points_store(monkeypatch) == {here / ".sessionfold" / "sessionfold.db"}


def test_sessionfold_data_dir_moves_every_entry_points_store(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SESSIONFOLD_DATA_DIR", str(tmp_path / "common-data"))
    assert _every_entry_points_store(monkeypatch) == {
        (tmp_path / "common-data").resolve() / "sessionfold.db"}


def test_connect_says_where_the_embedded_data_lives_and_that_no_pipeline_runs_there(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(data_dir=tmp_path / "fresh", summarizer="offline")
    caplog.set_level(logging.INFO, logger="sessionfold")
    with connect(settings):
        pass
    infos = [r.getMessage() for r in caplog.records
             if r.levelno == logging.INFO and "embedded data" in r.getMessage()]
    assert len(infos) == 1 and str((tmp_path / "fresh").resolve()) in infos[0], infos
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no pipeline" in w and "SESSIONFOLD_DATA_DIR" in w for w in warnings), warnings


def test_connect_to_real_services_logs_no_embedded_data(
        make_settings: object, caplog: pytest.LogCaptureFixture) -> None:
    settings = make_settings()  # type: ignore[operator]
    caplog.set_level(logging.INFO, logger="sessionfold")
    with connect(settings.model_copy(update={"database_url": None})):
        pass
    lines = [r.getMessage() for r in caplog.records if "embedded data" in r.getMessage()]
    assert len(lines) == 1 and "SQLite" in lines[0] and "Redis" not in lines[0], lines


def test_the_store_itself_reads_no_environment(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    # The settings are the one config source: a URL of None is the store's documented default,
    # ./.sessionfold in the working folder, whatever SESSIONFOLD_DATA_DIR or DATABASE_URL say.
    monkeypatch.setenv("SESSIONFOLD_DATA_DIR", str(tmp_path / "common-data"))
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'other.db'}")
    here = (tmp_path / "elsewhere").resolve() / ".sessionfold" / "sessionfold.db"
    with SessionStore.from_url(None) as store:
        assert store.engine.url.database == str(here)
    assert _sqlite_path(default_sqlite_url()) == here
