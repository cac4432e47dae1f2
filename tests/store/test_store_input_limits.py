"""What the store refuses at the door, and that everything it accepts reads back, on both backends.

Nothing an append accepted may make a session unreadable later: a tool input nested to the limit
reads back through every reader (window, ledger, recover, export, inspect); one level more is
refused at append with the message and the field named, and nothing is written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from sessionfold.core.errors import (
    InvalidInputError,
    InvalidMessageError,
    InvalidPolicyError,
    SessionNotFoundError,
    ToolPairingError,
)
from sessionfold.core.messages import MAX_NESTING_DEPTH, Message, parse_message
from sessionfold.core.policy import MAX_POLICY_INT, FoldPolicy
from sessionfold.store import SCHEMA_REVISION, SessionStore
from sessionfold.store.codec import tool_use_id_digest
from sessionfold.store.migrate import alembic_config
from sessionfold.store.schema import ledger, tool_use_ids, window_items
from store_helpers import check_window, ledger_json, row_counts, user

POLICY = FoldPolicy(budget_tokens=4000)  # max item: 1000 tokens


def nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


def call(call_id: str, tool_input: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "text", "text": "Running it."},
        {"type": "tool_use", "id": call_id, "name": "bash", "input": tool_input}]}


def result(call_id: str, output: str = "ok") -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call_id, "content": output}]}


# --- nesting --------------------------------------------------------------------------------------

def test_a_tool_input_nested_to_the_limit_reads_back_through_every_reader(
        store: SessionStore) -> None:
    store.create_session("deep", POLICY)
    deep = call("t1", nested(MAX_NESTING_DEPTH))
    store.append("deep", [user("task"), deep, result("t1")])
    expected = Message.model_validate(deep)
    assert store.read_window("deep").messages()[1] == expected
    assert [e.message for e in store.read_ledger("deep")][1] == expected
    assert store.recover("deep", 1, 1) == [expected]
    exported = store.export("deep")
    assert exported["ledger"][1]["message"] == deep
    assert json.loads(json.dumps(exported)) == exported
    assert "#1" in store.inspect("deep", full=True)
    check_window(store, "deep")


def test_a_row_nested_deeper_by_an_earlier_version_still_reads_back(
        store: SessionStore) -> None:
    """Before the limit, append took inputs nested ~200–255 levels, which pydantic-core cannot
    decode: such rows, already in a database, must stay readable."""
    store.create_session("old", POLICY)
    store.append("old", [user("task"), call("t1", {"k": "leaf"}), result("t1")])
    deep = call("t1", nested(240))
    with store.engine.begin() as conn:  # what an earlier version wrote, bypassing today's check
        for table in (ledger, window_items):
            key = table.c.seq if table is ledger else table.c.start_seq
            conn.execute(table.update().where(table.c.session_id == "old", key == 1)
                         .values(message=deep))
    store.item_cache.clear()
    assert store.read_window("old").messages()[1].to_json() == deep
    assert store.read_ledger("old")[1].message.to_json() == deep
    assert store.recover("old", 1, 1)[0].to_json() == deep
    assert store.export("old")["ledger"][1]["message"] == deep


@pytest.mark.parametrize("levels", [MAX_NESTING_DEPTH + 1, 230, 300])
def test_a_tool_input_nested_past_the_limit_is_refused_and_nothing_is_written(
        store: SessionStore, levels: int) -> None:
    store.create_session("deep", POLICY)
    store.append("deep", [user("task")])
    before = row_counts(store)
    with pytest.raises(InvalidMessageError) as info:
        store.append("deep", [call("t1", nested(levels)), result("t1")])
    assert info.value.index == 0
    assert info.value.field is not None and info.value.field.startswith("content[1].input")
    assert row_counts(store) == before
    assert len(store.read_window("deep").items) == 1


# --- text the databases cannot hold ---------------------------------------------------------------

def test_a_lone_surrogate_in_a_session_id_is_refused_on_every_call(store: SessionStore) -> None:
    with pytest.raises(InvalidInputError, match="surrogate"):
        store.create_session("agent-\ud800", POLICY)
    with pytest.raises(InvalidInputError, match="surrogate"):
        store.append("agent-\udfff", [user("x")])
    with pytest.raises(InvalidInputError, match="surrogate"):
        store.get_session("agent-\ud800")
    assert row_counts(store)["sessions"] == 0


def test_a_lone_surrogate_in_a_message_is_refused_naming_it(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    with pytest.raises(InvalidMessageError) as info:
        store.append("a", [user("fine"), {"role": "assistant", "content": "bad \ud800"}])
    assert (info.value.index, info.value.field) == (1, "content")
    assert row_counts(store)["ledger"] == 0


@pytest.mark.parametrize("key", ["turn-\ud800", "turn-\x00", "turn\n1"])
def test_an_append_key_the_databases_cannot_hold_is_refused(store: SessionStore,
                                                             key: str) -> None:
    store.create_session("a", POLICY)
    with pytest.raises(InvalidInputError, match="append key"):
        store.append("a", [user("x")], key=key)
    assert row_counts(store)["ledger"] == 0


def test_nul_in_a_system_prompt_is_refused_the_same_on_both_backends(
        store: SessionStore) -> None:
    with pytest.raises(InvalidInputError, match="NUL"):
        store.create_session("a", POLICY, system="You are\x00 an agent.")
    with pytest.raises(InvalidInputError, match="surrogate"):
        store.create_session("a", POLICY, system="You are \ud800 an agent.")
    with pytest.raises(SessionNotFoundError):
        store.get_session("a")


def test_nul_in_message_text_and_tool_input_round_trips_on_both_backends(
        store: SessionStore) -> None:
    store.create_session("a", POLICY)
    messages = [user("bytes: \x00\x01"), call("t1", {"data": "\x00"}), result("t1", "out\x00")]
    store.append("a", messages)
    assert ledger_json(store, "a") == messages
    assert [m.to_json() for m in store.read_window("a").messages()] == messages


# --- policy ranges --------------------------------------------------------------------------------

def test_the_largest_policy_values_are_stored_and_read_back(store: SessionStore) -> None:
    big = FoldPolicy(budget_tokens=MAX_POLICY_INT, keep_recent_turns=MAX_POLICY_INT)
    store.create_session("a", big)
    assert store.get_session("a").policy == big
    store.set_policy("a", big)
    store.append("a", [user("task")])
    assert store.over_trigger() == []


def test_a_budget_past_the_range_never_reaches_the_database(store: SessionStore) -> None:
    with pytest.raises(InvalidPolicyError, match="budget_tokens"):
        store.create_session("a", FoldPolicy(budget_tokens=10**30))
    assert row_counts(store)["sessions"] == 0


# --- tool ids -------------------------------------------------------------------------------------

def test_a_tool_use_id_used_before_in_the_session_is_refused_naming_its_seq(
        store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("task"), call("t1", {}), result("t1")])
    before = row_counts(store)
    with pytest.raises(ToolPairingError) as info:
        store.append("a", [call("t2", {}), result("t2"), call("t1", {})])
    assert (info.value.index, info.value.field) == (2, "content[1].id")
    assert "'t1'" in str(info.value) and "#1" in str(info.value)
    assert row_counts(store) == before


def test_a_keyed_retry_of_a_turn_is_not_a_duplicate_tool_id(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("task")])
    first = store.append("a", [call("t1", {}), result("t1")], key="turn-1")
    again = store.append("a", [call("t1", {}), result("t1")], key="turn-1")
    assert again.duplicate and (again.first_seq, again.last_seq) == (first.first_seq,
                                                                      first.last_seq)


def test_a_deleted_session_frees_its_tool_use_ids(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("task"), call("t1", {}), result("t1")])
    assert store.delete_session("a")
    store.create_session("a", POLICY)
    store.append("a", [user("task"), call("t1", {}), result("t1")])
    assert store.get_session("a").ledger_len == 3


def test_tool_use_ids_are_per_session(store: SessionStore) -> None:
    for sid in ("a", "b"):
        store.create_session(sid, POLICY)
        store.append(sid, [user("task"), call("t1", {}), result("t1")])
    assert store.get_session("b").ledger_len == 3


# --- empty text, and one message for a list -------------------------------------------------------

def test_an_empty_text_block_is_dropped_and_an_empty_message_refused(
        store: SessionStore) -> None:
    store.create_session("a", POLICY)
    sdk_shaped = {"role": "assistant", "content": [
        {"type": "text", "text": ""}, {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]}
    store.append("a", [user("task"), sdk_shaped, result("t1")])
    assert ledger_json(store, "a")[1] == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]}
    with pytest.raises(InvalidMessageError) as info:
        store.append("a", [{"role": "assistant", "content": [{"type": "text", "text": " "}]}])
    assert info.value.index == 0 and "empty" in str(info.value)
    assert store.get_session("a").ledger_len == 3


def test_one_message_given_to_append_is_refused_with_how_to_pass_it(
        store: SessionStore) -> None:
    store.create_session("a", POLICY)
    with pytest.raises(InvalidMessageError, match=r"one message.*\[message\]"):
        store.append("a", {"role": "user", "content": "hi"})  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match=r"'role'.*\[message\]"):
        store.append("a", list({"role": "user", "content": "hi"}))  # type: ignore[arg-type]
    assert row_counts(store)["ledger"] == 0


# --- oversized user text --------------------------------------------------------------------------

def test_an_oversized_user_text_is_clipped_in_the_window_and_kept_whole_in_the_ledger(
        store: SessionStore) -> None:
    task = "TASK START: migrate the billing service.\n" + "\n".join(
        f"spec line {i}: " + "requirement " * 10 for i in range(3000)) + "\nTASK END: ship it."
    store.create_session("a", POLICY)
    store.append("a", [user(task), {"role": "assistant", "content": "On it."}])
    item = store.read_window("a").items[0]
    assert item.edits == ("clipped",)
    assert item.tokens is not None and item.tokens <= POLICY.max_item_tokens + 50
    text = item.message.content
    assert isinstance(text, str)
    # Head and tail: the model still reads how the task begins and ends.
    assert text.startswith("TASK START") and text.endswith("TASK END: ship it.")
    assert f"{len(task):,} characters" in text and "ledger #0" in text
    assert store.recover("a", 0, 0) == [parse_message(user(task))]
    check_window(store, "a")


def test_an_oversized_text_block_beside_a_tool_result_is_clipped_too(
        store: SessionStore) -> None:
    store.create_session("a", POLICY)
    note = "NOTE " + "x y z " * 6000 + " END"
    answer = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "small"},
        {"type": "text", "text": note}]}
    store.append("a", [user("task"), call("t1", {}), answer])
    item = store.read_window("a").items[2]
    assert item.edits == ("clipped",)
    blocks = item.message.blocks()
    assert blocks[0] == parse_message(answer).blocks()[0]
    clipped = getattr(blocks[1], "text", "")
    assert clipped.startswith("NOTE ") and clipped.endswith(" END") and "ledger #2" in clipped
    assert store.recover("a", 2, 2) == [parse_message(answer)]


def test_migrating_a_store_fills_in_the_tool_use_ids_its_ledgers_hold(fresh_url: str) -> None:
    store = SessionStore.from_url(fresh_url)
    try:
        store.migrate()
        store.create_session("a", POLICY)
        store.append("a", [user("task"), call("t1", {}), result("t1"), call("t2", {})])
        with store.engine.begin() as conn:  # back to a 0003 store: no table, one id twice
            command.downgrade(alembic_config(conn), "0003")
        with store.engine.begin() as conn:
            assert "tool_use_ids" not in sa.inspect(conn).get_table_names()
            conn.execute(ledger.insert().values(
                session_id="a", seq=4, message=call("t1", {}), tokens=5,
                appended_at=datetime.now(UTC), discarded_at=None))
        assert store.migrate() == SCHEMA_REVISION
        with store.engine.connect() as conn:
            seqs = {r.id_digest: r.seq for r in conn.execute(sa.select(tool_use_ids))}
        assert seqs == {tool_use_id_digest("t1"): 1, tool_use_id_digest("t2"): 3}
        with pytest.raises(ToolPairingError, match="ledger #1"):  # its first use
            store.append("a", [result("t2"), call("t1", {})])
    finally:
        store.close()
