"""Sessions: create, look up, change policy, pause, list, find over budget, delete."""

from __future__ import annotations

import pytest
from sessionfold.core.errors import InvalidInputError, InvalidPolicyError, SessionNotFoundError
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from store_helpers import Clock, plan, row_counts, turn, user

POLICY = FoldPolicy(budget_tokens=4000)


def test_a_created_session_starts_empty_and_reads_back(store: SessionStore) -> None:
    info = store.create_session("agent-1", POLICY, system="You are terse.")
    assert (info.id, info.policy, info.system) == ("agent-1", POLICY, "You are terse.")
    assert (info.revision, info.ledger_len, info.fold_epoch, info.window_tokens) == (0, 0, 0, 0)
    assert info.system_tokens > 0 and info.current_tokens == info.system_tokens
    # Priced (economics="dollars", the default): first visited at half the target, where the
    # first priced visit names the cost-optimal trigger; economics="window" waits for the
    # policy's trigger.
    assert info.trigger_tokens == POLICY.target_tokens // 2 and not info.over_trigger
    assert store.get_session("agent-1") == info
    windowed = store.create_session("agent-2", POLICY.model_copy(update={"economics": "window"}))
    assert windowed.trigger_tokens == POLICY.trigger_tokens
    window = store.read_window("agent-1")
    assert (window.system, window.revision, window.items) == ("You are terse.", 0, [])


def test_creating_an_existing_session_fails_unless_exist_ok(store: SessionStore) -> None:
    store.create_session("a", POLICY, system="first")
    with pytest.raises(InvalidInputError, match="already exists"):
        store.create_session("a", POLICY, system="second")
    again = store.create_session("a", FoldPolicy(budget_tokens=9000), system="x", exist_ok=True)
    assert again.system == "first" and again.policy == POLICY


def test_unknown_sessions_raise_session_not_found_everywhere(store: SessionStore) -> None:
    for call in (
        lambda: store.get_session("nope"),
        lambda: store.read_window("nope"),
        lambda: store.read_ledger("nope"),
        lambda: store.append("nope", [user("hi")]),
        lambda: store.record_usage("nope", {"input_tokens": 5}, seq=0, revision=0),
        lambda: store.claim("nope", "job"),
        lambda: store.set_policy("nope", POLICY),
        lambda: store.set_paused("nope", True),
        lambda: store.spans("nope"),
        lambda: store.records("nope"),
        lambda: store.latched("nope"),
        lambda: store.recover("nope", 0, 0),
        lambda: store.export("nope"),
    ):
        with pytest.raises(SessionNotFoundError, match="nope"):
            call()
    assert store.delete_session("nope") is False
    assert sum(row_counts(store).values()) == 0


def test_session_gates_read_many_at_once_and_leave_out_what_no_session_has(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from sessionfold.store import sessions as session_rows

    for sid in ("a", "b", "c", "d\u00e9"):
        store.create_session(sid, POLICY)
    store.append("c", [user("grow")])  # its current size moves away from the others'
    # Few ids per query here, so the chunking is exercised too.
    monkeypatch.setattr(session_rows, "_IDS_PER_QUERY", 2)
    asked = ["c", "a", "missing", "d\u00e9", "a", "", "x" * 256, "tab\there", "\ud800", None, 7]
    gates = store.session_gates(asked)  # type: ignore[arg-type]
    assert gates == {sid: store.get_session(sid).gate for sid in ("a", "c", "d\u00e9")}
    assert gates["c"].current_tokens > gates["a"].current_tokens
    assert store.session_gates([]) == {} and store.session_gates(["", "\x00"]) == {}
    store.set_paused("a", True)
    assert store.session_gates(["a"])["a"].paused and not gates["a"].paused


@pytest.mark.parametrize("bad", [None, 7, "", "x" * 256, "tab\there"])
def test_bad_session_ids_are_refused(store: SessionStore, bad: object) -> None:
    with pytest.raises(InvalidInputError, match="session id"):
        store.create_session(bad, POLICY)  # type: ignore[arg-type]
    assert sum(row_counts(store).values()) == 0


def test_bad_policies_and_systems_are_refused(store: SessionStore) -> None:
    with pytest.raises(InvalidInputError, match="FoldPolicy"):
        store.create_session("a", {"budget_tokens": 4000})  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="system must be a string"):
        store.create_session("a", POLICY, system=["no"])  # type: ignore[arg-type]
    with pytest.raises(InvalidPolicyError):
        store.create_session("a", FoldPolicy(budget_tokens=10))
    assert sum(row_counts(store).values()) == 0


