"""Provider usage: the measured size, the calibration, and the fence against stale reports."""

from __future__ import annotations

import pytest
from sessionfold.core.errors import InvalidInputError, UsageUnmeasurableError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import Calibration
from sessionfold.store import SessionStore, UsageReport
from store_helpers import hand_fold, turn, user

POLICY = FoldPolicy(budget_tokens=4000)


def _session(store: SessionStore, steps: int = 3, policy: FoldPolicy = POLICY) -> int:
    store.create_session("a", policy, system="be brief")
    store.append("a", [user("task")])
    for i in range(steps):
        store.append("a", turn(str(i)))
    return store.get_session("a").revision


def test_a_report_sets_the_measured_size_and_calibrates_the_estimate(store: SessionStore) -> None:
    revision = _session(store)
    before = store.get_session("a")
    assert before.measured_tokens is None and before.calibration.samples == 0
    estimate = before.system_tokens + before.window_tokens
    assert before.current_tokens == estimate  # uncalibrated: the plain estimate
    reported = 2 * estimate
    result = store.record_usage("a", {"input_tokens": reported - 300,
                                      "cache_read_input_tokens": 200,
                                      "cache_creation_input_tokens": 100},
                                seq=6, revision=revision)
    assert result.accepted and result.current_tokens == reported
    info = store.get_session("a")
    assert (info.measured_tokens, info.measured_seq, info.measured_revision) == (
        reported, 6, revision)
    assert info.calibration.samples == 1 and info.calibration.a == pytest.approx(2.0)
    # What is appended after the report counts at the calibrated slope on top of it.
    added = store.append("a", turn("more"))
    after = store.get_session("a")
    grown = after.window_tokens - info.window_tokens
    assert after.current_tokens == reported + round(2.0 * grown)
    assert added.revision == after.revision


def test_a_report_on_an_earlier_part_of_the_window_counts_what_came_after(
        store: SessionStore) -> None:
    revision = _session(store)
    items = store.read_window("a").items
    later = sum(i.tokens or 0 for i in items if i.start_seq > 2)
    result = store.record_usage("a", {"input_tokens": 1000}, seq=2, revision=revision)
    assert result.accepted and result.current_tokens == 1000 + round(
        store.get_session("a").calibration.a * later)


def test_older_reports_never_overwrite_newer_ones(store: SessionStore) -> None:
    revision = _session(store)
    assert store.record_usage("a", {"input_tokens": 900}, seq=6, revision=revision).accepted
    older = store.record_usage("a", {"input_tokens": 5}, seq=4, revision=revision)
    assert not older.accepted and store.get_session("a").measured_tokens == 900
    earlier_revision = store.record_usage("a", {"input_tokens": 5}, seq=6,
                                          revision=revision - 1)
    assert not earlier_revision.accepted
    same = store.record_usage("a", {"input_tokens": 950}, seq=6, revision=revision)
    assert same.accepted and store.get_session("a").measured_tokens == 950


def test_a_report_built_before_the_last_fold_is_ignored(store: SessionStore) -> None:
    revision = _session(store, steps=6)
    claim = store.claim("a", "job-1")
    items = store.read_window("a").items
    committed = store.commit_fold("a", hand_fold(items, 1, 7), epoch=claim.epoch,
                                  incarnation=claim.incarnation,
                                  job_id="job-1")
    info = store.get_session("a")
    assert info.fold_revision == committed.revision and info.measured_tokens == 1000
    stale = store.record_usage("a", {"input_tokens": 99_999}, seq=12, revision=revision)
    assert not stale.accepted
    assert store.get_session("a").measured_tokens == 1000
    fresh = store.record_usage("a", {"input_tokens": 1100}, seq=12, revision=committed.revision)
    assert fresh.accepted and store.get_session("a").measured_tokens == 1100


def test_zero_usage_is_refused_unless_the_policy_measures_by_estimate(
        store: SessionStore) -> None:
    revision = _session(store)
    with pytest.raises(UsageUnmeasurableError, match="zero prompt tokens"):
        store.record_usage("a", {"input_tokens": 0}, seq=6, revision=revision)
    store.set_policy("a", FoldPolicy(budget_tokens=4000, measure="estimate"))
    result = store.record_usage("a", {"input_tokens": 0}, seq=6, revision=revision)
    assert not result.accepted and store.get_session("a").measured_tokens is None


@pytest.mark.parametrize("usage", [{"input_tokens": 10**30}, {"prompt_tokens": 10**30},
                                   {"input_tokens": 10**9, "cache_read_input_tokens": 1}])
def test_a_report_no_context_window_could_hold_is_refused_on_every_backend(
        store: SessionStore, usage: dict[str, int]) -> None:
    revision = _session(store)
    with pytest.raises(UsageUnmeasurableError, match="more than any context window holds"):
        store.record_usage("a", usage, seq=6, revision=revision)
    assert store.record_usage_batch([UsageReport(session_id="a", usage=usage, seq=6,
                                                 revision=revision)]) == 0
    assert store.get_session("a").measured_tokens is None


