"""Appends: ledger and window tail in one transaction, validated, idempotent, clipped."""

from __future__ import annotations

from typing import Any

import pytest
from sessionfold.core.errors import InvalidInputError, InvalidMessageError, ToolPairingError
from sessionfold.core.messages import Message, parse_messages
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from sessionfold.store.codec import decode_message, encode_message
from store_helpers import (
    check_window,
    ledger_json,
    row_counts,
    transcript,
    transcript_names,
    turn,
    user,
)

POLICY = FoldPolicy(budget_tokens=4000)


def test_an_append_lands_in_the_ledger_and_at_the_window_tail(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    first = store.append("a", [user("the task")])
    second = store.append("a", turn("1"))
    assert (first.first_seq, first.last_seq, first.revision) == (0, 0, 1)
    assert (second.first_seq, second.last_seq, second.revision) == (1, 2, 2)
    expected = [user("the task"), *turn("1")]
    assert ledger_json(store, "a") == expected
    window = store.read_window("a")
    assert [m.to_json() for m in window.messages()] == expected
    assert [(i.start_seq, i.end_seq, i.kind, i.edits) for i in window.items] == [
        (0, 0, "message", ()), (1, 1, "message", ()), (2, 2, "message", ())]
    assert all(i.tokens and i.tokens > 0 for i in window.items)
    info = store.get_session("a")
    assert info.ledger_len == 3 and info.revision == 2
    assert info.window_tokens == sum(e.tokens for e in store.read_ledger("a"))
    check_window(store, "a")


def test_read_ledger_takes_a_half_open_range(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("0"), {"role": "assistant", "content": "1"}, user("2")])
    assert [e.seq for e in store.read_ledger("a", 1)] == [1, 2]
    assert [e.seq for e in store.read_ledger("a", 0, 2)] == [0, 1]
    assert store.read_ledger("a", 3) == []
    with pytest.raises(InvalidInputError, match="start"):
        store.read_ledger("a", -1)


@pytest.mark.parametrize("name", transcript_names())
def test_real_transcripts_round_trip_exactly(store: SessionStore, name: str) -> None:
    """Every message reads back equal to what was appended: same models, same fields set, the
    same JSON (the fast decoder must agree with full validation)."""
    system, messages = transcript(name)
    store.create_session("t", FoldPolicy(budget_tokens=200_000), system=system)
    store.append("t", messages)
    back = [e.message for e in store.read_ledger("t")]
    assert back == messages
    assert [m.to_json() for m in back if m] == [m.to_json() for m in messages]
    for got, want in zip(back, messages, strict=True):
        assert got is not None and got.model_fields_set == want.model_fields_set
    assert store.recover("t", 0, len(messages) - 1) == messages
    assert store.read_window("t").system == system
    check_window(store, "t")


def test_the_fast_decoder_keeps_extra_fields_and_defaults_like_validation() -> None:
    raw = {"role": "user", "content": [
        {"type": "text", "text": "see", "citations": [{"k": 1}]},
        {"type": "tool_result", "tool_use_id": "t1"},
        {"type": "tool_result", "tool_use_id": "t2", "is_error": True,
         "content": [{"type": "text", "text": "x", "extra": 2},
                     {"type": "image", "source": {"type": "base64", "data": "AA=="}}]},
    ]}
    validated = parse_messages([{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "a", "input": {}},
        {"type": "tool_use", "id": "t2", "name": "b", "input": {}}]}, raw])[1]
    decoded = decode_message(encode_message(validated))
    assert decoded == validated and decoded.to_json() == raw
    assert decoded.model_fields_set == validated.model_fields_set
    block = decoded.content[1]
    assert not isinstance(block, str) and block.model_fields_set == {"type", "tool_use_id"}


#: An assistant reply with a server tool (web search) and an MCP call, and a tool result
#: carrying a search_result part: block types sessionfold does not read (OpaqueBlock).
SERVER_TOOLS: list[dict[str, Any]] = [
    {"role": "user", "content": "what changed in the 2.0 release?"},
    {"role": "assistant", "content": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
         "input": {"query": "2.0 release notes"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
            {"type": "web_search_result", "url": "https://example.org/2.0", "title": "2.0",
             "encrypted_content": "Zm9vYmFy", "page_age": None}]},
        {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "tickets", "server_name": "jira",
         "input": {"q": "OPS-7"}},
        {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": False,
         "content": [{"type": "text", "text": "OPS-7: open"}]},
        {"type": "text", "text": "Let me read the changelog too."},
        {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "CHANGES"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "search_result", "source": "CHANGES", "title": "changelog",
             "content": [{"type": "text", "text": "2.0: streaming"}]},
            {"type": "text", "text": "end of file"}]}]},
]


def test_blocks_of_types_sessionfold_does_not_read_are_kept_exactly(store: SessionStore) -> None:
    """A server tool's call and result, an MCP call and a search_result part are what the API
    answers: they are appended, read back, decoded and recovered exactly as given."""
    store.create_session("a", POLICY)
    store.append("a", SERVER_TOOLS)
    assert ledger_json(store, "a") == SERVER_TOOLS
    assert [m.to_json() for m in store.read_window("a").messages()] == SERVER_TOOLS
    validated = parse_messages(SERVER_TOOLS)
    assert store.recover("a", 0, 2) == validated
    reply = store.read_ledger("a")[1].message
    assert reply is not None and not isinstance(reply.content, str)
    assert [type(b).__name__ for b in reply.content][:4] == ["OpaqueBlock"] * 4
    # Counted by their JSON: the reply with its server tool results weighs more than its text.
    text_only = Message(role="assistant", content="Let me read the changelog too.")
    assert store.counter.message(reply) > store.counter.message(text_only) + 40
    check_window(store, "a")


