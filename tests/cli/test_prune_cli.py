"""``sessionfold prune [--dry-run] [--batch N]``: the store's retention rules, from the settings,
applied once; a dry run deletes nothing; bad settings and flags exit 2 naming what to fix."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sessionfold.cli.main import main
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import CompactionRecord
from sessionfold.store import SessionStore

SCRIPT = Path(sys.executable).with_name("sessionfold")
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def _visit(detail: str) -> CompactionRecord:
    return CompactionRecord(trigger="threshold", outcome="nothing-to-fold", budget_tokens=2000,
                            target_tokens=1200, measured_tokens=2500, tokens_after=2500,
                            detail=detail)


@pytest.fixture(autouse=True)
def _no_settings_from_outside(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("DATABASE_URL", "SESSIONFOLD_DATABASE_URL", "SESSIONFOLD_PRUNE_BATCH",
                 "SESSIONFOLD_RETAIN_APPEND_KEYS_S", "SESSIONFOLD_RETAIN_VISIT_RECORDS",
                 "SESSIONFOLD_RETAIN_VISIT_RECORDS_S", "SESSIONFOLD_RETAIN_DEAD_LETTERS_S"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SESSIONFOLD_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A SQLite store, written long ago: 5 keyed appends, 6 no-op visits, 2 dead letters (one
    of a session deleted since), and one session from today."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with SessionStore.from_url(url, clock=lambda: LONG_AGO) as old:
        old.migrate()
        old.create_session("agent-7", FoldPolicy(budget_tokens=32_000))
        for i in range(5):
            old.append("agent-7", [{"role": "user", "content": f"turn {i}"}], key=f"k{i}")
        for i in range(6):
            old.record_visit("agent-7", _visit(f"visit {i}"))
        old.dead_letter("job-1", "agent-7", "retries exhausted", 5, {})
        old.dead_letter("job-2", "deleted-since", "retries exhausted", 5, {})
    with SessionStore.from_url(url) as today:
        today.create_session("agent-8", FoldPolicy(budget_tokens=32_000))
        today.append("agent-8", [{"role": "user", "content": "hello"}], key="fresh")
    return url


def _rows(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {t: int(conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar_one())
                    for t in ("append_keys", "compaction_records", "dead_letters")}
    finally:
        engine.dispose()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["prune", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_dry_run_says_what_would_go_and_deletes_nothing(
        store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = _rows(store_url)
    code, out, _ = _run(capsys, "--dry-run", "--database-url", store_url)
    assert code == 0
    assert "would delete 5 append key(s) older than 1 day" in out
    # Six visits, all kept: the newest 100 of a session always are.
    assert "would delete 0 no-op visit record(s) beyond each session's newest 100 and older " \
           "than 1 day" in out
    assert "would delete 2 dead letter(s) older than 30 days or of deleted sessions" in out
    assert _rows(store_url) == before


def test_prune_deletes_by_the_rules_the_environment_sets(
        store_url: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", store_url)
    monkeypatch.setenv("SESSIONFOLD_RETAIN_VISIT_RECORDS", "2")
    monkeypatch.setenv("SESSIONFOLD_RETAIN_VISIT_RECORDS_S", "0")
    code, out, _ = _run(capsys)
    assert code == 0
    assert "deleted 5 append key(s)" in out
    assert "deleted 4 no-op visit record(s) beyond each session's newest 2\n" in out
    assert "deleted 2 dead letter(s)" in out
    # Today's key is younger than a day: a retry of it is still recognised.
    assert _rows(store_url) == {"append_keys": 1, "compaction_records": 2, "dead_letters": 0}
    with SessionStore.from_url(store_url) as store:
        assert store.append("agent-8", [{"role": "user", "content": "hello"}],
                            key="fresh").duplicate
        assert [r.detail for r in store.records("agent-7")] == ["visit 4", "visit 5"]
    code, out, _ = _run(capsys)
    assert code == 0 and "deleted 0 append key(s)" in out and "deleted 0 dead" in out


def test_batch_sets_the_rows_per_transaction(
        store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Five keys in batches of 2: 2+2+1; the two old letters: 2+0 (a full batch is followed by
    # another); no orphan left: 0; one read of the sessions.
    code, out, _ = _run(capsys, "--batch", "2", "--database-url", store_url)
    assert code == 0 and "deleted 5 append key(s)" in out
    assert "sessionfold prune: 7 transaction(s)" in out


def test_the_batch_setting_is_the_default_of_the_flag(
        store_url: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONFOLD_PRUNE_BATCH", "1")
    code, out, _ = _run(capsys, "--database-url", store_url)
    assert code == 0 and "deleted 5 append key(s)" in out
    assert "sessionfold prune: 11 transaction(s)" in out  # keys 5+1, letters 2+1, 1, 1 page


@pytest.mark.parametrize(("variable", "value"), [
    ("SESSIONFOLD_RETAIN_VISIT_RECORDS", "0"),
    ("SESSIONFOLD_RETAIN_APPEND_KEYS_S", "0"),
    ("SESSIONFOLD_RETAIN_DEAD_LETTERS_S", "a month"),
])
def test_a_bad_retention_setting_exits_2_naming_it_and_deletes_nothing(
        store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    before = _rows(store_url)
    code, out, err = _run(capsys, "--database-url", store_url)
    assert code == 2 and out == ""
    assert err.startswith(f"sessionfold prune: invalid settings: {variable}: ")
    assert err.count("\n") == 1  # one line, no traceback
    assert _rows(store_url) == before


@pytest.mark.parametrize("batch", ["0", "10001", "ten"])
def test_a_bad_batch_is_a_usage_error(store_url: str, capsys: pytest.CaptureFixture[str],
                                      batch: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["prune", "--batch", batch, "--database-url", store_url])
    assert exit_.value.code == 2
    assert "argument --batch" in capsys.readouterr().err


def test_an_unmigrated_store_exits_1_saying_to_migrate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "--database-url", f"sqlite:///{tmp_path / 'empty.db'}")
    assert code == 1 and "sessionfold migrate" in err


def test_the_installed_command_runs_it(store_url: str, tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT), "prune", "--dry-run"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "DATABASE_URL": store_url,
                               "SESSIONFOLD_DATA_DIR": str(tmp_path / "data")},
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "would delete 5 append key(s)" in done.stdout
