"""The store announces window changes inside the writing transaction (PostgreSQL NOTIFY): a
committed append, fold or delete is heard, a rolled-back one never is; SQLite readers poll
``window_states`` instead."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sessionfold.core.errors import ToolPairingError
from sessionfold.core.policy import FoldPolicy
from sessionfold.service.watch import libpq_url
from sessionfold.store import SessionStore
from sessionfold.store.notify import CHANNEL, WindowChange, WindowState, parse_change

POLICY = FoldPolicy(budget_tokens=4000, keep_recent_turns=1)


@pytest.fixture
def store(store_url: str) -> Iterator[SessionStore]:
    s = SessionStore.from_url(store_url)
    yield s
    s.close()


def next_change(listener: psycopg.Connection) -> WindowChange:
    for note in listener.notifies(timeout=30, stop_after=1):
        change = parse_change(note.payload)
        assert change is not None
        return change
    raise AssertionError("no notification within 30 s")


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_committed_change_is_announced_and_a_rolled_back_one_is_not(
        store: SessionStore) -> None:
    url = libpq_url(store)
    assert url is not None
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        info = store.create_session("s", POLICY)
        store.append("s", [{"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]}])
        first = next_change(listener)
        assert first == WindowChange("s", "append", WindowState(info.incarnation, 1, -1))
        with pytest.raises(ToolPairingError):  # rolled back: announces nothing
            store.append("s", [{"role": "user", "content": "no tool result"}])
        store.append("s", [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}])
        second = next_change(listener)
        assert second.state is not None and second.state.revision == 2
        store.delete_session("s")
        assert next_change(listener) == WindowChange("s", "delete", None)


def test_window_states_reads_many_sessions_at_once_and_leaves_out_missing_ones(
        store: SessionStore) -> None:
    made = {sid: store.create_session(sid, POLICY) for sid in ("a", "b")}
    store.append("a", [{"role": "user", "content": "hi"}])
    states = store.window_states(["a", "b", "gone"])
    assert states == {"a": WindowState(made["a"].incarnation, 1, 0),
                      "b": WindowState(made["b"].incarnation, 0, 0)}


def test_a_payload_not_written_by_the_store_is_ignored() -> None:
    for payload in ("", "[]", '{"s": 1}', '{"s": "x", "c": "append", "i": "1", "r": 2}'):
        assert parse_change(payload) is None
