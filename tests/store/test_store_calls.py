"""How long a session has lived and how late its folds land, in model calls: the store counts
the agent's replies (not the client's recall exchanges), migrates old rows to their ledger's
count, and keeps a running mean of the calls made while a background fold ran."""

from __future__ import annotations

from typing import Any

import pytest
from alembic import command
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SCHEMA_REVISION, SessionStore
from sessionfold.store.fold_commit import LAG_WEIGHT
from sessionfold.store.migrate import alembic_config
from store_helpers import plan, turn, user

POLICY = FoldPolicy(budget_tokens=2000, keep_recent_turns=1, economics="window")


def recall_exchange(tag: str) -> list[dict[str, Any]]:
    call = f"recall-{tag}"
    return [{"role": "assistant", "content": [
                {"type": "tool_use", "id": call, "name": "sessionfold_recall",
                 "input": {"seq": "0"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call, "content": "the task"}]}]


def test_every_reply_of_the_agents_is_a_call_and_a_recall_exchange_is_not(
        store: SessionStore) -> None:
    store.create_session("a", POLICY)
    assert store.get_session("a").calls == 0
    store.append("a", [user("task"), *turn("1"), *turn("2")])
    assert store.get_session("a").calls == 2
    store.append("a", recall_exchange("x"), recall=True)
    assert store.get_session("a").calls == 2
    store.append("a", [*turn("3")], key="k3")
    store.append("a", [*turn("3")], key="k3")  # a retried key appends nothing, counts nothing
    assert store.get_session("a").calls == 3


def test_migrating_an_older_store_counts_each_sessions_calls_from_its_ledger(
        fresh_url: str) -> None:
    store = SessionStore.from_url(fresh_url)
    try:
        store.migrate()
        store.create_session("a", POLICY)
        store.append("a", [user("task"), *turn("1"), *turn("2"), *turn("3")])
        store.append("a", recall_exchange("x"), recall=True)
        store.create_session("b", POLICY)
        with store.engine.begin() as conn:  # back to a 0007 store: no count kept
            command.downgrade(alembic_config(conn), "0007")
        assert store.migrate() == SCHEMA_REVISION
        assert store.get_session("a").calls == 3 and store.get_session("b").calls == 0
        assert store.get_session("a").fold_lag_calls is None
    finally:
        store.close()


def _grown(store: SessionStore, sid: str) -> None:
    store.create_session(sid, POLICY)
    store.append(sid, [user("task"), *(m for n in range(10) for m in turn(str(n), 30))])


def test_a_background_fold_keeps_a_running_mean_of_the_calls_made_while_it_ran(
        store: SessionStore) -> None:
    _grown(store, "a")
    context = store.begin_fold("a", "job-1")
    result = plan(store, "a")
    store.append("a", [*turn("late-1"), *turn("late-2")])  # two calls while it ran
    store.finish_fold(context.claim, result)
    assert store.get_session("a").fold_lag_calls == 2.0
    context = store.begin_fold("a", "job-2")
    store.append("a", [*turn("late-3"), *(m for n in range(30) for m in turn(f"x{n}", 30))])
    result = plan(store, "a", force=True, target_tokens=500)
    store.finish_fold(context.claim, result)
    # A forced fold (``plan(force=True)`` plans an overflow) is an inline one: it says nothing
    # of a worker's lag.
    assert store.get_session("a").fold_lag_calls == 2.0


def test_the_running_mean_weighs_the_newest_fold(store: SessionStore) -> None:
    _grown(store, "a")
    context = store.begin_fold("a", "job-1")
    store.finish_fold(context.claim, plan(store, "a"))  # landed before any call: lag 0
    assert store.get_session("a").fold_lag_calls == 0.0
    store.append("a", [*(m for n in range(12) for m in turn(f"y{n}", 30))])
    context = store.begin_fold("a", "job-2")
    result = plan(store, "a")
    assert result.changed
    store.append("a", [*(m for n in range(6) for m in turn(f"z{n}"))])
    store.finish_fold(context.claim, result)
    assert store.get_session("a").fold_lag_calls == pytest.approx(LAG_WEIGHT * 6)
