"""Giving up: the dead letter, the refusal that says why and the pause land together or not at
all (a reader never sees a paused session without its reason)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError
from sessionfold.store import SessionStore
from store_helpers import POLICY, row_counts, turn, user


def _session(store: SessionStore) -> None:
    store.create_session("a", POLICY, system="be brief")
    store.append("a", [user("the task"), *[m for i in range(20) for m in turn(str(i))]])


def test_giving_a_session_up_pauses_it_dead_letters_the_job_and_records_why(
        store: SessionStore) -> None:
    _session(store)
    info = store.get_session("a")
    done = store.give_up("a", "job-7", "abandoned 3 times in a row", 3, {"session_id": "a"},
                         pause=True, incarnation=info.incarnation)
    assert done.paused and done.record.outcome == "refused"
    assert store.get_session("a").paused
    (letter,) = store.dead_letters()
    assert (letter.id, letter.job_id, letter.attempts) == (done.dead_letter_id, "job-7", 3)
    (record,) = store.records("a")
    assert record.id == done.record_id and record.job_id == "job-7"
    assert record.detail == "dead-lettered: abandoned 3 times in a row"
    assert record.measured_tokens == info.current_tokens


def test_giving_up_a_job_that_holds_the_claim_releases_it_and_keeps_the_session_running(
        store: SessionStore) -> None:
    _session(store)
    claim = store.claim("a", "job-1")
    store.give_up("a", "job-1", "delivered 5 times", 5, {}, epoch=claim.epoch,
                  incarnation=claim.incarnation)
    info = store.get_session("a")
    assert info.claimed_by is None and not info.paused
    assert [r.outcome for r in store.records("a")] == ["refused"]


def test_a_failure_while_giving_up_leaves_no_pause_and_no_dead_letter(
        store: SessionStore) -> None:
    _session(store)
    before = row_counts(store)

    @sa.event.listens_for(store.engine, "before_cursor_execute")
    def _fail(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO compaction_records"):
            raise RuntimeError("the database went away mid-way")

    try:
        with pytest.raises(RuntimeError, match="went away"):
            store.give_up("a", "job-7", "abandoned", 3, {}, pause=True)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", _fail)
    assert row_counts(store) == before
    assert not store.get_session("a").paused


def test_giving_up_a_session_that_was_deleted_and_created_again_writes_nothing(
        store: SessionStore) -> None:
    _session(store)
    old = store.claim("a", "job-1")
    store.delete_session("a")
    _session(store)
    before = row_counts(store)
    with pytest.raises(SessionNotFoundError, match="deleted"):
        store.give_up("a", "job-1", "abandoned", 3, {}, pause=True, epoch=old.epoch,
                      incarnation=old.incarnation)
    with pytest.raises(SessionNotFoundError, match="'gone'"):
        store.give_up("gone", "job-1", "abandoned", 3, {}, pause=True)
    assert row_counts(store) == before and not store.get_session("a").paused


def test_bad_give_ups_are_refused_before_anything_is_written(store: SessionStore) -> None:
    _session(store)
    before = row_counts(store)
    for kwargs, match in (({"trigger": "whenever"}, "trigger"), ({"pause": 1}, "pause"),
                          ({"epoch": 1}, "epoch and incarnation")):
        with pytest.raises(InvalidInputError, match=match):
            store.give_up("a", "job-1", "x", 1, {}, **kwargs)
    with pytest.raises(InvalidInputError, match="reason"):
        store.give_up("a", "job-1", "", 1, {})
    assert row_counts(store) == before
