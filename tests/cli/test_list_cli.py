"""``sessionfold list``: every session with its sizes, budget, last fold and pause, from the store.

A SQLite store under ``tmp_path`` holds a session folded inline through the client (the offline
summarizer), a paused one the HTTP API would have made (``tenant:acme/...``) and one never
folded; the command's table and its JSON are held to what the store itself says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sessionfold.cli.main import main
from sessionfold.client import Client
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore

FOLDED, API_MADE, PLAIN = "agent-7", "tenant:acme/bot-1", "zeta"


def _turn(i: int) -> list[dict[str, Any]]:
    output = "\n".join(f"step {i} line {n}: tool output worth reading" for n in range(8))
    return [{"role": "assistant", "content": [
                {"type": "text", "text": f"Step {i}."},
                {"type": "tool_use", "id": f"call-{i}", "name": "bash",
                 "input": {"command": f"cat file-{i}.txt"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"call-{i}", "content": output}]}]


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = SessionStore.from_url(url)
    store.migrate()
    settings = Settings(data_dir=tmp_path / "data", redis_url=None, database_url=None,
                        summarizer="offline")
    with Client(settings, store, publisher=None) as client:
        agent = client.session(FOLDED, policy=FoldPolicy(budget_tokens=2000, keep_recent_turns=2),
                               system="You watch the build.")
        agent.append([{"role": "user", "content": "keep the build green"}])
        for i in range(20):
            agent.append(_turn(i))
        assert agent.fold_inline().outcome == "folded"
        client.store.create_session(API_MADE, FoldPolicy(budget_tokens=32_000))
        client.store.set_paused(API_MADE, True)
        client.store.create_session(PLAIN, FoldPolicy(budget_tokens=8000))
    yield url


def _listed(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    assert main(["list", *argv]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def _rows(table: str) -> list[list[str]]:
    # Columns are two or more spaces apart; no cell holds two spaces in a row.
    return [re.split(r" {2,}", line.strip()) for line in table.splitlines()]


def _last_fold(store: SessionStore, sid: str) -> str:
    return max(r.created_at for r in store.records(sid) if r.outcome == "folded").isoformat()


def test_the_table_shows_each_sessions_id_tenant_sizes_budget_last_fold_and_pause(
        store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _listed(capsys, "--database-url", store_url)
    assert err == ""
    header, *rows = _rows(out)
    assert header == ["SESSION", "TENANT", "LEDGER", "WINDOW TOKENS", "BUDGET",
                      "LAST FOLD (UTC)", "PAUSED"]
    with SessionStore.from_url(store_url) as store:
        folded, made, plain = (store.get_session(sid) for sid in (FOLDED, API_MADE, PLAIN))
        last = _last_fold(store, FOLDED)
    assert rows == [  # in id order
        [FOLDED, "-", "41", f"{folded.current_tokens:,}", "2,000", last[:19].replace("T", " "),
         "no"],
        [API_MADE, "acme", "0", f"{made.current_tokens:,}", "32,000", "never", "yes"],
        [PLAIN, "-", "0", f"{plain.current_tokens:,}", "8,000", "never", "no"],
    ]


def test_json_holds_the_same_facts_as_the_store(store_url: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = _listed(capsys, "--json", "--database-url", store_url)
    data = json.loads(out)
    assert data["next_after"] is None
    with SessionStore.from_url(store_url) as store:
        expected = []
        for sid in (FOLDED, API_MADE, PLAIN):
            info = store.get_session(sid)
            expected.append({
                "id": sid, "tenant": "acme" if sid == API_MADE else None,
                "ledger_messages": info.ledger_len, "current_tokens": info.current_tokens,
                "budget_tokens": info.policy.budget_tokens,
                "last_fold_at": _last_fold(store, sid) if sid == FOLDED else None,
                "paused": info.paused})
    assert data["sessions"] == expected
    assert data["sessions"][0]["ledger_messages"] == 41


def test_limit_and_after_page_through_the_sessions(store_url: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _listed(capsys, "--limit", "2", "--database-url", store_url)
    assert [r[0] for r in _rows(out)[1:]] == [FOLDED, API_MADE]
    assert f"sessionfold list --after {API_MADE}" in err
    out, err = _listed(capsys, "--after", API_MADE, "--database-url", store_url)
    assert [r[0] for r in _rows(out)[1:]] == [PLAIN] and err == ""
    out, _ = _listed(capsys, "--json", "--limit", "1", "--database-url", store_url)
    first = json.loads(out)
    assert [s["id"] for s in first["sessions"]] == [FOLDED]
    assert first["next_after"] == FOLDED


def test_every_id_listed_is_one_inspect_takes(store_url: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = _listed(capsys, "--json", "--database-url", store_url)
    for listed in json.loads(out)["sessions"]:
        assert main(["inspect", listed["id"], "--database-url", store_url]) == 0
        assert capsys.readouterr().out.startswith(f"session {listed['id']} ")


def test_an_empty_store_lists_nothing_and_says_so(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with SessionStore.from_url(url) as store:
        store.migrate()
    out, err = _listed(capsys, "--database-url", url)
    assert out == "" and "sessionfold list: no sessions" in err
    out, _ = _listed(capsys, "--json", "--database-url", url)
    assert json.loads(out) == {"sessions": [], "next_after": None}


@pytest.mark.parametrize("limit", ["0", "1001", "many"])
def test_a_bad_limit_exits_2(limit: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["list", "--limit", limit])
    assert exited.value.code == 2
    assert "--limit" in capsys.readouterr().err
