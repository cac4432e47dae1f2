"""``sessionfold reindex`` and the hint ``sessionfold migrate`` gives when it has work."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sessionfold.cli.main import main
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from sessionfold.store.schema import ledger_chunks
from store_helpers import turn, user


def _unindexed_session(url: str, sid: str = "agent-7") -> None:
    """A session whose ledger looks written before the index (no chunks, flagged pending)."""
    store = SessionStore.from_url(url)
    try:
        store.create_session(sid, FoldPolicy(budget_tokens=2000))
        store.append(sid, [user("keep the build green"),
                           *[m for i in range(6) for m in turn(str(i))]])
        with store.engine.begin() as conn:
            conn.execute(ledger_chunks.delete())
            conn.execute(sa.text("UPDATE sessions SET search_pending = :t"), {"t": True})
    finally:
        store.close()


def _hits(url: str, sid: str, query: str) -> list[int]:
    store = SessionStore.from_url(url)
    try:
        return [h.seq for h in store.search(sid, query)]
    finally:
        store.close()


def test_migrate_says_when_a_reindex_is_needed_and_reindex_does_it(
        store_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _unindexed_session(store_url)
    monkeypatch.setenv("DATABASE_URL", store_url)
    assert main(["migrate"]) == 0
    out = capsys.readouterr().out
    assert "1 session(s) hold ledger rows written before the search index" in out
    assert "sessionfold reindex" in out
    assert _hits(store_url, "agent-7", "file-3.txt") == []
    assert main(["reindex", "--batch", "3"]) == 0
    assert "13 ledger row(s) of the store indexed" in capsys.readouterr().out
    assert _hits(store_url, "agent-7", "file-3.txt") == [7]
    assert main(["migrate"]) == 0
    assert "reindex" not in capsys.readouterr().out
    assert main(["reindex"]) == 0  # again: nothing left
    assert "0 ledger row(s)" in capsys.readouterr().out


def test_reindex_of_one_session_names_it(store_url: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _unindexed_session(store_url)
    monkeypatch.setenv("DATABASE_URL", store_url)
    assert main(["reindex", "agent-7"]) == 0
    assert "13 ledger row(s) of session 'agent-7' indexed" in capsys.readouterr().out
    assert _hits(store_url, "agent-7", "file-5.txt") == [11]


@pytest.mark.parametrize("argv", [["reindex", "nope"], ["reindex", "--batch", "0"],
                                  ["reindex", "--batch", "x"], ["reindex", "--batch", "10001"]])
def test_reindex_refuses_an_unknown_session_and_a_bad_batch(
        store_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str]) -> None:
    monkeypatch.setenv("DATABASE_URL", store_url)
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(argv))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "nope" in err if argv[1] == "nope" else "--batch" in err