def test_policy_changes_move_the_trigger(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.set_policy("a", FoldPolicy(budget_tokens=8000, trigger_ratio=0.5, target_ratio=0.25,
                                     economics="window"))
    info = store.get_session("a")
    assert info.policy.budget_tokens == 8000 and info.trigger_tokens == 4000
    # A priced policy opens at half its target again (nothing priced under it yet).
    store.set_policy("a", FoldPolicy(budget_tokens=8000, trigger_ratio=0.5, target_ratio=0.25))
    assert store.get_session("a").trigger_tokens == 1000


def test_over_trigger_finds_unpaused_sessions_past_their_trigger_most_over_first(
        store: SessionStore) -> None:
    small = FoldPolicy(budget_tokens=1000)  # trigger 850
    for sid, steps in (("quiet", 0), ("over", 12), ("far-over", 30), ("paused", 30)):
        store.create_session(sid, small)
        for i in range(steps):
            store.append(sid, turn(f"{sid}{i}"))
    store.set_paused("paused", True)
    found = [s.id for s in store.over_trigger()]
    assert found == ["far-over", "over"]
    assert all(s.current_tokens > s.trigger_tokens for s in store.over_trigger())
    assert [s.id for s in store.over_trigger(limit=1)] == ["far-over"]
    store.set_paused("paused", False)
    assert set(s.id for s in store.over_trigger()) == {"far-over", "over", "paused"}
    store.set_policy("over", FoldPolicy(budget_tokens=100_000))
    assert "over" not in {s.id for s in store.over_trigger()}


def test_the_old_name_over_budget_still_answers_for_one_release_and_warns(
        store: SessionStore) -> None:
    small = FoldPolicy(budget_tokens=1000)
    store.create_session("over", small)
    for i in range(12):
        store.append("over", turn(f"over{i}"))
    with pytest.warns(DeprecationWarning, match="over_trigger"):
        assert store.over_budget() == store.over_trigger()
    info = store.get_session("over")
    with pytest.warns(DeprecationWarning, match="over_trigger"):
        assert info.over_budget is info.over_trigger is True


def test_list_sessions_pages_by_id(store: SessionStore) -> None:
    for sid in ("c", "a", "e", "b", "d"):
        store.create_session(sid, POLICY)
    first = store.list_sessions(limit=2)
    assert [s.id for s in first] == ["a", "b"]
    rest = store.list_sessions(limit=10, after=first[-1].id)
    assert [s.id for s in rest] == ["c", "d", "e"]
    with pytest.raises(InvalidInputError, match="limit"):
        store.list_sessions(limit=0)


def _visit(store: SessionStore, sid: str, job_id: str) -> str:
    """One fold visit of ``sid`` planned and committed as a worker would; its outcome."""
    claim = store.claim(sid, job_id)
    store.commit_fold(sid, plan(store, sid), epoch=claim.epoch, job_id=job_id,
                      incarnation=claim.incarnation)
    return store.records(sid)[-1].outcome


def test_last_fold_times_are_each_sessions_newest_committed_fold(store: SessionStore,
                                                                 clock: Clock) -> None:
    policy = FoldPolicy(budget_tokens=2000, keep_recent_turns=2)
    store.create_session("twice", policy)
    store.create_session("never", policy)
    store.append("twice", [user("keep the build green"), *[m for i in range(20)
                                                           for m in turn(f"a{i}")]])
    store.append("never", [user("a task too small to fold")])
    assert _visit(store, "twice", "job-1") == "folded"
    clock.advance(60)
    store.append("twice", [m for i in range(20) for m in turn(f"b{i}")])
    assert _visit(store, "twice", "job-2") == "folded"
    second = clock.now
    clock.advance(60)
    # A later visit that folds nothing is no fold: it leaves the time where it was.
    assert _visit(store, "twice", "job-3") == "nothing-to-fold"
    assert _visit(store, "never", "job-4") == "nothing-to-fold"
    assert store.last_fold_times(["twice", "never", "absent", "", "x" * 300]) == {
        "twice": second}
    assert store.last_fold_times([]) == {}


def test_delete_removes_the_session_and_everything_it_holds(store: SessionStore) -> None:
    store.create_session("gone", FoldPolicy(budget_tokens=1000, keep_recent_turns=1))
    store.create_session("kept", POLICY)
    store.append("gone", [user("task")], key="k1")
    for i in range(10):
        store.append("gone", turn(str(i)))
    store.append("kept", [user("hello")])
    from store_helpers import plan
    claim = store.claim("gone", "job-1")
    store.commit_fold("gone", plan(store, "gone"), epoch=claim.epoch,
                      incarnation=claim.incarnation, job_id="job-1")
    assert store.spans("gone") and store.records("gone")
    store.dead_letter("job-9", "gone", "gave up", 3, {"why": "test"})
    before = row_counts(store)
    assert store.delete_session("gone") is True
    after = row_counts(store)
    assert after["sessions"] == 1 and after["ledger"] == 1 and after["window_items"] == 1
    assert after["folds"] == after["compaction_records"] == after["append_keys"] == 0
    # Its dead letters go with it (issue 14: a deleted session leaves no dead rows).
    assert before["dead_letters"] == 1 and after["dead_letters"] == 0
    with pytest.raises(SessionNotFoundError):
        store.get_session("gone")
    assert store.read_window("kept").messages()[0].content == "hello"
