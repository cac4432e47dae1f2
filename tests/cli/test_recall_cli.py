"""``sessionfold recall SESSION``: what the recall tool would answer, printed by the same code;
bad input is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sessionfold.cli.main import main
from sessionfold.client.recall import RecallRequest, answer, answer_tool_input
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore

SCRIPT = Path(sys.executable).with_name("sessionfold")


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A SQLite store holding one session: a task, a long tool output, an answer."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with SessionStore.from_url(url) as store:
        store.migrate()
        store.create_session("agent-7", FoldPolicy(budget_tokens=32_000))
        output = "\n".join(f"row {i}: status ok" for i in range(4000))
        store.append("agent-7", [
            {"role": "user", "content": "Reconcile ACCT-8842."},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "cat log"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": output + "\nACCT-8842 refunded"}]},
            {"role": "assistant", "content": "Done."},
        ])
    return url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["recall", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_it_prints_exactly_what_the_tool_returns_by_seq_and_by_query(
        store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with SessionStore.from_url(store_url) as store:
        by_seq = answer(store, "agent-7", RecallRequest(seq=(1, 2)))
        by_query = answer_tool_input(store, "agent-7", {"query": "ACCT-8842"})
    code, out, _ = run(capsys, "agent-7", "--seq", "#1–#2", "--database-url", store_url)
    assert code == 0 and out == by_seq.text + "\n"
    code, out, _ = run(capsys, "agent-7", "--query", "ACCT-8842", "--database-url", store_url)
    assert code == 0 and out == by_query.text + "\n"
    assert "ACCT-8842 refunded" in out


def test_json_names_the_outcome_and_where_to_read_on(
        store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "agent-7", "--seq", "2", "--offset", "100", "--json",
                       "--database-url", store_url)
    data: dict[str, Any] = json.loads(out)
    assert code == 0 and set(data) == {"kind", "outcome", "tokens", "next_seq",
                                       "next_offset", "text"}
    assert data["kind"] == "seq" and data["outcome"] == "clipped"
    assert data["next_seq"] == "2" and data["next_offset"] > 100
    assert "from character 100 of" in data["text"]


def one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr


@pytest.mark.parametrize("argv,needles", [
    (["agent-7", "--seq", "twelve"], ["sessionfold recall:", "seq must be a ledger row"]),
    (["agent-7", "--seq", "9-3"], ["ends before it starts"]),
    (["agent-7", "--query", "ACCT", "--offset", "5"], ["offset pages the rows of a seq"]),
    (["agent-7", "--query", "%%% ***"], ["holds no word or identifier"]),
    (["agent-7", "--query", "x" * 3000], ["at most 2,000"]),
    (["nobody", "--seq", "1"], ["no session 'nobody'"]),
    (["agent-7", "--seq", "1", "--query", "x"], ["not allowed with argument"]),
    (["agent-7"], ["one of the arguments --seq --query is required"]),
    (["agent-7", "--seq", "1", "--offset", "-3"], ["offset must be"]),
])
def test_bad_input_is_one_line_and_exit_2(store_url: str, argv: list[str],
                                          needles: list[str]) -> None:
    proc = subprocess.run([str(SCRIPT), "recall", *argv, "--database-url", store_url],
                          capture_output=True, text=True, timeout=300)
    one_line(proc, *needles)
