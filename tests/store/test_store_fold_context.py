"""A fold crosses into the store twice: begin_fold (claim + what planning needs, one
transaction) and finish_fold (commit or record, one transaction)."""

from __future__ import annotations

import pytest
from sessionfold.core.errors import InvalidInputError, StaleSpanError
from sessionfold.core.window import CompactionRecord, Refusal
from sessionfold.store import FoldContext, SessionStore
from store_helpers import POLICY, Clock, check_window, hand_fold, turn, user


def _session(store: SessionStore, steps: int = 20, sid: str = "a") -> None:
    store.create_session(sid, POLICY, system="be brief")
    store.append(sid, [user("the task")])
    store.append(sid, [m for i in range(steps) for m in turn(str(i))])


def test_begin_fold_claims_and_reads_the_window_the_session_and_the_latches(
        store: SessionStore) -> None:
    _session(store)
    store.record_visit("a", CompactionRecord(
        trigger="manual", outcome="refused", budget_tokens=2000, target_tokens=1200,
        measured_tokens=3000, tokens_after=3000,
        refusals=(Refusal(reason="replacement-not-smaller", start_seq=1, end_seq=3,
                          fingerprint="f" * 64),)))
    context = store.begin_fold("a", "job-1", enqueued_epoch=0)
    assert isinstance(context, FoldContext) and context.claim.claimed
    assert context.window == store.read_window("a")
    assert context.session is not None
    assert context.session.claimed_by == "job-1"  # read after the claim, in its transaction
    assert context.session.fold_epoch == context.claim.epoch
    assert context.latched == frozenset(store.latched("a")) == {"f" * 64}
    # The row the claim locked, with the claim's update applied, is the row as stored.
    assert context.session == store.get_session("a")


def test_a_claim_that_takes_over_a_dead_one_reads_the_session_as_stored(
        store: SessionStore, clock: Clock) -> None:
    _session(store)
    assert store.begin_fold("a", "dead-job", enqueued_epoch=0, lease_s=1.0).claim.claimed
    clock.advance(2.0)  # the lease ran out: its holder never finished
    context = store.begin_fold("a", "job-2")
    assert context.claim.claimed and context.claim.abandoned_folds == 1
    assert context.session == store.get_session("a")
    assert context.session is not None and context.session.abandoned_folds == 1


def test_a_duplicate_begin_fold_stops_at_the_claim_and_reads_nothing(
        store: SessionStore) -> None:
    _session(store)
    assert store.begin_fold("a", "job-1", enqueued_epoch=0).claim.claimed
    twin = store.begin_fold("a", "job-1", enqueued_epoch=0)
    assert twin.claim.status == "newer-claim"
    assert (twin.window, twin.session, twin.latched) == (None, None, frozenset())


def test_finish_fold_commits_a_fold_planned_on_the_context(store: SessionStore) -> None:
    _session(store)
    context = store.begin_fold("a", "job-1", enqueued_epoch=0)
    assert context.window is not None
    commit = store.finish_fold(context.claim, hand_fold(context.window.items, 1, 9))
    assert commit.spans and commit.revision > context.window.revision
    info = store.get_session("a")
    assert info.claimed_by is None and info.revision == commit.revision
    check_window(store, "a")


def test_finish_fold_records_a_visit_that_ended_before_planning_and_releases_the_claim(
        store: SessionStore) -> None:
    _session(store)
    context = store.begin_fold("a", "job-1", enqueued_epoch=0)
    assert context.session is not None
    record = CompactionRecord.paused(trigger="threshold", policy=POLICY,
                                     current_tokens=context.session.current_tokens,
                                     measured=False)
    commit = store.finish_fold(context.claim, record)
    assert commit.spans == [] and commit.revision == store.get_session("a").revision
    assert store.get_session("a").claimed_by is None
    (stored,) = store.records("a")
    assert (stored.id, stored.outcome, stored.job_id) == (commit.record_id, "nothing-to-fold",
                                                           "job-1")
    assert stored.detail == "the session is paused: background folds wait until it is resumed"


def test_finish_fold_after_a_newer_claim_is_stale(store: SessionStore) -> None:
    _session(store)
    context = store.begin_fold("a", "job-1", enqueued_epoch=0)
    assert context.window is not None
    store.claim("a", "inline-1", force=True)  # the inline fallback wins
    with pytest.raises(StaleSpanError):
        store.finish_fold(context.claim, hand_fold(context.window.items, 1, 9))
    assert store.records("a")[-1].outcome == "stale" and store.spans("a") == []


def test_finish_fold_takes_only_a_held_claim(store: SessionStore) -> None:
    _session(store)
    store.begin_fold("a", "job-1", enqueued_epoch=0)
    refused = store.begin_fold("a", "job-2", enqueued_epoch=0).claim
    with pytest.raises(InvalidInputError, match="held claim"):
        store.finish_fold(refused, CompactionRecord.paused(
            trigger="threshold", policy=POLICY, current_tokens=1, measured=False))
