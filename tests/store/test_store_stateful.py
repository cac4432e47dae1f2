"""A hypothesis state machine interleaves appends, folds, stale folds and duplicate commits.

The model is the ledger (what was appended, in order) and the fold plans still in flight. Before
each commit the test predicts, from the stored window and the session's fence, whether the
commit must succeed, be a duplicate, or be stale, and checks that the store agrees; after every
step the window invariants hold and the ledger equals the model.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sessionfold.core.compact import FoldResult
from sessionfold.core.errors import StaleSpanError
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from store_helpers import check_window, hand_fold, ledger_json, plan, turn, user

POLICY = FoldPolicy(budget_tokens=1500, keep_recent_turns=1)


@dataclass
class Plan:
    result: FoldResult
    epoch: int
    incarnation: int
    job_id: str
    committed: bool = False


class FoldMachine(RuleBasedStateMachine):
    def __init__(self, store: SessionStore) -> None:
        super().__init__()
        self.store = store
        self.plain = SessionStore(store.engine, item_cache=0)  # decodes every read afresh
        self.sid = f"sm-{uuid.uuid4().hex[:10]}"
        store.create_session(self.sid, POLICY, system="state machine")
        self.ledger: list[dict[str, Any]] = [user("the task")]
        store.append(self.sid, self.ledger)
        self.plans: list[Plan] = []
        self.jobs = 0
        self.stale = 0

    def _job(self) -> str:
        self.jobs += 1
        return f"job-{self.jobs}"

    @rule(turns=st.integers(1, 3), lines=st.integers(1, 25), retry=st.booleans())
    def append_turns(self, turns: int, lines: int, retry: bool) -> None:
        tag = f"{len(self.ledger)}"
        messages = [m for i in range(turns) for m in turn(f"{tag}.{i}", lines=lines)]
        key = f"k{len(self.ledger)}"
        first = self.store.append(self.sid, messages, key=key)
        assert first.first_seq == len(self.ledger) and not first.duplicate
        self.ledger.extend(messages)
        if retry:
            again = self.store.append(self.sid, messages, key=key)
            assert again.duplicate and again.first_seq == first.first_seq

    @precondition(lambda self: len(self.ledger) >= 5)
    @rule(force=st.booleans())
    def plan_fold(self, force: bool) -> None:
        job = self._job()
        claim = self.store.claim(self.sid, job, force=force, lease_s=3600)
        if not claim.claimed:
            assert claim.status == "newer-claim"
            return
        result = plan(self.store, self.sid, force=force,
                      target_tokens=POLICY.target_tokens // 2 if force else None)
        if result.edit.empty:
            self.store.record_visit(self.sid, result.record, job_id=job, epoch=claim.epoch,
                                    incarnation=claim.incarnation)
            assert self.store.get_session(self.sid).claimed_by is None
            return
        self.plans.append(Plan(result, claim.epoch, claim.incarnation, job))

    @precondition(lambda self: len(self.store.read_window(self.sid).items) >= 3)
    @rule(data=st.data())
    def plan_by_hand(self, data: st.DataObject) -> None:
        """A plan that replaces any run of items (the store must not care who planned it)."""
        items = self.store.read_window(self.sid).items
        # Cut only between turns: before an item that answers no tool call.
        cuts = [i for i, item in enumerate(items) if not item.message.has_tool_results()]
        start = data.draw(st.sampled_from(cuts))
        stops = [j for j in [*cuts, len(items)] if start < j <= start + 6]
        stop = data.draw(st.sampled_from(stops))
        job = self._job()
        claim = self.store.claim(self.sid, job, force=True, lease_s=3600)
        self.plans.append(Plan(hand_fold(items, start, stop, text=job), claim.epoch,
                               claim.incarnation, job))

    @precondition(lambda self: bool(self.plans))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        chosen = data.draw(st.sampled_from(self.plans))
        info = self.store.get_session(self.sid)
        current = {(i.start_seq, i.version) for i in self.store.read_window(self.sid).items}
        recorded = {(s.start_seq, s.end_seq) for s in self.store.spans(self.sid)}
        fresh = chosen.epoch == info.fold_epoch and info.claimed_by == chosen.job_id and all(
            (i.start_seq, i.version) in current for i in chosen.result.edit.replaced
        ) and not any((s.start_seq, s.end_seq) in recorded for s in chosen.result.spans)
        try:
            done = self.store.commit_fold(self.sid, chosen.result, epoch=chosen.epoch,
                                          incarnation=chosen.incarnation, job_id=chosen.job_id)
        except StaleSpanError:
            assert not chosen.committed and not fresh
            self.stale += 1
            self.plans.remove(chosen)
            return
        if chosen.committed:
            assert done.duplicate and done.revision == info.revision
            return
        assert fresh and not done.duplicate and done.revision == info.revision + 1
        chosen.committed = True
        window = self.store.read_window(self.sid)
        for item in chosen.result.edit.inserted:
            assert any(w.start_seq == item.start_seq and w.message == item.message
                       for w in window.items)

    @invariant()
    def ledger_is_the_model(self) -> None:
        assert ledger_json(self.store, self.sid) == self.ledger

    @invariant()
    def window_holds_its_invariants(self) -> None:
        check_window(self.store, self.sid)

    @invariant()
    def the_item_cache_changes_nothing(self) -> None:
        cached, plain = self.store.read_window(self.sid), self.plain.read_window(self.sid)
        assert cached.revision == plain.revision
        assert [i.to_json() for i in cached.items] == [i.to_json() for i in plain.items]

    @invariant()
    def records_count_the_lost_races(self) -> None:
        records = self.store.records(self.sid)
        assert sum(r.outcome == "stale" for r in records) == self.stale
        assert sum(r.outcome == "folded" for r in records) == sum(
            p.committed for p in self.plans)


@pytest.mark.slow
def test_appends_folds_stale_folds_and_duplicate_commits_interleave(store: SessionStore) -> None:
    run_state_machine_as_test(
        lambda: FoldMachine(store),
        settings=settings(max_examples=12, stateful_step_count=18, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
