"""``sessionfold migrate``, ``export`` and ``inspect`` against a real store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sessionfold.cli.main import main
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SCHEMA_REVISION, SessionStore
from store_helpers import plan, turn, user


def _folded_session(url: str) -> None:
    store = SessionStore.from_url(url)
    try:
        store.create_session("agent-7", FoldPolicy(budget_tokens=2000, keep_recent_turns=2),
                             system="You watch the build.")
        store.append("agent-7", [user("keep the build green"),
                                 *[m for i in range(20) for m in turn(str(i))]])
        claim = store.claim("agent-7", "job-1")
        store.commit_fold("agent-7", plan(store, "agent-7"), epoch=claim.epoch,
                          incarnation=claim.incarnation, job_id="job-1")
    finally:
        store.close()


def test_migrate_creates_the_schema_from_database_url(
        fresh_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_url)
    assert main(["inspect", "x"]) == 1
    assert "run `sessionfold migrate`" in capsys.readouterr().err
    assert main(["migrate"]) == 0
    assert f"schema revision {SCHEMA_REVISION}" in capsys.readouterr().out
    assert main(["migrate"]) == 0  # again: nothing to do, still fine
    store = SessionStore.from_url(fresh_url)
    assert store.check_schema() == SCHEMA_REVISION
    store.close()


def test_export_prints_the_session_as_one_json_object(
        store_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _folded_session(store_url)
    monkeypatch.setenv("DATABASE_URL", store_url)
    assert main(["export", "agent-7"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["session", "system", "policy", "revision", "ledger", "window",
                          "spans", "records"]
    assert data["session"] == "agent-7" and data["system"] == "You watch the build."
    assert data["policy"]["budget_tokens"] == 2000
    assert [e["seq"] for e in data["ledger"]] == list(range(41))
    assert all(set(e) == {"seq", "origin", "message"} and e["origin"] == "agent"
               for e in data["ledger"])
    assert data["ledger"][0]["message"] == user("keep the build green")
    assert all(set(w) == {"start_seq", "end_seq", "kind", "message"} for w in data["window"])
    kinds = [w["kind"] for w in data["window"]]
    assert "summary" in kinds
    [span] = data["spans"]
    assert span["job_id"] == "job-1" and span["start_seq"] == 1
    assert [r["outcome"] for r in data["records"]] == ["folded"]


def test_inspect_shows_the_window_with_fold_seams_and_their_ledger_ranges(
        store_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _folded_session(store_url)
    store = SessionStore.from_url(store_url)
    [span] = store.spans("agent-7")
    store.close()
    assert main(["inspect", "agent-7", "--database-url", store_url]) == 0
    out = capsys.readouterr().out
    where = f"#{span.start_seq}–#{span.end_seq}"
    assert f"fold seam: ledger {where} ({span.message_count} messages)" in out
    assert "by job job-1" in out and f"end of fold {where}" in out
    assert "#0 " in out and "keep the build green" in out
    assert "You watch the build." in out


def test_an_unknown_session_exits_2_with_its_name(
        store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "nobody", "--database-url", store_url]) == 2
    assert "no session 'nobody'" in capsys.readouterr().err
    assert main(["inspect", "nobody", "--database-url", store_url]) == 2


def test_a_bad_database_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", "--database-url", "mysql://x@y/z"]) == 2
    assert "unsupported database" in capsys.readouterr().err


def test_without_database_url_the_data_dirs_sqlite_file_is_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("SESSIONFOLD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert main(["migrate"]) == 0
    assert str(tmp_path / "data" / "sessionfold.db") in capsys.readouterr().out
    assert (tmp_path / "data" / "sessionfold.db").is_file()
