"""A session id deleted and created again names a new session: nothing planned on the old one
may land in it.

Epochs and item versions restart with every created session, so the fence is the session's
incarnation together with the claim (job id and epoch) the plan was made under.
"""

from __future__ import annotations

from typing import Any

import pytest
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError, StaleSpanError
from sessionfold.core.window import CompactionRecord, Refusal
from sessionfold.store import SessionStore
from store_helpers import POLICY, check_window, ledger_json, plan, row_counts, turn, user


def _messages(tag: str) -> list[dict[str, Any]]:
    return [m for i in range(20) for m in turn(f"{tag}{i}")]


def _fill(store: SessionStore, tag: str) -> None:
    """The same appends every time (so the item versions, which restart, come out equal)."""
    store.create_session("a", POLICY, system="be brief")
    store.append("a", [user(f"the {tag} task")])
    store.append("a", _messages(tag))


def _visit(outcome: str = "nothing-to-fold", fingerprint: str | None = None) -> CompactionRecord:
    refusals = (Refusal(reason="replacement-not-smaller", start_seq=1, end_seq=4,
                        fingerprint=fingerprint),) if fingerprint else ()
    return CompactionRecord(trigger="threshold", outcome=outcome, budget_tokens=2000,
                            target_tokens=1200, measured_tokens=2500, tokens_after=2500,
                            refusals=refusals)


def test_a_commit_planned_on_a_deleted_session_is_refused_and_recorded_in_its_successor(
        store: SessionStore) -> None:
    _fill(store, "old")
    old = store.claim("a", "job-old")
    planned = plan(store, "a")  # the summarizer is paid here, outside any transaction
    assert planned.spans
    store.delete_session("a")
    _fill(store, "new")
    new = store.claim("a", "job-new")  # another job visits the new session and folds nothing
    store.record_visit("a", _visit(), job_id="job-new", epoch=new.epoch,
                       incarnation=new.incarnation)
    assert (new.epoch, new.incarnation) != (old.epoch, old.incarnation)
    assert new.epoch == old.epoch  # epochs restart: the epoch alone cannot tell them apart
    window = store.read_window("a")

    with pytest.raises(StaleSpanError, match="deleted"):
        store.commit_fold("a", planned, epoch=old.epoch, job_id="job-old",
                          incarnation=old.incarnation)

    assert store.spans("a") == []
    assert store.read_window("a").items == window.items
    assert ledger_json(store, "a") == [user("the new task"), *_messages("new")]
    stale = store.records("a")[-1]
    assert (stale.outcome, stale.job_id) == ("stale", "job-old")
    assert "earlier session" in stale.detail and "deleted" in stale.detail
    check_window(store, "a")


def test_a_visit_recorded_for_a_deleted_session_leaves_its_successor_alone(
        store: SessionStore) -> None:
    _fill(store, "old")
    old = store.claim("a", "job-1")
    store.delete_session("a")
    _fill(store, "new")
    new = store.claim("a", "job-1", lease_s=60)  # the same job id, even: its claim is live
    assert new.epoch == old.epoch
    with pytest.raises(StaleSpanError, match="deleted"):
        store.record_visit("a", _visit("refused", fingerprint="f" * 64), job_id="job-1",
                           epoch=old.epoch, incarnation=old.incarnation)
    info = store.get_session("a")
    assert info.claimed_by == "job-1" and info.fold_epoch == new.epoch  # not released
    assert store.latched("a") == set()  # judged on a window that no longer exists
    (record,) = store.records("a")
    assert record.outcome == "stale" and "deleted" in record.detail


def test_a_commit_for_a_session_that_is_gone_raises_session_not_found(
        store: SessionStore) -> None:
    _fill(store, "old")
    claim = store.claim("a", "job-1")
    planned = plan(store, "a")
    store.delete_session("a")
    with pytest.raises(SessionNotFoundError, match="'a'"):
        store.commit_fold("a", planned, epoch=claim.epoch, job_id="job-1",
                          incarnation=claim.incarnation)
    assert sum(row_counts(store).values()) == 0


def test_a_retry_enqueued_for_a_deleted_session_does_not_claim_its_successor(
        store: SessionStore) -> None:
    _fill(store, "old")
    old = store.claim("a", "job-1")
    store.record_visit("a", _visit(), job_id="job-1", epoch=old.epoch,
                       incarnation=old.incarnation)
    store.delete_session("a")
    _fill(store, "new")
    with pytest.raises(SessionNotFoundError, match="deleted"):
        store.claim("a", "job-1~r1", enqueued_epoch=old.epoch, incarnation=old.incarnation)
    assert store.get_session("a").fold_epoch == 0  # nothing claimed
    fresh = store.claim("a", "job-2")
    assert fresh.claimed and fresh.incarnation != old.incarnation


def test_a_commit_by_a_job_whose_claim_was_released_is_refused(store: SessionStore) -> None:
    _fill(store, "only")
    claim = store.claim("a", "job-1")
    planned = plan(store, "a")
    # The job's claim ended (its visit was recorded, e.g. at the soft time limit), same epoch.
    store.record_visit("a", _visit(), job_id="job-1", epoch=claim.epoch,
                       incarnation=claim.incarnation)
    with pytest.raises(StaleSpanError, match="no longer holds"):
        store.commit_fold("a", planned, epoch=claim.epoch, job_id="job-1",
                          incarnation=claim.incarnation)
    assert store.spans("a") == []


def test_a_claim_names_its_incarnation_and_a_visit_names_both_or_neither(
        store: SessionStore) -> None:
    _fill(store, "only")
    claim = store.claim("a", "job-1")
    assert claim.incarnation > 0 and store.claim("a", "job-2").incarnation == claim.incarnation
    with pytest.raises(InvalidInputError, match="incarnation"):
        store.record_visit("a", _visit(), job_id="job-1", epoch=claim.epoch)
    with pytest.raises(InvalidInputError, match="incarnation"):
        store.claim("a", "job-3", incarnation="7")  # type: ignore[arg-type]
