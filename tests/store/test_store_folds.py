"""Claims and fold commits: fenced, compare-and-set, whole or not at all, recorded either way."""

from __future__ import annotations

import threading

import pytest
from sessionfold.core.errors import (
    DiscardedOriginalsError,
    InvalidInputError,
    StaleSpanError,
)
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import CompactionRecord, Refusal
from sessionfold.store import SessionStore
from store_helpers import (
    POLICY,
    Clock,
    check_window,
    hand_fold,
    ledger_json,
    plan,
    row_counts,
    turn,
    user,
)


def _session(store: SessionStore, steps: int = 20, policy: FoldPolicy = POLICY,
             sid: str = "a") -> None:
    store.create_session(sid, policy, system="be brief")
    store.append(sid, [user("the task")])
    store.append(sid, [m for i in range(steps) for m in turn(str(i))])


# --- claims ------------------------------------------------------------------------------------

def test_of_five_concurrent_deliveries_of_a_job_exactly_one_claims(store: SessionStore) -> None:
    _session(store, steps=1)
    epoch = store.get_session("a").fold_epoch
    barrier = threading.Barrier(5)
    results: list[str] = []

    def deliver() -> None:
        barrier.wait()
        results.append(store.claim("a", "job-1", enqueued_epoch=epoch).status)

    threads = [threading.Thread(target=deliver) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["claimed"] + ["newer-claim"] * 4
    assert store.get_session("a").fold_epoch == epoch + 1


def test_a_killed_jobs_lease_expires_and_its_redelivery_claims_again(
        store: SessionStore, clock: Clock) -> None:
    _session(store)
    first = store.claim("a", "job-1", enqueued_epoch=0, lease_s=60)
    assert first.claimed and first.epoch == 1 and first.holder == "job-1"
    assert store.claim("a", "job-1", enqueued_epoch=0).status == "newer-claim"
    assert store.claim("a", "job-2", enqueued_epoch=1).status == "newer-claim"
    clock.advance(61)  # the first attempt died; its lease ran out
    again = store.claim("a", "job-1", enqueued_epoch=0, lease_s=60)
    assert again.claimed and again.epoch == 2
    # The dead attempt, should it wake up, is stale.
    with pytest.raises(StaleSpanError, match="claimed again"):
        store.commit_fold("a", plan(store, "a"), epoch=first.epoch,
                          incarnation=first.incarnation, job_id="job-1")


def test_a_job_enqueued_before_another_claim_stops(store: SessionStore, clock: Clock) -> None:
    _session(store, steps=1)
    store.claim("a", "job-1", enqueued_epoch=0, lease_s=10)
    clock.advance(11)
    late = store.claim("a", "job-2", enqueued_epoch=0)
    assert late.status == "newer-claim" and "after this job was enqueued" in late.detail
    assert store.claim("a", "job-3", enqueued_epoch=1).claimed
    assert store.claim("a", "manual").status == "newer-claim"  # job-3's lease is live


def test_the_inline_fallback_always_claims_and_the_background_fold_goes_stale(
        store: SessionStore) -> None:
    _session(store)
    background = store.claim("a", "job-bg", enqueued_epoch=0)
    planned = plan(store, "a")
    inline = store.claim("a", "inline-1", force=True)
    assert inline.claimed and inline.epoch == background.epoch + 1
    store.commit_fold("a", plan(store, "a", force=True, target_tokens=1000),
                      epoch=inline.epoch, incarnation=inline.incarnation, job_id="inline-1")
    before = row_counts(store)
    with pytest.raises(StaleSpanError, match="stale"):
        store.commit_fold("a", planned, epoch=background.epoch,
                          incarnation=background.incarnation, job_id="job-bg")
    after = row_counts(store)
    assert after["folds"] == before["folds"] and after["window_items"] == before["window_items"]
    assert after["compaction_records"] == before["compaction_records"] + 1
    assert [r.outcome for r in store.records("a")] == ["folded", "stale"]
    check_window(store, "a")


def test_a_redelivered_job_that_already_committed_stops(store: SessionStore) -> None:
    _session(store)
    claim = store.claim("a", "job-1", enqueued_epoch=0)
    store.commit_fold("a", plan(store, "a"), epoch=claim.epoch,
                      incarnation=claim.incarnation, job_id="job-1")
    again = store.claim("a", "job-1", enqueued_epoch=0)
    assert again.status == "already-committed"


def _die_holding_the_claim(store: SessionStore, clock: Clock, job: str,
                           max_abandoned: int | None = 3) -> str:
    """``job`` claims and its worker dies: the lease runs out with the claim still set."""
    claim = store.claim("a", job, lease_s=10, max_abandoned=max_abandoned)
    clock.advance(11)
    return claim.status


def _visit_record(outcome: str = "nothing-to-fold") -> CompactionRecord:
    return CompactionRecord(trigger="threshold", outcome=outcome,
                            budget_tokens=2000, target_tokens=1200, measured_tokens=2500,
                            tokens_after=2500)


def test_takeovers_of_dead_claims_count_per_session_until_the_cap_refuses(
        store: SessionStore, clock: Clock) -> None:
    _session(store)
    # Every job has its own id (the scheduler enqueues anew after each lease): the count is
    # the session's.
    assert _die_holding_the_claim(store, clock, "job-1") == "claimed"
    assert store.get_session("a").abandoned_folds == 0  # nobody took job-1's claim over yet
    assert _die_holding_the_claim(store, clock, "job-2") == "claimed"
    assert store.get_session("a").abandoned_folds == 1
    assert _die_holding_the_claim(store, clock, "job-3") == "claimed"
    assert store.get_session("a").abandoned_folds == 2
    epoch = store.get_session("a").fold_epoch
    refused = store.claim("a", "job-4", max_abandoned=3)
    assert refused.status == "abandoned" and not refused.claimed
    assert refused.abandoned_folds == 3 and "abandoned 3 times in a row" in refused.detail
    info = store.get_session("a")
    # The dead claim is ended (counted once) and fenced: job-3 could not commit now.
    assert info.abandoned_folds == 3 and info.claimed_by is None
    assert info.fold_epoch == refused.epoch == epoch + 1
    again = store.claim("a", "job-5", max_abandoned=3)
    assert again.status == "abandoned" and again.abandoned_folds == 3
    # Without a cap (the inline fallback) the session is still claimed.
    assert store.claim("a", "inline-1", force=True).claimed


def test_a_live_claim_or_a_released_one_is_not_counted(store: SessionStore,
                                                       clock: Clock) -> None:
    _session(store)
    claim = store.claim("a", "job-1", lease_s=10)
    assert store.claim("a", "job-2", max_abandoned=1).status == "newer-claim"  # live: a twin
    store.record_visit("a", _visit_record(), job_id="job-1", epoch=claim.epoch,
                       incarnation=claim.incarnation)
    clock.advance(11)
    assert store.claim("a", "job-3", max_abandoned=1).claimed
    assert store.get_session("a").abandoned_folds == 0


@pytest.mark.parametrize("finish", ["commit", "visit", "refused-visit", "resume"])
def test_a_finished_visit_or_a_resume_resets_the_count(store: SessionStore, clock: Clock,
                                                       finish: str) -> None:
    _session(store)
    for job in ("job-1", "job-2", "job-3"):
        _die_holding_the_claim(store, clock, job)
    assert store.get_session("a").abandoned_folds == 2
    if finish == "resume":
        store.set_paused("a", True)
        assert store.get_session("a").abandoned_folds == 2  # pausing keeps it for the operator
        store.set_paused("a", False)
    else:
        claim = store.claim("a", "job-4", max_abandoned=5)
        assert claim.claimed and claim.abandoned_folds == 3
        # A record by a job that does not hold the claim is no finished visit of it.
        store.record_visit("a", _visit_record(), job_id="job-other")
        assert store.get_session("a").abandoned_folds == 3
        if finish == "commit":
            store.commit_fold("a", plan(store, "a"), epoch=claim.epoch,
                              incarnation=claim.incarnation, job_id="job-4")
        else:
            outcome = "refused" if finish == "refused-visit" else "nothing-to-fold"
            store.record_visit("a", _visit_record(outcome), job_id="job-4", epoch=claim.epoch,
                               incarnation=claim.incarnation)
    info = store.get_session("a")
    assert info.abandoned_folds == 0 and info.claimed_by is None
    assert store.claim("a", "job-5", max_abandoned=1).claimed


def test_bad_claims_are_refused(store: SessionStore) -> None:
    _session(store, steps=1)
    for kwargs, match in (({"lease_s": 0}, "lease_s"), ({"lease_s": float("nan")}, "lease_s"),
                          ({"enqueued_epoch": "3"}, "enqueued_epoch")):
        with pytest.raises(InvalidInputError, match=match):
            store.claim("a", "job", **kwargs)
    for bad in (0, -1, True, "3"):
        with pytest.raises(InvalidInputError, match="max_abandoned"):
            store.claim("a", "job", max_abandoned=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="job id"):
        store.claim("a", "")
    assert store.get_session("a").fold_epoch == 0


# --- commits -----------------------------------------------------------------------------------

def test_a_fold_commits_window_span_and_record_together(store: SessionStore) -> None:
    _session(store)
    ledger_before = ledger_json(store, "a")
    claim = store.claim("a", "job-1")
    result = plan(store, "a")
    assert result.record.outcome == "folded" and result.spans
    committed = store.commit_fold("a", result, epoch=claim.epoch,
                                  incarnation=claim.incarnation, job_id="job-1")
    assert not committed.duplicate
    span = committed.spans[0]
    assert (span.start_seq, span.end_seq) == (result.spans[0].start_seq,
                                              result.spans[0].end_seq)
    assert span.job_id == "job-1" and span.epoch == claim.epoch and span.retained
    window = store.read_window("a")
    assert [m.to_json() for m in window.messages()] == [m.to_json() for m in result.messages()]
    assert all(i.version == committed.revision for i in window.items
               if i.kind == "summary" or i.edits)
    info = store.get_session("a")
    assert info.revision == committed.revision == info.fold_revision
    assert info.claimed_by is None and info.last_visit_outcome == "folded"
    assert info.measured_tokens == result.record.tokens_after
    assert ledger_json(store, "a") == ledger_before  # the law: the ledger is untouched
    assert store.recover("a", span.start_seq, span.end_seq) == [
        e.message for e in store.read_ledger("a", span.start_seq, span.end_seq + 1)]
    [record] = store.records("a")
    assert record.outcome == "folded" and record.job_id == "job-1"
    assert record.folded == result.record.folded
    check_window(store, "a")


def test_the_same_job_committing_again_is_a_no_op_success(store: SessionStore) -> None:
    _session(store)
    claim = store.claim("a", "job-1")
    result = plan(store, "a")
    first = store.commit_fold("a", result, epoch=claim.epoch,
                              incarnation=claim.incarnation, job_id="job-1")
    before = row_counts(store)
    again = store.commit_fold("a", result, epoch=claim.epoch,
                              incarnation=claim.incarnation, job_id="job-1")
    assert again.duplicate and again.revision == first.revision
    assert [s.id for s in again.spans] == [s.id for s in first.spans]
    assert row_counts(store) == before


def test_two_workers_committing_the_same_planned_span_make_one_span(store: SessionStore) -> None:
    _session(store)
    result = plan(store, "a")
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def worker(job: str) -> None:
        # Each worker takes the session (force: no waiting on the others' leases) and commits
        # the one plan they all made. Whatever the interleaving, the fence or the item versions
        # let exactly one of them through.
        barrier.wait()
        claim = store.claim("a", job, force=True)
        try:
            store.commit_fold("a", result, epoch=claim.epoch,
                              incarnation=claim.incarnation, job_id=job)
            outcomes.append("committed")
        except StaleSpanError:
            outcomes.append("stale")

    threads = [threading.Thread(target=worker, args=(f"job-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["committed"] + ["stale"] * 3
    assert [(s.start_seq, s.end_seq) for s in store.spans("a")] == [
        (s.start_seq, s.end_seq) for s in result.spans]
    assert sorted(r.outcome for r in store.records("a")) == ["folded"] + ["stale"] * 3
    check_window(store, "a")


def test_a_racing_commit_of_the_same_plan_under_the_same_epoch_loses_on_versions(
        store: SessionStore) -> None:
    """Two deliveries that both believe they hold the claim (the fence alone cannot tell them
    apart): the item versions can."""
    _session(store)
    claim = store.claim("a", "job-1")
    result = plan(store, "a")
    store.commit_fold("a", result, epoch=claim.epoch, incarnation=claim.incarnation, job_id="job-1")
    fresh = store.claim("a", "job-2")  # a fresh claim, then a stale plan of the old window
    with pytest.raises(StaleSpanError, match=r"gone|changed"):
        store.commit_fold("a", result, epoch=fresh.epoch, incarnation=fresh.incarnation,
                          job_id="job-2")
    assert len(store.spans("a")) == len(result.spans)


def test_a_fold_planned_on_an_old_revision_overlapping_a_newer_fold_writes_nothing(
        store: SessionStore) -> None:
    _session(store)
    old_items = store.read_window("a").items
    claim = store.claim("a", "job-new")
    store.commit_fold("a", hand_fold(old_items, 3, 9), epoch=claim.epoch,
                      incarnation=claim.incarnation, job_id="job-new")
    newer = row_counts(store)
    window_before = store.read_window("a")
    late = store.claim("a", "job-old")
    with pytest.raises(StaleSpanError, match=r"window item #3 changed since the fold was planned"):
        store.commit_fold("a", hand_fold(old_items, 1, 6), epoch=late.epoch,
                          incarnation=late.incarnation, job_id="job-old")
    after = row_counts(store)
    assert {k: v for k, v in after.items() if k != "compaction_records"} == \
        {k: v for k, v in newer.items() if k != "compaction_records"}
    assert store.read_window("a") == window_before
    assert store.records("a")[-1].outcome == "stale"
    assert store.get_session("a").claimed_by is None  # the lost race released its claim
    check_window(store, "a")


def test_appends_after_the_plan_commute_with_the_fold(store: SessionStore) -> None:
    _session(store)
    claim = store.claim("a", "job-1")
    result = plan(store, "a")
    appended = store.append("a", turn("late"))
    committed = store.commit_fold("a", result, epoch=claim.epoch,
                                  incarnation=claim.incarnation, job_id="job-1")
    window = store.read_window("a")
    assert window.items[-2].start_seq == appended.first_seq
    assert window.items[-1].message.to_json() == turn("late")[1]
    info = store.get_session("a")
    late_tokens = sum(i.tokens or 0 for i in window.items[-2:])
    assert info.current_tokens == result.record.tokens_after + late_tokens
    assert committed.revision == appended.revision + 1
    check_window(store, "a")


def test_retain_discard_blanks_the_folded_originals_and_recover_says_when(
        store: SessionStore, clock: Clock) -> None:
    _session(store, policy=FoldPolicy(budget_tokens=2000, keep_recent_turns=2, retain="discard"))
    claim = store.claim("a", "job-1")
    committed = store.commit_fold("a", plan(store, "a"), epoch=claim.epoch,
                                  incarnation=claim.incarnation, job_id="job-1")
    span = committed.spans[0]
    assert not span.retained and span.discarded_at == clock.now
    with pytest.raises(DiscardedOriginalsError, match=r"discarded at 2030-01-01T00:00:00"):
        store.recover("a", span.start_seq, span.end_seq)
    entries = store.read_ledger("a")
    folded = [e for e in entries if span.start_seq <= e.seq <= span.end_seq]
    assert all(e.message is None and e.discarded_at == clock.now for e in folded)
    assert all(e.message is not None for e in entries if e.seq > span.end_seq)
    assert store.recover("a", 0, 0)[0].content == "the task"
    check_window(store, "a")


def test_refusals_with_a_fingerprint_are_latched(store: SessionStore) -> None:
    _session(store, steps=1)
    record = CompactionRecord(
        trigger="threshold", outcome="refused", budget_tokens=2000, target_tokens=1200,
        measured_tokens=2500, tokens_after=2500,
        refusals=(Refusal(reason="replacement-not-smaller", start_seq=1, end_seq=2,
                          fingerprint="fp-1"),
                  Refusal(reason="first-user", start_seq=0, end_seq=0)))
    claim = store.claim("a", "job-1")
    store.record_visit("a", record, job_id="job-1", epoch=claim.epoch,
                       incarnation=claim.incarnation)
    store.record_visit("a", record)  # latching the same span twice is fine
    assert store.latched("a") == {"fp-1"}
    info = store.get_session("a")
    assert info.claimed_by is None and info.last_visit_outcome == "refused"
    assert [r.outcome for r in store.records("a")] == ["refused", "refused"]
    assert store.records("a")[0].refusals == record.refusals


def test_a_visit_of_another_job_does_not_release_the_claim(store: SessionStore) -> None:
    _session(store, steps=1)
    claim = store.claim("a", "job-1")
    result = plan(store, "a")
    assert result.edit.empty  # under the trigger
    store.commit_fold("a", result, epoch=99, incarnation=claim.incarnation, job_id="job-2")
    assert store.get_session("a").claimed_by == "job-1"
    assert store.records("a")[-1].outcome == "nothing-to-fold"


def test_a_malformed_fold_is_refused_before_anything_is_written(store: SessionStore) -> None:
    _session(store)
    items = store.read_window("a").items
    claim = store.claim("a", "job-1")
    broken = hand_fold(items, 1, 5)
    gap = broken.edit.model_copy(update={"replaced": broken.edit.replaced[:-1]})
    before = row_counts(store)
    with pytest.raises(InvalidInputError, match="cover exactly"):
        store.commit_fold("a", type(broken)(broken.window, gap, broken.record, broken.spans),
                          epoch=claim.epoch, incarnation=claim.incarnation, job_id="job-1")
    mislabeled = broken.record.model_copy(update={"outcome": "refused"})
    with pytest.raises(InvalidInputError, match="recorded as 'folded'"):
        store.commit_fold("a", type(broken)(broken.window, broken.edit, mislabeled,
                                            broken.spans), epoch=claim.epoch,
                          incarnation=claim.incarnation, job_id="job-1")
    with pytest.raises(InvalidInputError, match="FoldResult"):
        store.commit_fold("a", {"edit": None}, epoch=claim.epoch,  # type: ignore[arg-type]
                          incarnation=claim.incarnation, job_id="job-1")
    with pytest.raises(InvalidInputError, match="epoch"):
        store.commit_fold("a", broken, epoch="1",  # type: ignore[arg-type]
                          incarnation=claim.incarnation, job_id="job-1")
    assert row_counts(store) == before


def test_dead_letters_keep_what_the_workers_gave_up_on(store: SessionStore,
                                                       clock: Clock) -> None:
    store.dead_letter("job-1", "a", "summarizer kept failing", 5, {"session": "a", "n": [1]})
    clock.advance(1)
    store.dead_letter("job-2", "b", "worker lost", 3, {})
    letters = store.dead_letters()
    assert [d.job_id for d in letters] == ["job-2", "job-1"]
    assert letters[1].payload == {"session": "a", "n": [1]} and letters[1].attempts == 5
    with pytest.raises(InvalidInputError, match="JSON cannot hold"):
        store.dead_letter("job-3", "a", "x", 1, {"when": object()})
    assert len(store.dead_letters(limit=1)) == 1


def test_the_commits_delete_refuses_a_row_inside_a_planned_stretch_it_never_planned(
        store: SessionStore) -> None:
    # The delete takes a stretch of planned items that covers its seqs without a gap as one
    # range: a row inside it that the plan does not name (it cannot exist unless the window
    # changed) is a lost race, and the rollback keeps every row.
    from sessionfold.store.fold_commit import Stale, _delete_replaced

    _session(store)
    items = store.read_window("a").items
    assert [i.start_seq for i in items[1:4]] == [1, 2, 3]
    forged = [items[1].model_copy(update={"end_seq": 2}), items[3]]  # says #1 covers #1–#2
    # (Which of the two is seen first is the order the database returns the rows in.)
    seen = r"window item #2 appeared among the planned ones|window item #1 changed since"
    with store.engine.connect() as conn, pytest.raises(Stale, match=seen), conn.begin():
        _delete_replaced(conn, "a", forged)
    assert store.read_window("a").items == items
    # The same items planned as they are: deleted, their tokens counted, in one statement.
    with store.engine.connect() as conn, conn.begin() as tx:
        assert _delete_replaced(conn, "a", items[1:4]) == sum(i.tokens or 0 for i in items[1:4])
        tx.rollback()
    assert store.read_window("a").items == items


def test_the_commits_delete_takes_any_number_of_stretches_and_loose_items(
        store: SessionStore) -> None:
    # Stretches beyond the ranges one statement names go into its list of starts: every shape
    # of plan deletes exactly its items, and a changed item anywhere in it is a lost race.
    from sessionfold.store.fold_commit import _MAX_RANGES, Stale, _delete_replaced

    _session(store, steps=40)
    items = store.read_window("a").items
    # Pairs of neighbours with a gap between them: more stretches than the statement has ranges,
    # and loose single items after them.
    picked = [item for n in range(_MAX_RANGES + 3) for item in items[1 + 3 * n:3 + 3 * n]]
    picked += items[40:60:4]
    with store.engine.connect() as conn, conn.begin() as tx:
        assert _delete_replaced(conn, "a", picked) == sum(i.tokens or 0 for i in picked)
        left = [r[0] for r in conn.exec_driver_sql(
            "SELECT start_seq FROM window_items WHERE session_id = 'a' ORDER BY start_seq")]
        tx.rollback()
    assert left == [i.start_seq for i in items if i not in picked]
    for victim in (picked[-3], picked[2 * (_MAX_RANGES + 1)], picked[0]):
        changed = [i.model_copy(update={"version": i.version + 1}) if i is victim else i
                   for i in picked]
        with store.engine.connect() as conn, pytest.raises(Stale, match="changed since"), \
                conn.begin():
            _delete_replaced(conn, "a", changed)
    assert store.read_window("a").items == items
