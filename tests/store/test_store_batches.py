"""A fold waiting on a provider's batch API (store.batches): the session's batch mark, held under
the fold's claim, and landed through the commit every fold takes.

The mark holds the claim until the batch's deadline (no other job takes it over as abandoned,
however long its own lease was); the commit, or the visit's record, clears it; a forced claim
ends the wait and fences the answer off; an append does not make the waiting fold stale; a
deleted session, or one created again under the id, never receives the commit.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError, StaleSpanError
from sessionfold.core.window import CompactionRecord
from sessionfold.store import BatchMark, Claim, SessionStore
from store_helpers import POLICY, Clock, check_window, hand_fold, turn, user

SID = "s"


def filled(store: SessionStore, sid: str = SID, turns: int = 12) -> None:
    store.create_session(sid, POLICY)
    store.append(sid, [user("task: fix TICKET-9")], key="task")
    for n in range(turns):
        store.append(sid, turn(f"t{n}"), key=f"turn-{n}")


def mark_for(claim: Claim, store: SessionStore, hours: float = 6.0) -> BatchMark:
    now = store.now()
    return BatchMark(provider="anthropic", batch_id="msgbatch_1", custom_id="k" * 64,
                     job_id=claim.job_id, epoch=claim.epoch, trigger="threshold",
                     submitted_at=now, deadline=now + timedelta(hours=hours),
                     plan={"seen_seq": 24})


def held(store: SessionStore, job: str = "job-1", lease_s: float = 60.0) -> Claim:
    context = store.begin_fold(SID, job, lease_s=lease_s)
    assert context.claim.claimed
    store.hold_for_batch(context.claim, mark_for(context.claim, store))
    return context.claim


def test_the_mark_is_kept_with_the_claim_until_the_batch_deadline(store: SessionStore,
                                                                 clock: Clock) -> None:
    filled(store)
    claim = held(store, lease_s=60)
    info = store.get_session(SID)
    assert info.batch is not None and info.batch.batch_id == "msgbatch_1"
    assert info.batch.plan == {"seen_seq": 24} and info.claimed_by == "job-1"
    assert info.claim_expires_at == info.batch.deadline
    assert [s.id for s in store.pending_batches()] == [SID]
    # Long past the job's own 60 s lease, another job finds the claim live: not abandoned.
    clock.advance(3 * 3600)
    other = store.begin_fold(SID, "job-2", lease_s=60)
    assert other.claim.status == "newer-claim" and "job-1" in other.claim.detail
    assert store.get_session(SID).abandoned_folds == 0
    # The fold's own collection takes the claim up again, with what planning needs.
    resumed = store.resume_batch(SID, "job-1", epoch=claim.epoch,
                                 incarnation=claim.incarnation)
    assert resumed.claim.claimed and resumed.claim.epoch == claim.epoch
    assert resumed.window is not None and resumed.session is not None
    assert resumed.session.batch is not None


def test_the_collected_fold_commits_through_compare_and_set_and_clears_the_mark(
        store: SessionStore) -> None:
    filled(store)
    claim = held(store)
    context = store.resume_batch(SID, "job-1", epoch=claim.epoch, incarnation=claim.incarnation)
    assert context.window is not None
    committed = store.finish_fold(context.claim, hand_fold(context.window.items, 1, 9))
    assert committed.spans and not committed.duplicate
    info = store.get_session(SID)
    assert info.batch is None and info.claimed_by is None and store.pending_batches() == []
    check_window(store, SID)
    # A second look after the commit finds it landed, and lands nothing again.
    again = store.resume_batch(SID, "job-1", epoch=claim.epoch, incarnation=claim.incarnation)
    assert again.claim.status == "already-committed"


def test_an_append_while_the_batch_runs_does_not_make_the_fold_stale(store: SessionStore) -> None:
    filled(store)
    claim = held(store)
    planned = store.read_window(SID).items  # what the submission planned on
    store.append(SID, turn("late"), key="late")  # the agent goes on while the batch runs
    context = store.resume_batch(SID, "job-1", epoch=claim.epoch, incarnation=claim.incarnation)
    assert context.claim.claimed
    committed = store.finish_fold(context.claim, hand_fold(planned, 1, 9))
    assert committed.spans
    window = store.read_window(SID)
    assert window.items[-1].end_seq == store.get_session(SID).ledger_len - 1  # the append kept
    check_window(store, SID)


def test_a_recorded_visit_releases_the_claim_and_clears_the_mark(store: SessionStore) -> None:
    filled(store)
    claim = held(store)
    context = store.resume_batch(SID, "job-1", epoch=claim.epoch, incarnation=claim.incarnation)
    info = store.get_session(SID)
    store.finish_fold(context.claim, CompactionRecord.paused(
        trigger="threshold", policy=info.policy, current_tokens=info.current_tokens,
        measured=False))
    after = store.get_session(SID)
    assert after.batch is None and after.claimed_by is None


def test_a_forced_claim_ends_the_wait_and_fences_the_answer_off(store: SessionStore) -> None:
    filled(store)
    claim = held(store)
    planned = store.read_window(SID).items
    inline = store.begin_fold(SID, "inline-1", force=True)
    assert inline.claim.claimed and inline.claim.epoch == claim.epoch + 1
    assert store.get_session(SID).batch is None and store.pending_batches() == []
    late = store.resume_batch(SID, "job-1", epoch=claim.epoch, incarnation=claim.incarnation)
    assert late.claim.status == "newer-claim"
    with pytest.raises(StaleSpanError):
        store.commit_fold(SID, hand_fold(planned, 1, 9), epoch=claim.epoch, job_id="job-1",
                          incarnation=claim.incarnation)
    assert store.spans(SID) == []


def test_a_claim_past_the_deadline_takes_the_dead_wait_over(store: SessionStore,
                                                            clock: Clock) -> None:
    filled(store)
    held(store)
    clock.advance(6 * 3600 + 1)
    taken = store.begin_fold(SID, "job-2")
    assert taken.claim.claimed and taken.claim.abandoned_folds == 1
    assert store.get_session(SID).batch is None


def test_a_deleted_session_never_receives_the_commit(store: SessionStore) -> None:
    filled(store)
    claim = held(store)
    planned = store.read_window(SID).items
    assert store.delete_session(SID)
    with pytest.raises(SessionNotFoundError):
        store.resume_batch(SID, "job-1", epoch=claim.epoch, incarnation=claim.incarnation)
    # Created again under the id: another incarnation, which the batch's answer never reaches.
    filled(store)
    with pytest.raises(SessionNotFoundError):
        store.resume_batch(SID, "job-1", epoch=claim.epoch, incarnation=claim.incarnation)
    with pytest.raises(StaleSpanError):
        store.commit_fold(SID, hand_fold(planned, 1, 9), epoch=claim.epoch, job_id="job-1",
                          incarnation=claim.incarnation)
    assert store.spans(SID) == [] and store.get_session(SID).batch is None


def test_a_hold_whose_claim_moved_on_is_stale_and_writes_nothing(store: SessionStore) -> None:
    filled(store)
    context = store.begin_fold(SID, "job-1")
    store.begin_fold(SID, "inline-1", force=True)  # while the request went out
    with pytest.raises(StaleSpanError):
        store.hold_for_batch(context.claim, mark_for(context.claim, store))
    assert store.get_session(SID).batch is None
    with pytest.raises(InvalidInputError):
        store.hold_for_batch(context.claim, mark_for(
            Claim(status="claimed", session_id=SID, job_id="other", epoch=1, revision=0,
                  incarnation=context.claim.incarnation), store))


def test_resuming_ends_the_pause_of_a_dead_wait(store: SessionStore, clock: Clock) -> None:
    filled(store)
    held(store)
    store.set_paused(SID, True)
    clock.advance(7 * 3600)
    store.set_paused(SID, False)
    info = store.get_session(SID)
    assert info.claimed_by is None and info.batch is None
