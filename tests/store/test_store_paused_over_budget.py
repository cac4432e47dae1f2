"""Paused sessions past their whole budget: what the scheduler's sweep counts for the
``sessionfold_paused_sessions_over_budget`` gauge (a paused session is never folded in the
background, so it grows with every turn its agent appends)."""

from __future__ import annotations

from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from store_helpers import turn

SMALL = FoldPolicy(budget_tokens=1000)  # trigger 850


def _grow(store: SessionStore, sid: str, steps: int) -> None:
    store.create_session(sid, SMALL)
    for i in range(steps):
        store.append(sid, turn(f"{sid}{i}"))


def test_paused_over_budget_finds_paused_sessions_past_their_whole_budget(
        store: SessionStore) -> None:
    for sid, steps in (("paused-far", 30), ("paused-over", 12), ("paused-near", 0),
                       ("running-far", 30)):
        _grow(store, sid, steps)
    for sid in ("paused-far", "paused-over", "paused-near"):
        store.set_paused(sid, True)
    found = store.paused_over_budget()
    assert [s.id for s in found] == ["paused-far", "paused-over"]  # most over first
    assert all(s.paused and s.current_tokens > s.policy.budget_tokens for s in found)
    assert [s.id for s in store.paused_over_budget(limit=1)] == ["paused-far"]
    # Past the trigger but within the budget: not counted (that is the over-budget sweep's).
    store.set_policy("paused-over", FoldPolicy(budget_tokens=store.get_session(
        "paused-over").current_tokens + 1, trigger_ratio=0.5, target_ratio=0.25))
    assert [s.id for s in store.paused_over_budget()] == ["paused-far"]
    store.set_paused("paused-far", False)
    assert store.paused_over_budget() == []
    assert "running-far" in {s.id for s in store.over_trigger()}
