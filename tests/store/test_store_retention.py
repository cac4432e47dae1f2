"""Retention (issue 14): append keys, no-op visit records and dead letters are pruned by their
rules, in short batches, alike on SQLite and PostgreSQL; what the law keeps (every fold's record,
a record a span names, a session's newest visits) never is; a deleted session leaves no row
anywhere, and a discarding fold leaves the folded text nowhere but in its summary."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import CompactionRecord, Refusal
from sessionfold.runtime.settings import Settings
from sessionfold.store import PruneReport, RetentionRules, SessionStore
from sessionfold.store.schema import metadata
from store_helpers import POLICY, Clock, plan, row_counts, turn, user

HOUR = 3600.0
DAY = 24 * HOUR


def _visit(outcome: str = "nothing-to-fold", detail: str = "") -> CompactionRecord:
    return CompactionRecord(trigger="threshold", outcome=outcome,  # type: ignore[arg-type]
                            budget_tokens=2000, target_tokens=1200, measured_tokens=2500,
                            tokens_after=2500, detail=detail)


def _no_op_visits(store: SessionStore, sid: str, n: int, tag: str = "") -> list[int]:
    """``n`` visits that changed nothing, cycling through the three no-op outcomes."""
    outcomes = ("nothing-to-fold", "refused", "stale")
    return [store.record_visit(sid, _visit(outcomes[i % 3], f"{tag}{i}")) for i in range(n)]


def _folded_session(store: SessionStore, sid: str, *, job_id: str = "job-fold",
                    policy: FoldPolicy = POLICY) -> None:
    store.create_session(sid, policy)
    store.append(sid, [user("the task"), *[m for i in range(20) for m in turn(f"{sid}{i}")]])
    claim = store.claim(sid, job_id)
    store.commit_fold(sid, plan(store, sid), epoch=claim.epoch, incarnation=claim.incarnation,
                      job_id=job_id)
    assert store.spans(sid)


def _record_ids(store: SessionStore, sid: str) -> list[int]:
    return [r.id for r in store.records(sid)]


@contextmanager
def _transactions(store: SessionStore) -> Iterator[list[list[int]]]:
    """The DELETEs run, grouped by the transaction that ran them: one list of rowcounts per
    transaction that deleted anything."""
    groups: list[list[int]] = []
    current: list[int] = []

    def begin(conn: Any) -> None:
        current.clear()

    def deleted(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            current.append(cursor.rowcount)

    def commit(conn: Any) -> None:
        if current:
            groups.append(list(current))

    sa.event.listen(store.engine, "begin", begin)
    sa.event.listen(store.engine, "after_cursor_execute", deleted)
    sa.event.listen(store.engine, "commit", commit)
    try:
        yield groups
    finally:
        sa.event.remove(store.engine, "begin", begin)
        sa.event.remove(store.engine, "after_cursor_execute", deleted)
        sa.event.remove(store.engine, "commit", commit)


# --- append keys ---------------------------------------------------------------------------

def test_append_keys_past_their_age_are_pruned_and_a_retry_after_that_appends_again(
        store: SessionStore, clock: Clock) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("first")], key="k-old")
    clock.advance(DAY + 1)
    store.append("a", [user("second")], key="k-new")
    report = store.prune(RetentionRules(append_keys_s=DAY))
    assert (report.append_keys, report.visit_records, report.dead_letters) == (1, 0, 0)
    assert report.complete and not report.dry_run
    # Within the window a retry is a no-op; past it, it cannot be recognised any more.
    assert store.append("a", [user("second")], key="k-new").duplicate
    late = store.append("a", [user("first")], key="k-old")
    assert not late.duplicate and late.first_seq == 2
    assert [e.message.content for e in store.read_ledger("a") if e.message] == \
        ["first", "second", "first"]


def test_an_append_key_younger_than_the_age_is_kept(store: SessionStore, clock: Clock) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("first")], key="k")
    clock.advance(DAY - 1)
    assert store.prune(RetentionRules(append_keys_s=DAY)).append_keys == 0
    assert store.append("a", [user("first")], key="k").duplicate


# --- visit records -------------------------------------------------------------------------

def test_no_op_visits_beyond_the_newest_n_and_older_than_the_age_are_pruned(
        store: SessionStore, clock: Clock) -> None:
    _folded_session(store, "a")
    [folded] = store.records("a")
    old = _no_op_visits(store, "a", 20, "old")
    clock.advance(2 * HOUR)
    young = _no_op_visits(store, "a", 3, "young")
    report = store.prune(RetentionRules(visit_records=5, visit_records_s=HOUR))
    # Kept: the fold's record, the newest five no-op visits (three young, two old).
    assert report.visit_records == 18
    assert _record_ids(store, "a") == [folded.id, *old[-2:], *young]


def test_no_op_visits_beyond_the_count_but_younger_than_the_age_are_kept(
        store: SessionStore, clock: Clock) -> None:
    store.create_session("a", POLICY)
    ids = _no_op_visits(store, "a", 12)
    clock.advance(HOUR - 1)
    assert store.prune(RetentionRules(visit_records=2, visit_records_s=HOUR)).visit_records == 0
    clock.advance(2)
    assert store.prune(RetentionRules(visit_records=2, visit_records_s=HOUR)).visit_records == 10
    assert _record_ids(store, "a") == ids[-2:]


def test_the_newest_visit_record_is_always_kept_and_folded_records_never_pruned(
        store: SessionStore, clock: Clock) -> None:
    store.create_session("a", POLICY)
    folded = CompactionRecord(trigger="threshold", outcome="folded", budget_tokens=2000,
                              target_tokens=1200, measured_tokens=2500, tokens_after=1000,
                              folded=((1, 2),))
    ids = []
    for i in range(10):
        ids.append(store.record_visit("a", folded))
        ids.extend(_no_op_visits(store, "a", 2, f"r{i}-"))
    clock.advance(30 * DAY)
    report = store.prune(RetentionRules(visit_records=1, visit_records_s=0))
    assert report.visit_records == 19
    kept = store.records("a")
    assert [r.outcome for r in kept] == ["folded"] * 10 + ["refused"]
    assert kept[-1].id == ids[-1]
    assert store.get_session("a").last_visit_outcome == "refused"  # the row it describes stays


def test_a_no_op_record_a_span_names_is_never_pruned(store: SessionStore, clock: Clock) -> None:
    _folded_session(store, "a", job_id="job-7")
    [span] = store.spans("a")
    # The same job records a visit at the revision its fold wrote: that record and the span
    # name each other (job id and revision), so the span's record stays whatever its outcome.
    named = store.record_visit("a", _visit("nothing-to-fold", "after the fold"), job_id="job-7")
    assert store.records("a")[-1].revision == span.revision
    _no_op_visits(store, "a", 6)
    clock.advance(DAY)
    report = store.prune(RetentionRules(visit_records=1, visit_records_s=0))
    assert report.visit_records == 5
    kept = store.records("a")
    assert named in [r.id for r in kept]
    assert [r.outcome for r in kept].count("folded") == 1
    assert len(kept) == 3  # the fold's, the span-named one, the newest


def test_records_are_counted_per_session(store: SessionStore, clock: Clock) -> None:
    for sid in ("a", "b", "c"):
        store.create_session(sid, POLICY)
    _no_op_visits(store, "a", 8)
    _no_op_visits(store, "b", 3)
    _no_op_visits(store, "c", 4)
    clock.advance(DAY)
    report = store.prune(RetentionRules(visit_records=3, visit_records_s=0))
    assert report.visit_records == 5 + 0 + 1
    assert [len(store.records(s)) for s in ("a", "b", "c")] == [3, 3, 3]


def test_refusals_stay_latched_when_their_records_are_pruned(
        store: SessionStore, clock: Clock) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("task"), *turn("1")])
    refused = CompactionRecord(
        trigger="threshold", outcome="refused", budget_tokens=2000, target_tokens=1200,
        measured_tokens=2500, tokens_after=2500,
        refusals=(Refusal(reason="replacement-not-smaller", start_seq=1, end_seq=2,
                          fingerprint="fp-1"),))
    store.record_visit("a", refused)
    _no_op_visits(store, "a", 2)
    clock.advance(DAY)
    assert store.prune(RetentionRules(visit_records=1, visit_records_s=0)).visit_records == 2
    assert store.latched("a") == {"fp-1"}


# --- dead letters --------------------------------------------------------------------------

def test_dead_letters_past_their_age_and_of_deleted_sessions_are_pruned(
        store: SessionStore, clock: Clock) -> None:
    store.create_session("a", POLICY)
    store.dead_letter("job-old", "a", "retries exhausted", 5, {"n": 1})
    clock.advance(10 * DAY)
    store.dead_letter("job-new", "a", "retries exhausted", 5, {"n": 2})
    # A worker that gave up after its session was deleted.
    store.dead_letter("job-ghost", "ghost", "retries exhausted", 5, {"n": 3})
    report = store.prune(RetentionRules(dead_letters_s=5 * DAY))
    assert report.dead_letters == 2
    assert [d.job_id for d in store.dead_letters()] == ["job-new"]


# --- batches, budget, dry run --------------------------------------------------------------

def _old_rows(store: SessionStore, clock: Clock) -> None:
    """25 old append keys over 3 sessions, 3 × 6 prunable visit records, 5 old dead letters
    (one of them of a session that does not exist: counted once, by the age rule)."""
    for s in range(3):
        sid = f"s{s}"
        store.create_session(sid, POLICY)
        for i in range(9 if s < 2 else 7):
            store.append(sid, [user(f"m{i}")], key=f"{sid}-k{i}")
        _no_op_visits(store, sid, 7)
        store.dead_letter(f"job-{s}", sid, "gave up", 5, {})
    store.dead_letter("job-x", "s0", "gave up", 5, {})
    store.dead_letter("job-ghost", "ghost", "gave up", 5, {})  # old, and of no session
    clock.advance(40 * DAY)


RULES = RetentionRules(visit_records=1, visit_records_s=DAY)


def test_prune_deletes_in_transactions_of_at_most_batch_rows(
        store: SessionStore, clock: Clock) -> None:
    _old_rows(store, clock)
    with _transactions(store) as groups:
        report = store.prune(RULES, batch=4)
    assert (report.append_keys, report.visit_records, report.dead_letters) == (25, 18, 5)
    assert report.complete and report.total == 48
    # Every transaction ran one DELETE of at most 4 rows, and a full one is followed by another
    # transaction: 25 keys as 4+4+4+4+4+4+1, 5 old letters as 4+1, no orphan left, 6 records
    # per session as 4+2.
    assert [g[0] for g in groups] == [4, 4, 4, 4, 4, 4, 1, 4, 1, 0, 4, 2, 4, 2, 4, 2]
    assert all(len(g) == 1 for g in groups)
    after = row_counts(store)
    assert after["append_keys"] == 0 and after["dead_letters"] == 0
    assert after["compaction_records"] == 3


def test_a_pass_stopped_by_max_batches_carries_on_where_it_stopped(
        store: SessionStore, clock: Clock) -> None:
    _old_rows(store, clock)
    reports: list[PruneReport] = []
    resume: str | None = None
    while not (reports and reports[-1].complete):
        reports.append(store.prune(RULES, batch=4, max_batches=3, resume=resume))
        resume = reports[-1].resume
        assert reports[-1].batches <= 3
        assert len(reports) < 30, "the pass never finished"
    assert sum(r.append_keys for r in reports) == 25
    assert sum(r.visit_records for r in reports) == 18
    assert sum(r.dead_letters for r in reports) == 5
    # Three transactions a call: keys 4+4+4 | 4+4+4 | 1, then the letters 4+1 | orphans 0,
    # a page of sessions, s0's first 4 | the page again, s0's last 2, s1's first 4 | …
    assert [r.resume for r in reports] == ["append_keys:", "append_keys:", "orphans:",
                                           "records:", "records:s0", "records:s1", None]
    assert [r.batches for r in reports] == [3, 3, 3, 3, 3, 3, 2]
    assert [len(store.records(s)) for s in ("s0", "s1", "s2")] == [1, 1, 1]


def test_a_dry_run_counts_what_a_prune_would_delete_and_deletes_nothing(
        store: SessionStore, clock: Clock) -> None:
    _old_rows(store, clock)
    before = row_counts(store)
    with _transactions(store) as groups:
        dry = store.prune(RULES, batch=4, dry_run=True)
    assert groups == [] and row_counts(store) == before
    assert dry.dry_run and dry.complete
    real = store.prune(RULES, batch=4)
    assert (dry.append_keys, dry.visit_records, dry.dead_letters) == \
        (real.append_keys, real.visit_records, real.dead_letters) == (25, 18, 5)
    again = store.prune(RULES)
    assert again.total == 0 and again.complete


def test_prune_measures_ages_from_the_now_it_is_given(store: SessionStore, clock: Clock) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("x")], key="k")
    stamped: datetime = clock.now
    assert store.prune(RetentionRules(append_keys_s=HOUR), now=stamped).append_keys == 0
    later = stamped.replace(hour=stamped.hour + 2)
    assert store.prune(RetentionRules(append_keys_s=HOUR), now=later).append_keys == 1


def test_prune_beside_live_writers_and_deletes_keeps_what_it_must(
        store: SessionStore, clock: Clock, store_url: str) -> None:
    for s in range(6):
        store.create_session(f"s{s}", POLICY)
        for i in range(10):
            store.append(f"s{s}", [user(f"old {i}")], key=f"old-{i}")
        _no_op_visits(store, f"s{s}", 12)
    clock.advance(2 * DAY)
    errors: list[BaseException] = []

    def live() -> None:  # an agent and its worker, on a store of their own
        try:
            with SessionStore.from_url(store_url, clock=clock) as other:
                for i in range(30):
                    other.append("s0", [user(f"live {i}")], key=f"live-{i}")
                    other.record_visit("s0", _visit("nothing-to-fold", f"live {i}"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    def deletes() -> None:
        try:
            with SessionStore.from_url(store_url, clock=clock) as other:
                for sid in ("s3", "s4", "s5"):
                    assert other.delete_session(sid)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=live), threading.Thread(target=deletes)]
    for t in threads:
        t.start()
    rules = RetentionRules(visit_records=5, visit_records_s=DAY)
    while any(t.is_alive() for t in threads):
        store.prune(rules, batch=3)
    for t in threads:
        t.join()
    assert errors == []
    store.prune(rules, batch=3)
    # Every live visit is younger than a day: all kept; the old ones, beyond the newest five,
    # went. The live keys still deduplicate.
    assert [r.detail for r in store.records("s0")] == [f"live {i}" for i in range(30)]
    assert [len(store.records(s)) for s in ("s1", "s2")] == [5, 5]
    assert store.append("s0", [user("live 29")], key="live-29").duplicate
    assert row_counts(store)["append_keys"] == 30
    for sid in ("s3", "s4", "s5"):
        assert set(_session_rows(store, sid).values()) == {0}


# --- bad rules -----------------------------------------------------------------------------

@pytest.mark.parametrize(("values", "message"), [
    ({"visit_records": 0}, "visit_records must be a whole number >= 1"),
    ({"visit_records": 2.5}, "visit_records"),
    ({"append_keys_s": 0}, "append_keys_s must be a positive number of seconds"),
    ({"dead_letters_s": float("nan")}, "dead_letters_s"),
    ({"visit_records_s": -1}, "visit_records_s must be a finite number of seconds >= 0"),
    ({"append_keys_s": True}, "append_keys_s"),
])
def test_bad_rules_are_refused_naming_the_rule(values: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        RetentionRules(**values)


def test_bad_prune_arguments_are_refused(store: SessionStore) -> None:
    with pytest.raises(InvalidInputError, match="batch is a whole number from 1 to 10000"):
        store.prune(batch=0)
    with pytest.raises(InvalidInputError, match="max_batches must be an integer >= 2"):
        store.prune(max_batches=1)
    for bad in ("x", "records", "append_keys:agent-1", 7):
        with pytest.raises(InvalidInputError, match="resume must be the cursor"):
            store.prune(resume=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="timezone-aware"):
        store.prune(now=datetime(2030, 1, 1))
    with pytest.raises(InvalidInputError, match="RetentionRules"):
        store.prune({"append_keys_s": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("SESSIONFOLD_RETAIN_VISIT_RECORDS", "0", "greater than or equal to 1"),
    ("SESSIONFOLD_RETAIN_APPEND_KEYS_S", "-5", "greater than 0"),
    ("SESSIONFOLD_RETAIN_DEAD_LETTERS_S", "inf", "finite number"),
    ("SESSIONFOLD_RETAIN_VISIT_RECORDS_S", "soon", "valid number"),
    ("SESSIONFOLD_PRUNE_BATCH", "20000", "less than or equal to 10000"),
    ("SESSIONFOLD_PRUNE_INTERVAL_S", "-1", "greater than or equal to 0"),
])
def test_a_bad_retention_setting_is_refused_naming_its_variable(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidInputError, match=f"{variable}: .*{message}"):
        Settings()


def test_the_settings_name_the_rules_and_default_to_the_stores() -> None:
    assert Settings().retention_rules() == RetentionRules()
    rules = Settings(retain_append_keys_s=60, retain_visit_records=7, retain_visit_records_s=0,
                     retain_dead_letters_s=120).retention_rules()
    assert rules == RetentionRules(append_keys_s=60, visit_records=7, visit_records_s=0,
                                   dead_letters_s=120)


# --- deleted and discarded sessions leave no dead rows -------------------------------------

#: Tables that hold no session's rows. A new table is either keyed by session (a
#: ``session_id`` column) or named here: the test below makes that choice explicit.
SESSIONLESS = {"api_keys"}


def _session_rows(store: SessionStore, sid: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    with store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            if table.name == "sessions":
                column = table.c.id
            elif "session_id" in table.c:
                column = table.c.session_id
            else:
                assert table.name in SESSIONLESS, (
                    f"table {table.name!r} has no session_id: delete_session cannot be checked "
                    "on it; key it by session or add it to SESSIONLESS")
                continue
            counts[table.name] = conn.execute(
                sa.select(sa.func.count()).select_from(table).where(column == sid)).scalar_one()
    return counts


def _fts_hits(store: SessionStore, word: str) -> int:
    """Rows of the SQLite FTS5 index (shared by all sessions) matching ``word``; PostgreSQL's
    tsvector is a column of ledger_chunks, counted with its rows."""
    if store.engine.dialect.name != "sqlite":
        return 0
    with store.engine.connect() as conn:
        return int(conn.exec_driver_sql(
            "SELECT count(*) FROM ledger_chunks_fts WHERE ledger_chunks_fts MATCH ?",
            (word,)).scalar_one())


def _everything(store: SessionStore, sid: str) -> None:
    """A session with a row in every table keyed by session."""
    _folded_session(store, sid, job_id=f"{sid}-fold")
    store.append(sid, [user(f"zanzibarword from {sid}")], key=f"{sid}-key")
    store.record_visit(sid, CompactionRecord(
        trigger="threshold", outcome="refused", budget_tokens=2000, target_tokens=1200,
        measured_tokens=2500, tokens_after=2500,
        refusals=(Refusal(reason="replacement-not-smaller", start_seq=1, end_seq=2,
                          fingerprint=f"{sid}-fp"),)))
    claim = store.claim(sid, f"{sid}-doomed")
    store.give_up(sid, f"{sid}-doomed", "worker lost", 5, {"session": sid},
                  epoch=claim.epoch, incarnation=claim.incarnation)


def test_deleting_a_session_leaves_no_row_of_it_in_any_table(store: SessionStore) -> None:
    _everything(store, "gone")
    _everything(store, "kept")
    held = _session_rows(store, "gone")
    empty = sorted(t for t, n in held.items() if n == 0)
    assert empty == [], f"populate {empty} in _everything, or the check below proves nothing"
    if store.engine.dialect.name == "sqlite":
        assert _fts_hits(store, "zanzibarword") == 2
    assert store.delete_session("gone") is True
    assert _session_rows(store, "gone") == dict.fromkeys(held, 0)
    assert _session_rows(store, "kept") == held  # the other session is untouched
    if store.engine.dialect.name == "sqlite":
        assert _fts_hits(store, "zanzibarword") == 1
    assert store.prune().total == 0  # nothing of it was left for retention to find


def _row_text(row: sa.Row[Any]) -> str:
    return json.dumps([v if isinstance(v, str | int | float | bool | type(None) | dict | list)
                       else str(v) for v in row], ensure_ascii=False)


def test_a_discarding_fold_leaves_the_folded_text_nowhere_but_in_its_summary(
        store: SessionStore) -> None:
    policy = FoldPolicy(budget_tokens=2000, keep_recent_turns=2, retain="discard")
    store.create_session("d", policy)
    messages = [user("the task")]
    for i in range(20):
        for m in turn(f"step{i}"):
            messages.append(m)
    # One word per ledger seq, in the text of the message at that seq.
    for seq, m in enumerate(messages):
        if isinstance(m["content"], str):
            m["content"] += f" qmark{seq:03d}q"
        else:
            block = m["content"][-1]
            if block["type"] == "tool_result":
                block["content"] += f" qmark{seq:03d}q"
            else:
                m["content"].insert(0, {"type": "text", "text": f"qmark{seq:03d}q"})
    store.append("d", messages, key="all")
    claim = store.claim("d", "job-1")
    store.commit_fold("d", plan(store, "d"), epoch=claim.epoch, incarnation=claim.incarnation,
                      job_id="job-1")
    [span] = store.spans("d")
    assert not span.retained
    folded = {f"qmark{seq:03d}q" for seq in range(span.start_seq, span.end_seq + 1)}
    kept = {f"qmark{seq:03d}q" for seq in range(span.end_seq + 1, len(messages))}
    found: dict[str, set[str]] = {}
    still: dict[str, set[str]] = {}
    with store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(sa.select(table)):
                text = _row_text(row)
                still.setdefault(table.name, set()).update(w for w in kept if w in text)
                if table.name == "window_items" and row.kind in ("summary", "notice"):
                    continue  # the summary is what a fold keeps of the span, by design
                hits = {w for w in folded if w in text}
                if hits:
                    found.setdefault(table.name, set()).update(hits)
    assert found == {}, f"discarded text still stored in {sorted(found)}"
    # The scan does see text where it is: the unfolded words are in the ledger, its index
    # and the window.
    assert still["ledger"] == still["ledger_chunks"] == still["window_items"] == kept
    assert all(_fts_hits(store, word) == 0 for word in folded)
    assert all(store.search("d", word) == [] for word in sorted(folded)[:3])
    # What was not folded is still stored and found.
    assert store.search("d", sorted(kept)[-1])
