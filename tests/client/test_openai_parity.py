"""OpenAI parity in the client: OpenAI chat-shaped messages go in through ``append`` and come
back out of ``window(shape="openai")``; ``tool`` messages appended one at a time are held until
every call of their assistant message is answered; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessage
from sessionfold.client import AsyncClient, Client, SessionHandle, connect
from sessionfold.client.shapes import HeldAppend, detect_shape
from sessionfold.core.errors import InvalidInputError, InvalidMessageError, ToolPairingError
from sessionfold.core.openai_shape import from_openai
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.fold_procedure import FoldJob, run_fold
from sessionfold.runtime.settings import Settings

SYSTEM = "You are the on-call agent. Cite ticket ids."
POLICY = FoldPolicy(budget_tokens=8000, keep_recent_turns=2)


@pytest.fixture
def client(make_settings: Callable[..., Settings], database_url: str) -> Iterator[Client]:
    with connect(make_settings(database_url=database_url), migrate=True) as c:
        yield c


def agent(client: Client, sid: str = "oa-1", policy: FoldPolicy = POLICY) -> SessionHandle:
    return client.session(sid, policy=policy, system=SYSTEM)


# --- OpenAI chat messages, as an OpenAI agent keeps them ----------------------------------------

def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def calls(*ids_and_commands: tuple[str, str], text: str | None = None) -> dict[str, Any]:
    """An assistant message making tool calls (arguments as the JSON text OpenAI sends)."""
    return {"role": "assistant", "content": text, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        for call_id, command in ids_and_commands]}


def tool(call_id: str, output: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def said(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def ledger_messages(handle: SessionHandle) -> list[dict[str, Any]]:
    return [e.message.to_json() for e in handle.ledger() if e.message is not None]


def filler(n: int) -> str:
    return "\n".join(f"log {n}.{i}: nothing of note here, all requests served" for i in range(120))


# --- in and out ---------------------------------------------------------------------------------

def test_an_openai_conversation_round_trips_through_the_store_in_the_openai_shape(
        client: Client) -> None:
    handle = agent(client)
    conversation = [
        {"role": "system", "content": SYSTEM},
        user("Why did the payout worker stop at 03:10?"),
        calls(("call_a", "tail -n 50 /var/log/payout.log"), ("call_b", "systemctl status payout"),
              text="Reading the log and the unit."),
        tool("call_a", "03:10 FATAL retry budget exhausted for INC-22243"),
        tool("call_b", "inactive (dead) since 03:10"),
        said("The worker gave up after INC-22243 exhausted its retry budget."),
    ]
    result = handle.append(conversation, key="turn-1")  # shape auto: tool_calls say OpenAI
    assert (result.first_seq, result.last_seq) == (0, 3)  # the two tool messages are one turn
    assert handle.window(shape="openai").messages == conversation
    # Stored in the Anthropic shape: one user message answering both calls.
    stored = ledger_messages(handle)
    assert stored[1]["content"][1] == {"type": "tool_use", "id": "call_a", "name": "bash",
                                       "input": {"command": "tail -n 50 /var/log/payout.log"}}
    assert [b["tool_use_id"] for b in stored[2]["content"]] == ["call_a", "call_b"]
    assert handle.append(conversation, key="turn-1").duplicate  # the key holds in either shape
    view = handle.window(shape="openai")
    assert (view.shape, view.system, view.last_seq) == ("openai", SYSTEM, 3)
    assert handle.window().messages == stored  # the default stays the Anthropic shape


def test_openai_sdk_message_objects_are_appended_as_they_came_back(client: Client) -> None:
    handle = agent(client)
    handle.append([user("Check the disk.")])
    reply = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "bash", "arguments": '{"command": "df -h"}'}}]})
    handle.append([reply])
    handle.append([tool("call_1", "/dev/sda1 91%")])
    assert handle.window(shape="openai").messages[2:] == [
        calls(("call_1", "df -h")), tool("call_1", "/dev/sda1 91%")]


# --- the grouping rule ----------------------------------------------------------------------------

def test_tool_messages_appended_one_at_a_time_are_held_until_every_call_is_answered(
        client: Client) -> None:
    handle = agent(client)
    handle.append([user("Three checks, please.")])
    handle.append([calls(("c1", "uptime"), ("c2", "df -h"), ("c3", "free -m"))])
    first = handle.append([tool("c2", "91% used")])
    assert isinstance(first, HeldAppend)
    assert (first.held, first.owed) == (("c2",), ("c1", "c3"))
    assert (first.first_seq, first.last_seq) == (2, 1)  # nothing written
    second = handle.append([tool("c1", "up 3 days")])
    assert isinstance(second, HeldAppend) and second.owed == ("c3",)
    assert handle.info().ledger_len == 2
    assert [b["tool_use_id"] for b in handle.held_tool_results] == ["c2", "c1"]

    done = handle.append([tool("c3", "2 GB free")], key="results-1")
    assert not isinstance(done, HeldAppend) and (done.first_seq, done.last_seq) == (2, 2)
    assert handle.held_tool_results == []
    assert [(b["tool_use_id"], b["content"]) for b in ledger_messages(handle)[2]["content"]] == [
        ("c2", "91% used"), ("c1", "up 3 days"), ("c3", "2 GB free")]  # arrival order
    assert handle.window(shape="openai").messages[-3:] == [
        tool("c2", "91% used"), tool("c1", "up 3 days"), tool("c3", "2 GB free")]


def test_a_held_result_sent_again_is_not_doubled_and_a_different_one_is_refused(
        client: Client) -> None:
    handle = agent(client)
    handle.append([user("Two checks.")])
    handle.append([calls(("c1", "uptime"), ("c2", "df -h"))])
    handle.append([tool("c1", "up 3 days")])
    assert isinstance(handle.append([tool("c1", "up 3 days")]), HeldAppend)  # a retry
    assert len(handle.held_tool_results) == 1
    with pytest.raises(ToolPairingError, match="second, different result"):
        handle.append([tool("c1", "up 4 days")])
    handle.append([tool("c2", "91% used")])
    assert [b["tool_use_id"] for b in ledger_messages(handle)[2]["content"]] == ["c1", "c2"]
    assert handle.info().ledger_len == 3


def test_a_partial_set_with_more_behind_it_is_refused_and_nothing_is_written(
        client: Client) -> None:
    handle = agent(client)
    handle.append([user("Two checks.")])
    handle.append([calls(("c1", "uptime"), ("c2", "df -h"))])
    before = handle.info().revision
    with pytest.raises(ToolPairingError, match=r"\['c2'\]") as raised:
        handle.append([tool("c1", "up"), user("and then?")])
    assert raised.value.index == 0  # the OpenAI input's index
    orphan = [user("x"), tool("nobody", "?")]
    with pytest.raises(ToolPairingError) as orphaned:
        handle.append(orphan, shape="openai")
    assert (orphaned.value.index, orphaned.value.field) == (1, "tool_call_id")
    assert handle.held_tool_results == []
    assert handle.info().revision == before and handle.info().ledger_len == 2


def test_held_results_are_dropped_when_the_ledger_moves_past_their_calls(
        client: Client) -> None:
    handle = agent(client)
    handle.append([user("Two checks.")])
    handle.append([calls(("c1", "uptime"), ("c2", "df -h"))])
    handle.append([tool("c1", "up")])
    other = client.session("oa-1")  # another handle answered both calls meanwhile
    other.append([tool("c1", "up"), tool("c2", "91%")])
    result = handle.append([said("Both done.")], shape="openai")
    assert result.first_seq == 3 and handle.held_tool_results == []
    assert len(ledger_messages(handle)[2]["content"]) == 2  # nothing answered twice


def test_an_explicit_shape_beats_sniffing(client: Client) -> None:
    handle = agent(client)
    openai_reply = calls(("c1", "uptime"))
    with pytest.raises(InvalidMessageError, match=r"unknown field\(s\) \['tool_calls'\]"):
        handle.append([user("go"), openai_reply], shape="anthropic")
    anthropic_call = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]}
    with pytest.raises(InvalidMessageError, match="mix the OpenAI chat shape"):
        handle.append([user("go"), openai_reply, anthropic_call])
    assert handle.info().ledger_len == 0
    # Plain text reads the same in both shapes; shape="openai" takes it as chat messages.
    assert detect_shape([user("hi"), said("hello")]) == "anthropic"
    handle.append([user("hi"), said("hello")], shape="openai")
    assert ledger_messages(handle) == [user("hi"), {"role": "assistant", "content": [
        {"type": "text", "text": "hello"}]}]
    with pytest.raises(InvalidInputError, match="shape must be one of"):
        handle.append([user("x")], shape="chatml")  # type: ignore[arg-type]


def test_a_system_message_in_an_append_must_be_the_sessions_own_prompt(client: Client) -> None:
    handle = agent(client)
    handle.append([{"role": "system", "content": SYSTEM}, user("go")])
    assert ledger_messages(handle) == [user("go")]
    with pytest.raises(InvalidInputError, match="fixed at creation"):
        handle.append([{"role": "system", "content": "You are someone else."}, said("ok")])
    assert handle.info().ledger_len == 1


def test_the_openai_window_refuses_cache_breakpoints(client: Client) -> None:
    handle = agent(client)
    handle.append([user("go")])
    with pytest.raises(InvalidInputError, match="cache_control"):
        handle.window(shape="openai", cache_breakpoints=True)
    with pytest.raises(InvalidInputError, match="anthropic or openai"):
        handle.window(shape="auto")  # type: ignore[arg-type]


# --- after a fold ---------------------------------------------------------------------------------

def assert_tool_pairing(messages: list[dict[str, Any]]) -> None:
    """Every tool message answers a call of the assistant message before its group, and every
    call is answered before the next assistant or user message (the chat API's rule)."""
    open_calls: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, m
            open_calls.remove(m["tool_call_id"])
            continue
        assert not open_calls, f"unanswered {sorted(open_calls)} before {m}"
        open_calls = {c["id"] for c in m.get("tool_calls") or []}
    assert not open_calls


def test_tool_pairing_holds_in_the_openai_window_after_a_fold(client: Client) -> None:
    # Two results of ~1,600 tokens a message: under a cap of half the budget, so they are not
    # clipped on append and the fold has turns of parallel calls to summarize.
    handle = agent(client, policy=POLICY.model_copy(update={"max_item_ratio": 0.5}))
    handle.append([{"role": "system", "content": SYSTEM}, user("Audit the payout logs.")])
    for step in range(12):
        handle.append([calls((f"s{step}a", f"cat a{step}.log"), (f"s{step}b", f"cat b{step}.log"),
                             text=f"Step {step}.")])
        handle.append([tool(f"s{step}b", filler(step))])  # one at a time, out of order
        handle.append([tool(f"s{step}a", filler(step + 100))])
    before = handle.window(shape="openai")
    report = run_fold(client.store, client.summarizer, FoldJob("oa-1", "job-1"))
    assert report.outcome == "folded"
    after = handle.window(shape="openai")
    assert after.revision > before.revision and len(after.messages) < len(before.messages)
    assert any(item.kind == "summary" for item in after.items)
    assert after.messages[0] == {"role": "system", "content": SYSTEM}
    assert_tool_pairing(after.messages)
    from_openai(after.messages)  # and the library's own pairing check takes it back


def test_the_async_handle_groups_and_renders_the_same_way(
        make_settings: Callable[..., Settings], database_url: str) -> None:
    async def run() -> list[dict[str, Any]]:
        settings = make_settings(database_url=database_url)
        async with await AsyncClient.connect(settings, migrate=True) as aclient:
            handle = await aclient.session("oa-async", policy=POLICY, system=SYSTEM)
            await handle.append([user("Two checks.")])
            await handle.append([calls(("c1", "uptime"), ("c2", "df -h"))])
            held = await handle.append([tool("c1", "up")])
            assert isinstance(held, HeldAppend) and handle.held_tool_results
            await handle.append([tool("c2", "91%")])
            return (await handle.window(shape="openai")).messages
    assert asyncio.run(run()) == [
        {"role": "system", "content": SYSTEM}, user("Two checks."),
        calls(("c1", "uptime"), ("c2", "df -h")), tool("c1", "up"), tool("c2", "91%")]