@pytest.mark.parametrize(("seq", "revision", "match"), [
    (7, 4, "names seq 7"), (-1, 4, "seq must be"), (0, 99, "revision 99"),
    (0, "4", "revision must be"), (True, 4, "seq must be"),
])
def test_impossible_reports_are_refused(store: SessionStore, seq: object, revision: object,
                                        match: str) -> None:
    _session(store)
    with pytest.raises(InvalidInputError, match=match):
        store.record_usage("a", {"input_tokens": 10}, seq=seq, revision=revision)  # type: ignore[arg-type]
    assert store.get_session("a").measured_tokens is None


def test_a_batch_keeps_the_latest_report_per_session(store: SessionStore) -> None:
    revision = _session(store)
    store.create_session("b", POLICY)
    store.append("b", [user("task b")])
    reports = [
        UsageReport("a", {"input_tokens": 700}, seq=6, revision=revision),
        UsageReport("b", {"input_tokens": 300}, seq=0, revision=1),
        UsageReport("a", {"input_tokens": 500}, seq=4, revision=revision),  # older: loses
        UsageReport("ghost", {"input_tokens": 1}, seq=0, revision=1),     # deleted: skipped
        UsageReport("b", {"input_tokens": 0}, seq=0, revision=1),         # latest of b: zero
    ]
    assert store.record_usage_batch(reports) == 1
    assert store.get_session("a").measured_tokens == 700
    assert store.get_session("b").measured_tokens is None
    assert store.record_usage_batch([]) == 0
    with pytest.raises(InvalidInputError, match="UsageReport"):
        store.record_usage_batch([("a", {}, 1, 1)])  # type: ignore[list-item]


def test_a_batch_hands_back_the_gates_of_the_sessions_as_it_left_them(
        store: SessionStore) -> None:
    """What a scheduler decides on after its write, with no second read: every named session
    that exists, its size as written (or as it was, when its report was not taken)."""
    revision = _session(store)
    store.create_session("b", FoldPolicy(budget_tokens=4000, trigger_ratio=0.5, target_ratio=0.25))
    store.append("b", [user("task b")])
    store.set_paused("b", True)
    before_b = store.get_session("b")
    written = store.apply_usage_batch([
        UsageReport("a", None, seq=6, revision=revision, prompt_tokens=3210),
        UsageReport("b", None, seq=0, revision=1, prompt_tokens=0),  # zero: not taken
        UsageReport("ghost", None, seq=0, revision=1, prompt_tokens=5),
    ])
    assert written.taken == 1 and set(written.gates) == {"a", "b"}
    a, b = store.get_session("a"), store.get_session("b")
    assert written.gates["a"] == a.gate and a.gate.current_tokens == 3210 == a.current_tokens
    assert written.gates["b"] == b.gate and b.gate.paused
    assert b.gate.current_tokens == before_b.current_tokens
    assert b.gate.trigger_tokens == before_b.gate.trigger_tokens < a.gate.trigger_tokens
    # The row's timestamp is written through its column type (read back aware, not earlier).
    assert a.updated_at >= before_b.updated_at and a.updated_at.tzinfo is not None
    assert store.apply_usage_batch([]).gates == {}


def test_a_report_may_carry_the_prompt_size_already_read_from_the_providers_usage(
        store: SessionStore) -> None:
    # The scheduler passes the number a usage event carries, not a usage dict rebuilt from it.
    revision = _session(store)
    store.create_session("b", POLICY)
    store.append("b", [user("task b")])
    assert store.record_usage_batch([
        UsageReport("a", None, seq=6, revision=revision, prompt_tokens=1234),
        UsageReport("b", None, seq=0, revision=1, prompt_tokens=0),  # zero: not a measurement
    ]) == 1
    assert store.get_session("a").measured_tokens == 1234
    assert store.get_session("b").measured_tokens is None


def test_a_batch_measures_each_session_as_a_single_report_would(store: SessionStore) -> None:
    """One batch over many sessions (one aggregate query) agrees with reports one by one."""
    reports = []
    for i in range(40):
        for twin in ("batch", "single"):
            sid = f"{twin}-{i}"
            store.create_session(sid, POLICY, system="twins")
            store.append(sid, [user("task"), *[m for t in range(i % 5 + 1)
                                               for m in turn(f"{i}.{t}", lines=i % 7 + 1)]])
        info = store.get_session(f"batch-{i}")
        seq = (i * 7) % info.ledger_len  # anywhere in the ledger, often before the tail
        reports.append((i, seq, info.revision, 500 + 13 * i))
    accepted = store.record_usage_batch([
        UsageReport(f"batch-{i}", {"input_tokens": tokens}, seq=seq, revision=revision)
        for i, seq, revision, tokens in reports])
    assert accepted == len(reports)
    for i, seq, revision, tokens in reports:
        single = store.record_usage(f"single-{i}", {"input_tokens": tokens}, seq=seq,
                                    revision=revision)
        batch, alone = store.get_session(f"batch-{i}"), store.get_session(f"single-{i}")
        assert batch.current_tokens == alone.current_tokens == single.current_tokens
        assert batch.calibration == alone.calibration
        assert batch.measured_seq == seq and batch.measured_tokens == tokens
        # And both agree with the window itself: the report plus what came after its seq.
        items = store.read_window(f"batch-{i}").items
        after = sum(item.tokens or 0 for item in items if item.start_seq > seq)
        upto = sum(item.tokens or 0 for item in items if item.start_seq <= seq)
        assert batch.current_tokens == tokens + round(batch.calibration.a * after)
        assert batch.calibration == Calibration().observe(batch.system_tokens + upto, tokens)
