"""The Anthropic wrappers: plain SDK code (the real ``anthropic`` SDK, over HTTP to the stand-in
model) whose history goes through a session: only what is new is appended, the compacted window
is sent, usage reported, overflow folded inline, recall answered -- streamed or not."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest
from pipeline_harness import deleting_the_session, transcript_session
from sessionfold.cli.standin.fakeprovider import FakeProvider, FakeProviderServer, ToolUse
from sessionfold.client import (
    AsyncClient,
    AsyncSessionAnthropic,
    Client,
    HistoryMismatchError,
    ReplyNotRecordedError,
    SessionAnthropic,
    SessionHandle,
    connect,
)
from sessionfold.core.errors import ContextOverflowError, SessionNotFoundError, StoreError
from sessionfold.core.messages import parse_message
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings

SYSTEM = "You are the billing operations agent."
TOOLS: Any = [{"name": "bash", "description": "Run a shell command.",
               "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
MODEL = "claude-test"


@pytest.fixture
def client(make_settings: Callable[..., Settings]) -> Iterator[Client]:
    with connect(make_settings()) as c:
        yield c


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(keep_requests=50)


@pytest.fixture
def server(provider: FakeProvider) -> Iterator[FakeProviderServer]:
    with provider.serve() as running:
        yield running


@pytest.fixture
def sdk(server: FakeProviderServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-test", base_url=server.base_url, max_retries=0,
                               timeout=30)


#: The recall tool on every request from the first (the default offers it once the window
#: holds something edited): these sessions are short, and their models call it.
POLICY = FoldPolicy(budget_tokens=32_000, recall_offer="always")


def agent_of(client: Client, policy: FoldPolicy | None = None,
             sid: str = "agent-sdk") -> SessionHandle:
    return client.session(sid, policy=policy or POLICY, system=SYSTEM)


def ledger_json(agent: SessionHandle, *, origin: str = "agent") -> list[dict[str, Any]]:
    return [e.message.to_json() for e in agent.ledger()
            if e.origin == origin and e.message is not None]


def as_json(history: list[Any]) -> list[dict[str, Any]]:
    return [parse_message(m, i).to_json() for i, m in enumerate(history)]


def run_tool(reply: Any) -> list[dict[str, Any]]:
    return [{"type": "tool_result", "tool_use_id": b.id, "content": f"ran {b.input['cmd']}"}
            for b in reply.content if b.type == "tool_use" and b.name == "bash"]


def spy_usage(agent: SessionHandle) -> list[tuple[int, int, int]]:
    """Every usage report: (prompt tokens as the provider counted them, seq, revision)."""
    reports: list[tuple[int, int, int]] = []
    report = agent._report_usage  # every call's report goes through it

    def spy(usage: Any, *, seq: int, revision: int, model: str | None = None,
            unsent_tokens: int = 0) -> bool:
        reports.append((usage.input_tokens + (usage.cache_read_input_tokens or 0)
                        + (usage.cache_creation_input_tokens or 0), seq, revision))
        return report(usage, seq=seq, revision=revision, model=model,
                      unsent_tokens=unsent_tokens)

    agent._report_usage = spy  # type: ignore[method-assign]
    return reports


# --- the whole-history loop ----------------------------------------------------------------------

def test_a_plain_sdk_loop_appends_only_what_goes_beyond_the_ledger(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    llm = SessionAnthropic(sdk, agent, cache_breakpoints=False)  # sent exactly as read
    provider.script_reply(["Listing.", ToolUse("bash", {"cmd": "ls"})],
                          ToolUse("bash", {"cmd": "cat refunds.log"}), "All reconciled.")
    history: list[Any] = [{"role": "user", "content": "Reconcile yesterday's refunds."}]
    for _ in range(3):
        reply = llm.messages.create(model=MODEL, max_tokens=512, system=SYSTEM,
                                    messages=history, tools=TOOLS)
        history.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            break
        history.append({"role": "user", "content": run_tool(reply)})
    assert reply.content[0].type == "text" and reply.content[0].text == "All reconciled."
    # The ledger holds the history once: each call appended only its new messages and reply.
    assert ledger_json(agent) == as_json(history) and len(history) == 6
    assert agent.ledger()[-1].message is not None
    # Each request carried the session's window, the caller's tools and the recall tool.
    sent = provider.requests[-1]
    assert sent["system"] == SYSTEM and sent["messages"] == agent.window(recall=True).messages[:-1]
    assert [t["name"] for t in sent["tools"]] == ["bash", "sessionfold_recall"]
    assert agent.calls == 3


def test_the_compacted_window_is_sent_not_the_callers_history(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client, FoldPolicy(budget_tokens=8000, recall=False))
    conversation = [m.to_json() for m in transcript_session("django__django-15554", 59).messages]
    agent.append(conversation)
    report = agent.fold_inline(trigger="manual", target_tokens=4000)
    assert report.outcome == "folded"
    history = [*conversation, {"role": "user", "content": "Where do we stand?"}]
    reply = SessionAnthropic(sdk, agent, cache_breakpoints=False).messages.create(
        model=MODEL, max_tokens=256, messages=history)
    sent = provider.requests[-1]
    assert len(sent["messages"]) < len(history)  # the window, folded
    assert "[sessionfold]" in json.dumps(sent["messages"])
    assert sent["messages"][-1] == {"role": "user", "content": "Where do we stand?"}
    assert "tools" not in sent and sent["system"]  # recall off: no tool; the session's system
    assert ledger_json(agent) == as_json([*history, {"role": "assistant",
                                                     "content": reply.content}])


def test_usage_reported_is_the_providers_own_count_for_the_window_sent(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    reports = spy_usage(agent)
    history: list[Any] = [{"role": "user", "content": "How many refunds failed?"}]
    reply = SessionAnthropic(sdk, agent).messages.create(model=MODEL, max_tokens=64,
                                                         messages=history)
    assert reports == [(provider.stats.recent_prompt_tokens[-1], 0, 1)]
    # The request carried cache breakpoints (the default): the first call writes the cache, and
    # the prompt size reported is all of it (uncached + written + read).
    usage = reply.usage
    assert usage.cache_creation_input_tokens and usage.cache_creation_input_tokens > 0
    assert (usage.input_tokens + usage.cache_creation_input_tokens
            + (usage.cache_read_input_tokens or 0)) == provider.stats.recent_prompt_tokens[-1]


def test_by_default_requests_carry_breakpoints_after_the_stable_head_and_the_last_message(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client, FoldPolicy(budget_tokens=8000, recall=False))
    conversation = [m.to_json() for m in transcript_session("django__django-15554", 59).messages]
    agent.append(conversation)
    assert agent.fold_inline(trigger="manual", target_tokens=4000).outcome == "folded"
    history = [*conversation, {"role": "user", "content": "Where do we stand?"}]
    llm = SessionAnthropic(sdk, agent)
    first = llm.messages.create(model=MODEL, max_tokens=64, messages=history)
    sent = provider.requests[-1]["messages"]
    marked = [i for i, m in enumerate(sent) if "cache_control" in json.dumps(m)]
    window = agent.window()
    head = max(i for i, item in enumerate(window.items) if item.kind in ("summary", "notice"))
    assert marked == [head, len(sent) - 1]
    # The second call reads what the first wrote: the head is unchanged between folds.
    history += [{"role": "assistant", "content": first.content},
                {"role": "user", "content": "And now?"}]
    reply = llm.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert reply.usage.cache_read_input_tokens and reply.usage.cache_read_input_tokens > 0


def test_cache_markers_the_caller_moves_from_call_to_call_are_not_a_divergence(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    llm = SessionAnthropic(sdk, agent, cache_breakpoints=True)
    marker = {"type": "ephemeral"}
    history: list[Any] = [{"role": "user", "content": [
        {"type": "text", "text": "task", "cache_control": marker}]}]
    reply = llm.messages.create(model=MODEL, max_tokens=64, messages=history)
    history[0] = {"role": "user", "content": [{"type": "text", "text": "task"}]}
    history += [{"role": "assistant", "content": reply.content},
                {"role": "user", "content": [{"type": "text", "text": "next",
                                              "cache_control": marker}]}]
    llm.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert len(ledger_json(agent)) == 4
    # The wrapper places its own breakpoints on the window it sends.
    assert "cache_control" in json.dumps(provider.requests[-1]["messages"][-1])


def test_rows_discarded_under_retain_discard_still_line_up_with_the_callers_copy(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client, FoldPolicy(budget_tokens=8000, retain="discard", recall=False))
    history: list[Any] = [m.to_json() for m in
                          transcript_session("django__django-15554", 59).messages]
    agent.append(history)
    assert agent.fold_inline(trigger="manual", target_tokens=4000).outcome == "folded"
    assert any(e.message is None for e in agent.ledger())  # the originals are gone
    history.append({"role": "user", "content": "Where do we stand?"})
    SessionAnthropic(sdk, agent).messages.create(model=MODEL, max_tokens=64, messages=history)
    assert ledger_json(agent)[-2] == {"role": "user", "content": "Where do we stand?"}
    assert len(agent.ledger()) == len(history) + 1


# --- divergence ----------------------------------------------------------------------------------

def test_a_history_that_parts_from_the_ledger_is_refused_naming_the_first_index(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    llm = SessionAnthropic(sdk, agent)
    history: list[Any] = [{"role": "user", "content": "task"}]
    reply = llm.messages.create(model=MODEL, max_tokens=64, messages=history)
    history += [{"role": "assistant", "content": reply.content},
                {"role": "user", "content": "next"}]
    llm.messages.create(model=MODEL, max_tokens=64, messages=history)
    rows, calls = len(agent.ledger()), provider.stats.calls
    edited = [history[0], {"role": "assistant", "content": "something else"}, *history[2:],
              {"role": "user", "content": "more"}]
    with pytest.raises(HistoryMismatchError, match="from message 1 on") as info:
        llm.messages.create(model=MODEL, max_tokens=64, messages=edited)
    assert info.value.index == 1
    with pytest.raises(HistoryMismatchError, match="holds 4") as short:
        llm.messages.create(model=MODEL, max_tokens=64, messages=history[:2])
    assert short.value.index == 2
    # Nothing was appended and the model was not called.
    assert len(agent.ledger()) == rows and provider.stats.calls == calls


def test_a_system_prompt_other_than_the_sessions_is_refused(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    llm = SessionAnthropic(sdk, agent)
    history: list[Any] = [{"role": "user", "content": "task"}]
    with pytest.raises(HistoryMismatchError, match="system= differs") as info:
        llm.messages.create(model=MODEL, max_tokens=64, system="You are someone else.",
                            messages=history)
    assert info.value.field == "system" and info.value.index is None
    assert agent.ledger() == [] and provider.stats.calls == 0
    # The same text as blocks (with a cache marker) is the same system prompt, sent as given.
    blocks = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    llm.messages.create(model=MODEL, max_tokens=64, system=blocks, messages=history)
    assert provider.requests[-1]["system"] == blocks


# --- overflow ------------------------------------------------------------------------------------

def test_overflow_folds_inline_and_retries_once(client: Client,
                                               sdk: anthropic.Anthropic) -> None:
    provider = FakeProvider(context_window=12_000, keep_requests=5)
    # A budget past the stand-in's 12k window: the request is under it, and refused.
    agent = agent_of(client, FoldPolicy(budget_tokens=100_000))
    history = [m.to_json() for m in transcript_session("django__django-15554", 59).messages]
    with provider.serve() as server:
        llm = SessionAnthropic(anthropic.Anthropic(api_key="sk", base_url=server.base_url,
                                                   max_retries=0), agent)
        reply = llm.messages.create(model=MODEL, max_tokens=256, messages=history)
        assert provider.stats.by_status == {400: 1, 200: 1}  # rejected once, then served
        assert agent.inline_folds == 1 and client.store.records(agent.session_id)[-1].trigger \
            == "overflow"
        history.append({"role": "assistant", "content": reply.content})
        assert ledger_json(agent) == as_json(history)
        history.append({"role": "user", "content": "go on"})
        with llm.messages.stream(model=MODEL, max_tokens=256, messages=history) as stream:
            assert stream.get_final_text()
        tiny = FakeProvider(context_window=500)
    with tiny.serve() as server:
        cramped = SessionAnthropic(anthropic.Anthropic(api_key="sk", base_url=server.base_url,
                                                       max_retries=0), agent)
        history.append({"role": "assistant", "content": stream.get_final_message().content})
        history.append({"role": "user", "content": "and now?"})
        with pytest.raises(ContextOverflowError) as info:
            cramped.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert isinstance(info.value.__cause__, anthropic.BadRequestError)
    assert tiny.stats.by_status == {400: 2}  # one retry, not a loop


def test_a_streamed_request_too_long_folds_inline_and_retries(
        client: Client, sdk: anthropic.Anthropic) -> None:
    provider = FakeProvider(context_window=12_000)
    agent = agent_of(client, FoldPolicy(budget_tokens=100_000, recall=False))
    history = [m.to_json() for m in transcript_session("django__django-15554", 59).messages]
    with provider.serve() as server:
        llm = SessionAnthropic(anthropic.Anthropic(api_key="sk", base_url=server.base_url,
                                                   max_retries=0), agent)
        with llm.messages.stream(model=MODEL, max_tokens=256, messages=history) as stream:
            text = "".join(stream.text_stream)
    assert text and provider.stats.by_status == {400: 1, 200: 1}
    assert agent.inline_folds == 1
    assert ledger_json(agent)[-1] == {"role": "assistant",
                                      "content": [{"type": "text", "text": text}]}


# --- recall --------------------------------------------------------------------------------------

def answers_from_the_recall(request: Any) -> str:
    """The model once recall has answered: it quotes the first line of the tool result."""
    last = request["messages"][-1]["content"]
    results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"]
    return f"From the ledger: {results[0]['content'].splitlines()[0]}" if results else "Hm."


def test_a_recall_only_reply_is_answered_and_the_model_called_again(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    reports = spy_usage(agent)
    llm = SessionAnthropic(sdk, agent)
    provider.reply = answers_from_the_recall
    provider.script_reply(ToolUse("sessionfold_recall", {"seq": "0"}))
    history: list[Any] = [{"role": "user", "content": "What was the task, exactly?"}]
    reply = llm.messages.create(model=MODEL, max_tokens=64, messages=history, tools=TOOLS)
    assert reply.stop_reason == "end_turn"
    assert reply.content[0].text.startswith("From the ledger: [sessionfold recall] ledger #0")
    assert provider.stats.succeeded == 2 and agent.recall_rounds == 1 and len(reports) == 2
    assert [e.origin for e in agent.ledger()] == ["agent", "recall", "recall", "agent"]
    # The caller's history never holds the exchange, and the next call still lines up.
    history += [{"role": "assistant", "content": reply.content},
                {"role": "user", "content": "thanks"}]
    llm.messages.create(model=MODEL, max_tokens=64, messages=history, tools=TOOLS)
    assert ledger_json(agent)[-2] == {"role": "user", "content": "thanks"}


def test_a_streamed_recall_round_is_answered_and_the_caller_reads_the_final_stream(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    reports = spy_usage(agent)
    llm = SessionAnthropic(sdk, agent)
    provider.reply = answers_from_the_recall
    provider.script_reply(["Let me look that up.", ToolUse("sessionfold_recall", {"seq": "0"})])
    history: list[Any] = [{"role": "user", "content": "What was the task, exactly?"}]
    with llm.messages.stream(model=MODEL, max_tokens=64, messages=history,
                             tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds.count("message_start") == 1 and kinds[-1] == "message_stop"
    text = "".join(e.delta.text for e in events
                   if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert "Let me look" not in text and text == final.content[0].text
    assert text.startswith("From the ledger: [sessionfold recall]")
    assert provider.stats.succeeded == 2 and agent.recall_rounds == 1
    assert [p for p, _, _ in reports] == list(provider.stats.recent_prompt_tokens)
    assert [e.origin for e in agent.ledger()] == ["agent", "recall", "recall", "agent"]
    assert ledger_json(agent)[-1] == {"role": "assistant",
                                      "content": [{"type": "text", "text": text}]}


def test_a_streamed_reply_calling_the_agents_tool_reaches_the_caller_whole(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    llm = SessionAnthropic(sdk, agent)
    provider.script_reply(["Running it.", ToolUse("bash", {"cmd": "ls -la"})])
    history: list[Any] = [{"role": "user", "content": "list"}]
    with llm.messages.stream(model=MODEL, max_tokens=64, messages=history,
                             tools=TOOLS) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(deltas) == "Running it." and final.stop_reason == "tool_use"
    assert final.content[1].type == "tool_use" and final.content[1].input == {"cmd": "ls -la"}
    assert agent.recall_rounds == 0
    assert ledger_json(agent)[-1] == as_json([{"role": "assistant",
                                               "content": final.content}])[0]


def test_recall_beside_the_agents_tools_is_answered_in_the_callers_next_message(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    llm = SessionAnthropic(sdk, agent)
    provider.script_reply([ToolUse("bash", {"cmd": "ls"}),
                           ToolUse("sessionfold_recall", {"seq": "0"})])
    history: list[Any] = [{"role": "user", "content": "task"}]
    reply = llm.messages.create(model=MODEL, max_tokens=64, messages=history, tools=TOOLS)
    assert [b.name for b in reply.content if b.type == "tool_use"] == ["bash",
                                                                        "sessionfold_recall"]
    recall_id = reply.content[1].id
    # Plain SDK code answers its own tool, and says it does not know the other one.
    history += [{"role": "assistant", "content": reply.content},
                {"role": "user", "content": [
                    *run_tool(reply), {"type": "tool_result", "tool_use_id": recall_id,
                                       "content": "unknown tool", "is_error": True}]}]
    second = llm.messages.create(model=MODEL, max_tokens=64, messages=history, tools=TOOLS)
    answered = ledger_json(agent)[2]["content"]
    assert [b["tool_use_id"] for b in answered] == [reply.content[0].id, recall_id]
    assert answered[0]["content"] == "ran ls" and "is_error" not in answered[1]
    assert answered[1]["content"].startswith("[sessionfold recall] ledger #0")
    assert agent.recall_calls == 1
    # The ledger differs from the caller's copy only in that answer, and the next call
    # still lines up with it.
    history += [{"role": "assistant", "content": second.content},
                {"role": "user", "content": "next"}]
    llm.messages.create(model=MODEL, max_tokens=64, messages=history, tools=TOOLS)
    assert ledger_json(agent)[-2] == {"role": "user", "content": "next"}
    assert len(ledger_json(agent)) == len(history) + 1


# --- create(stream=True) and closing early --------------------------------------------------------

def test_create_with_stream_true_gives_the_raw_events_and_records_the_reply(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    history: list[Any] = [{"role": "user", "content": "stream me a reply"}]
    stream = SessionAnthropic(sdk, agent).messages.create(model=MODEL, max_tokens=64,
                                                          messages=history, stream=True)
    events = list(stream)
    kinds = {e.type for e in events}
    assert kinds == {"message_start", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"}
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert ledger_json(agent)[-1] == {"role": "assistant",
                                      "content": [{"type": "text", "text": text}]}


def test_a_stream_closed_before_its_end_records_nothing(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client, FoldPolicy(budget_tokens=32_000, recall=False))
    history: list[Any] = [{"role": "user", "content": "a long answer please " * 20}]
    with SessionAnthropic(sdk, agent).messages.stream(model=MODEL, max_tokens=64,
                                                      messages=history) as stream:
        first = next(stream)
    assert first.type == "message_start"
    assert [e.origin for e in agent.ledger()] == ["agent"] and agent.calls == 0


# --- asyncio -------------------------------------------------------------------------------------

def test_the_async_wrapper_creates_streams_and_answers_recall(
        make_settings: Callable[..., Settings], provider: FakeProvider,
        server: FakeProviderServer) -> None:
    provider.reply = answers_from_the_recall

    async def scenario() -> tuple[str, str, list[str], int]:
        async with await AsyncClient.connect(make_settings()) as aclient:
            agent = await aclient.session("agent-async", policy=POLICY, system=SYSTEM)
            llm = AsyncSessionAnthropic(anthropic.AsyncAnthropic(
                api_key="sk", base_url=server.base_url, max_retries=0), agent)
            history: list[Any] = [{"role": "user", "content": "the task"}]
            provider.script_reply(ToolUse("sessionfold_recall", {"seq": "0"}))
            reply = await llm.messages.create(model=MODEL, max_tokens=64, messages=history)
            history += [{"role": "assistant", "content": reply.content},
                        {"role": "user", "content": "again, streamed"}]
            provider.script_reply(ToolUse("sessionfold_recall", {"seq": "0"}))
            async with llm.messages.stream(model=MODEL, max_tokens=64,
                                           messages=history) as stream:
                deltas = [text async for text in stream.text_stream]
                final = await stream.get_final_message()
            assert "".join(deltas) == final.content[0].text
            origins = [e.origin for e in await agent.ledger()]
            return reply.content[0].text, final.content[0].text, origins, agent.recall_rounds

    created, streamed, origins, rounds = asyncio.run(scenario())
    assert created.startswith("From the ledger: [sessionfold recall] ledger #0")
    assert streamed.startswith("From the ledger: [sessionfold recall] ledger #0")
    assert origins == ["agent", "recall", "recall", "agent", "agent", "recall", "recall",
                       "agent"]
    assert rounds == 2 and provider.stats.succeeded == 4


# --- a reply that cannot be recorded -------------------------------------------------------------


def test_a_reply_that_cannot_be_recorded_is_raised_with_the_reply_after_its_usage_went_out(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    reports = spy_usage(agent)
    provider.reply = deleting_the_session(client, agent.session_id)
    with pytest.raises(ReplyNotRecordedError) as raised:
        SessionAnthropic(sdk, agent).messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "reconcile"}])
    error = raised.value
    # The caller still has what it paid for, and why it is not in the ledger.
    assert isinstance(error.response, anthropic.types.Message)
    assert error.response.content[0].text == "Reconciled 12 refunds."
    assert isinstance(error.__cause__, SessionNotFoundError)
    assert "not recorded" in str(error) and "SessionNotFoundError" in error.reason
    assert len(reports) == 1 and provider.stats.succeeded == 1  # reported before recording


def test_a_streamed_reply_that_cannot_be_recorded_is_raised_at_its_end_and_kept(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    reports = spy_usage(agent)
    provider.reply = deleting_the_session(client, agent.session_id)
    with SessionAnthropic(sdk, agent).messages.stream(
            model=MODEL, max_tokens=64,
            messages=[{"role": "user", "content": "reconcile"}]) as stream:
        deltas: list[str] = []
        with pytest.raises(ReplyNotRecordedError) as raised:
            for text in stream.text_stream:
                deltas.append(text)
        final = stream.get_final_message()
    assert raised.value.response is final
    assert "".join(deltas) == final.content[0].text == "Reconciled 12 refunds."
    assert len(reports) == 1


def test_a_reply_not_recorded_goes_into_the_ledger_with_the_next_call(
        client: Client, provider: FakeProvider, sdk: anthropic.Anthropic) -> None:
    agent = agent_of(client)
    llm = SessionAnthropic(sdk, agent)
    append = agent.append

    def store_down_for_the_reply(turns: Any, **kwargs: Any) -> Any:
        if parse_message(turns[0]).role == "assistant":  # the store fails the reply's write
            agent.append = append  # type: ignore[method-assign]
            raise StoreError("the store's database failed: connection reset")
        return append(turns, **kwargs)

    agent.append = store_down_for_the_reply  # type: ignore[method-assign]
    history: list[Any] = [{"role": "user", "content": "reconcile"}]
    with pytest.raises(ReplyNotRecordedError) as raised:
        llm.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert isinstance(raised.value.__cause__, StoreError)
    assert ledger_json(agent) == as_json(history)  # the reply is not in the ledger
    history += [{"role": "assistant", "content": raised.value.response.content},
                {"role": "user", "content": "and now?"}]
    llm.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert ledger_json(agent)[:3] == as_json(history)


def test_the_async_wrapper_raises_a_reply_it_cannot_record_with_the_reply(
        make_settings: Callable[..., Settings], provider: FakeProvider,
        server: FakeProviderServer) -> None:
    async def scenario() -> ReplyNotRecordedError:
        async with await AsyncClient.connect(make_settings()) as aclient:
            agent = await aclient.session("agent-async", policy=POLICY, system=SYSTEM)
            provider.reply = deleting_the_session(aclient.sync, "agent-async")
            llm = AsyncSessionAnthropic(anthropic.AsyncAnthropic(
                api_key="sk", base_url=server.base_url, max_retries=0), agent)
            with pytest.raises(ReplyNotRecordedError) as raised:
                await llm.messages.create(model=MODEL, max_tokens=64,
                                          messages=[{"role": "user", "content": "go"}])
            return raised.value

    error = asyncio.run(scenario())
    assert error.response.content[0].text == "Reconciled 12 refunds."
    assert isinstance(error.__cause__, SessionNotFoundError)