def test_cache_control_is_stripped_on_append_also_inside_tool_results(
        store: SessionStore) -> None:
    store.create_session("a", POLICY)
    marked: list[dict[str, Any]] = [
        {"role": "user", "content": [
            {"type": "text", "text": "task", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "c1", "name": "ls", "input": {},
             "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "cache_control": {"type": "ephemeral"},
             "content": [{"type": "text", "text": "out",
                          "cache_control": {"type": "ephemeral"}}]}]},
    ]
    store.append("a", marked)
    for stored in (ledger_json(store, "a"), [m.to_json() for m in store.read_window("a")
                                            .messages()], store.export("a")["ledger"]):
        assert "cache_control" not in str(stored)
    assert ledger_json(store, "a")[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "c1",
         "content": [{"type": "text", "text": "out"}]}]}


def test_a_retried_append_with_its_key_returns_the_original_seqs(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("task")])
    first = store.append("a", turn("1"), key="turn-1")
    store.append("a", turn("2"), key="turn-2")
    retried = store.append("a", turn("1"), key="turn-1")
    assert retried.duplicate and (retried.first_seq, retried.last_seq) == (1, 2)
    assert retried.revision == first.revision
    assert len(store.read_ledger("a")) == 5
    with pytest.raises(InvalidInputError, match="used before for other messages"):
        store.append("a", turn("3"), key="turn-1")
    assert len(store.read_ledger("a")) == 5
    with pytest.raises(InvalidInputError, match="append key"):
        store.append("a", turn("3"), key="")  # not a usable key
    check_window(store, "a")


def test_a_tool_call_may_be_answered_by_the_next_append(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    call, result = turn("x")
    store.append("a", [user("task"), call])  # the agent is mid-call
    assert store.append("a", [result]).first_seq == 2
    check_window(store, "a")


def _nothing_written(store: SessionStore, before: dict[str, int], revision: int) -> None:
    assert row_counts(store) == before
    assert store.get_session("a").revision == revision


BAD_BATCHES: list[tuple[object, type[Exception], str]] = [
    ([user("ok"), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "ghost", "content": "x"}]}],
     ToolPairingError, "orphan tool_result"),
    ([user("ok"), {"role": "robot", "content": "x"}], InvalidMessageError, "message 1: role"),
    ([{"role": "user", "content": [{"type": "text"}]}], InvalidMessageError, r"content\[0\]"),
    ([{"role": "user", "content": [{"type": "tool_reslt", "tool_use_id": "x"}]}],
     InvalidMessageError, "did you mean 'tool_result'"),
    ([{"role": "user", "content": 42}], InvalidMessageError, "content must be"),
    ([{"role": "user", "content": []}], InvalidMessageError, "empty"),
    ([{"role": "user", "content": "x", "name": "bob"}], InvalidMessageError, "unknown field"),
    ([user("ok"), "just a string"], InvalidMessageError, "must be an object"),
    ({"role": "user", "content": "not in a list"}, InvalidMessageError, "list of messages"),
    ("hello", InvalidMessageError, "list of messages"),
    ([], InvalidMessageError, "empty"),
    (None, InvalidMessageError, "list of messages"),
]


@pytest.mark.parametrize(("batch", "error", "match"), BAD_BATCHES)
def test_bad_input_is_refused_with_a_clear_error_and_nothing_is_written(
        store: SessionStore, batch: object, error: type[Exception], match: str) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("task")])
    before, revision = row_counts(store), store.get_session("a").revision
    with pytest.raises(error, match=match):
        store.append("a", batch, key="k")  # type: ignore[arg-type]
    _nothing_written(store, before, revision)


def test_an_orphan_result_against_the_ledger_tail_writes_nothing(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("task"), *turn("1")])
    before, revision = row_counts(store), store.get_session("a").revision
    with pytest.raises(ToolPairingError, match="orphan tool_result"):
        store.append("a", [turn("1")[1]])  # answers call-1 again: not the tail's call
    _nothing_written(store, before, revision)
    call, _ = turn("2")
    store.append("a", [call])
    before, revision = row_counts(store), store.get_session("a").revision
    with pytest.raises(ToolPairingError, match=r"last ledger message \(seq 3\)"):
        store.append("a", [user("moving on without the result")])
    _nothing_written(store, before, revision)


def test_wrong_argument_types_are_refused(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    with pytest.raises(InvalidInputError, match="append key"):
        store.append("a", [user("x")], key=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="session id"):
        store.append(5, [user("x")])  # type: ignore[arg-type]
    assert row_counts(store)["ledger"] == 0


def test_an_oversized_tool_output_is_clipped_in_the_window_and_kept_whole_in_the_ledger(
        store: SessionStore) -> None:
    policy = FoldPolicy(budget_tokens=4000)  # max item: 1000 tokens
    store.create_session("a", policy)
    big = "\n".join(f"row {i}: " + "payload " * 12 for i in range(2000))
    call = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "big", "name": "dump", "input": {}}]}
    result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "big", "content": big}]}
    store.append("a", [user("task"), call, result])
    item = store.read_window("a").items[2]
    assert item.edits == ("clipped",)
    assert item.tokens is not None and item.tokens <= policy.max_item_tokens + 50
    clipped = item.message.content[0]
    assert not isinstance(clipped, str)
    text = getattr(clipped, "content", "")
    assert isinstance(text, str) and "ledger #2" in text and len(text) < len(big)
    assert store.recover("a", 2, 2) == [Message.model_validate(result)]
    entry = store.read_ledger("a", 2)[0]
    assert entry.tokens > policy.max_item_tokens
    check_window(store, "a")
