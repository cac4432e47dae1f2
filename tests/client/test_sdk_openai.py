"""The OpenAI wrapper: plain ``openai`` SDK code (over HTTP to the stand-in model's chat
completions) whose history goes through a session, converted with ``from_openai`` /
``to_openai``: only what is new is appended, the window is sent, tool calls and streams work,
usage is reported, overflow folds inline, recall is answered."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import openai
import pytest
from pipeline_harness import deleting_the_session, transcript_session
from sessionfold.cli.standin.fakeprovider import FakeProvider, FakeProviderServer, ToolUse
from sessionfold.client import (
    Client,
    HistoryMismatchError,
    ReplyNotRecordedError,
    SessionHandle,
    SessionOpenAI,
    connect,
)
from sessionfold.core.errors import ContextOverflowError, InvalidMessageError, SessionNotFoundError
from sessionfold.core.messages import Conversation
from sessionfold.core.openai_shape import from_openai
from sessionfold.core.openai_write import to_openai
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings

SYSTEM = "You are the billing operations agent."
TOOLS: Any = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
MODEL = "gpt-test"


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


def sdk_for(server: FakeProviderServer) -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-test", base_url=server.base_url + "/v1", max_retries=0,
                         timeout=30)


@pytest.fixture
def sdk(server: FakeProviderServer) -> openai.OpenAI:
    return sdk_for(server)


#: The recall tool on every request from the first (the default offers it once the window
#: holds something edited): these sessions are short, and their models call it.
POLICY = FoldPolicy(budget_tokens=32_000, recall_offer="always")


def agent_of(client: Client, policy: FoldPolicy | None = None) -> SessionHandle:
    return client.session("agent-openai", policy=policy or POLICY, system=SYSTEM)


def ledger_json(agent: SessionHandle, *, origin: str = "agent") -> list[dict[str, Any]]:
    return [e.message.to_json() for e in agent.ledger()
            if e.origin == origin and e.message is not None]


def as_ledger(history: list[Any]) -> list[dict[str, Any]]:
    """What the ledger holds for an OpenAI history: its Anthropic-shape conversion."""
    plain = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in history]
    return [m.to_json() for m in from_openai(plain).messages]


def run_tools(message: Any) -> list[dict[str, Any]]:
    """The agent's own tools: one ``tool`` message per call, as OpenAI agents send them."""
    return [{"role": "tool", "tool_call_id": call.id,
             "content": f"ran {json.loads(call.function.arguments)['cmd']}"}
            for call in message.tool_calls or [] if call.function.name == "bash"]


def test_a_plain_chat_loop_with_tool_calls_appends_only_what_is_new(
        client: Client, provider: FakeProvider, sdk: openai.OpenAI) -> None:
    agent = agent_of(client)
    llm = SessionOpenAI(sdk, agent)
    reports: list[Any] = []
    report = agent._report_usage  # every call's report goes through it

    def spy(usage: Any, *, seq: int, revision: int, model: str | None = None,
            unsent_tokens: int = 0) -> bool:
        reports.append(usage)
        return report(usage, seq=seq, revision=revision, model=model,
                      unsent_tokens=unsent_tokens)

    agent._report_usage = spy  # type: ignore[method-assign]
    provider.script_reply(["Two at once.", ToolUse("bash", {"cmd": "ls"}),
                           ToolUse("bash", {"cmd": "df -h"})], "Done.")
    history: list[Any] = [{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": "Check the disks."}]
    for _ in range(3):
        completion = llm.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
        message = completion.choices[0].message
        history.append(message)
        if completion.choices[0].finish_reason != "tool_calls":
            break
        history += run_tools(message)
    assert message.content == "Done." and len(history) == 6
    assert ledger_json(agent) == as_ledger(history)
    # The two tool messages are one user message of two results, in call order.
    results = ledger_json(agent)[2]["content"]
    assert [r["content"] for r in results] == ["ran ls", "ran df -h"]
    # The request is the window in OpenAI's shape, tools beside the recall tool.
    sent = provider.requests[-1]
    window = agent.window(recall=True)
    assert sent["messages"] == to_openai(Conversation(
        system=SYSTEM, messages=[i.message for i in window.items[:-1]]))
    assert [t["function"]["name"] for t in sent["tools"]] == ["bash", "sessionfold_recall"]
    # Usage went out as the provider counted it (OpenAI's prompt_tokens).
    assert [u.prompt_tokens for u in reports] == list(provider.stats.recent_prompt_tokens)


def test_a_history_or_system_message_that_differs_is_refused(
        client: Client, provider: FakeProvider, sdk: openai.OpenAI) -> None:
    agent = agent_of(client)
    llm = SessionOpenAI(sdk, agent)
    with pytest.raises(HistoryMismatchError, match="system= differs"):
        llm.chat.completions.create(model=MODEL, messages=[
            {"role": "system", "content": "Someone else."}, {"role": "user", "content": "hi"}])
    assert agent.ledger() == [] and provider.stats.calls == 0
    history: list[Any] = [{"role": "user", "content": "hi"}]  # no system message: the session's
    history.append(llm.chat.completions.create(model=MODEL, messages=history).choices[0].message)
    assert provider.requests[-1]["messages"][0] == {"role": "system", "content": SYSTEM}
    history.append({"role": "user", "content": "more"})
    changed = [{"role": "user", "content": "hello"}, *history[1:]]
    with pytest.raises(HistoryMismatchError, match="from message 0 on") as info:
        llm.chat.completions.create(model=MODEL, messages=changed)
    assert info.value.index == 0 and len(agent.ledger()) == 2


def test_a_system_message_later_in_the_history_is_a_message_not_the_prompt(
        client: Client, provider: FakeProvider, sdk: openai.OpenAI) -> None:
    """Only leading system messages are the prompt: a developer note the agent adds mid-run
    stays where it was said, and the history is not taken for one with another prompt."""
    agent = agent_of(client)
    llm = SessionOpenAI(sdk, agent)
    history: list[Any] = [{"role": "user", "content": "Check the disks."}]
    history.append(llm.chat.completions.create(model=MODEL, messages=history).choices[0].message)
    history += [{"role": "developer", "content": "Answer in French from now on."},
                {"role": "user", "content": "And the memory?"}]
    llm.chat.completions.create(model=MODEL, messages=history)
    assert ledger_json(agent)[:4] == as_ledger(history)
    assert "French" in json.dumps(ledger_json(agent)[2])
    assert provider.requests[-1]["messages"][0] == {"role": "system", "content": SYSTEM}


def test_a_chat_stream_carries_tool_calls_and_is_recorded_at_its_end(
        client: Client, provider: FakeProvider, sdk: openai.OpenAI) -> None:
    agent = agent_of(client, FoldPolicy(budget_tokens=32_000, recall=False))
    llm = SessionOpenAI(sdk, agent)
    provider.script_reply(["On it.", ToolUse("bash", {"cmd": "uptime"})])
    history: list[Any] = [{"role": "user", "content": "How long has it been up?"}]
    stream = llm.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                         stream=True)
    chunks = list(stream)
    assert all(chunk.choices for chunk in chunks)  # the caller did not ask for usage chunks
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    message = stream.message()
    assert message["content"] == "On it."
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "bash", "arguments": json.dumps({"cmd": "uptime"})}
    assert agent.calls == 1  # usage reported (the wrapper asked for it; the caller saw none)
    history += [message, {"role": "tool", "tool_call_id": call["id"], "content": "up 3 days"}]
    asked = llm.chat.completions.create(model=MODEL, messages=history, stream=True,
                                        stream_options={"include_usage": True})
    last = list(asked)[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == provider.stats.recent_prompt_tokens[-1]
    history.append(asked.message())
    assert ledger_json(agent) == as_ledger(history)


def test_overflow_folds_inline_and_retries_once(client: Client) -> None:
    provider = FakeProvider(context_window=12_000)
    # A budget past the stand-in's window: the request is under it, and refused.
    agent = agent_of(client, FoldPolicy(budget_tokens=100_000, recall=False))
    conversation = transcript_session("django__django-15554", 59)
    history = to_openai(Conversation(messages=conversation.messages))
    with provider.serve() as server:
        llm = SessionOpenAI(sdk_for(server), agent)
        completion = llm.chat.completions.create(model=MODEL, messages=history)
    assert completion.choices[0].message.content
    assert provider.stats.by_status == {400: 1, 200: 1}
    assert agent.inline_folds == 1
    record = client.store.records(agent.session_id)[-1]
    assert (record.trigger, record.measured_by) == ("overflow", "reported")
    tiny = FakeProvider(context_window=500)
    history += [completion.choices[0].message, {"role": "user", "content": "go on"}]
    with tiny.serve() as server, pytest.raises(ContextOverflowError) as info:
        SessionOpenAI(sdk_for(server), agent).chat.completions.create(model=MODEL,
                                                                      messages=history)
    assert isinstance(info.value.__cause__, openai.BadRequestError)
    assert tiny.stats.by_status == {400: 2}


def quotes_the_recall(request: Any) -> str:
    last = request["messages"][-1]["content"]
    results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"]
    return f"From the ledger: {results[0]['content'].splitlines()[0]}" if results else "Hm."


def test_recall_is_answered_for_create_and_for_a_stream(
        client: Client, provider: FakeProvider, sdk: openai.OpenAI) -> None:
    agent = agent_of(client)
    llm = SessionOpenAI(sdk, agent)
    provider.reply = quotes_the_recall
    provider.script_reply(ToolUse("sessionfold_recall", {"seq": "0"}))
    history: list[Any] = [{"role": "user", "content": "What was the task?"}]
    completion = llm.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    text = completion.choices[0].message.content or ""
    assert text.startswith("From the ledger: [sessionfold recall] ledger #0")
    assert agent.recall_rounds == 1 and provider.stats.succeeded == 2
    # The round's request answered the call as a tool message.
    answered = provider.requests[-1]["messages"]
    assert answered[-1]["role"] == "tool" and answered[-2]["tool_calls"][0]["function"][
        "name"] == "sessionfold_recall"
    history += [completion.choices[0].message, {"role": "user", "content": "once more"}]
    provider.script_reply(["Looking.", ToolUse("sessionfold_recall", {"seq": "0"})])
    stream = llm.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                         stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream)
    assert streamed.startswith("From the ledger:") and "Looking." not in streamed
    assert agent.recall_rounds == 2 and provider.stats.succeeded == 4
    assert [e.origin for e in agent.ledger()] == [
        "agent", "recall", "recall", "agent", "agent", "recall", "recall", "agent"]
    history.append(stream.message())
    assert ledger_json(agent) == as_ledger(history)


# --- a reply that cannot be recorded -------------------------------------------------------------

def spy_usage(agent: SessionHandle) -> list[int]:
    """Every usage report's prompt tokens, as the provider counted them."""
    reports: list[int] = []
    report = agent._report_usage  # every call's report goes through it

    def spy(usage: Any, *, seq: int, revision: int, model: str | None = None,
            unsent_tokens: int = 0) -> bool:
        reports.append(usage.prompt_tokens)
        return report(usage, seq=seq, revision=revision, model=model,
                      unsent_tokens=unsent_tokens)

    agent._report_usage = spy  # type: ignore[method-assign]
    return reports


def test_a_completion_that_cannot_be_recorded_is_raised_with_it_after_its_usage_went_out(
        client: Client, provider: FakeProvider, sdk: openai.OpenAI) -> None:
    agent = agent_of(client)
    reports = spy_usage(agent)
    provider.reply = deleting_the_session(client, agent.session_id)
    with pytest.raises(ReplyNotRecordedError) as raised:
        SessionOpenAI(sdk, agent).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "reconcile"}])
    error = raised.value
    assert isinstance(error.response, openai.types.chat.ChatCompletion)
    assert error.response.choices[0].message.content == "Reconciled 12 refunds."
    assert isinstance(error.__cause__, SessionNotFoundError) and "not recorded" in str(error)
    assert reports == list(provider.stats.recent_prompt_tokens)  # reported, once


def test_a_chat_stream_that_cannot_be_recorded_is_raised_at_its_end_with_its_message(
        client: Client, provider: FakeProvider, sdk: openai.OpenAI) -> None:
    agent = agent_of(client)
    reports = spy_usage(agent)
    provider.reply = deleting_the_session(client, agent.session_id)
    stream = SessionOpenAI(sdk, agent).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "reconcile"}], stream=True)
    chunks: list[Any] = []
    with pytest.raises(ReplyNotRecordedError) as raised:
        for chunk in stream:
            chunks.append(chunk)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Reconciled 12 refunds."
    assert raised.value.response == stream.message() == {"role": "assistant", "content": text}
    assert len(reports) == 1


def fixed_completion(message: dict[str, Any]) -> openai.OpenAI:
    """An OpenAI client whose every completion is ``message``, with its usage."""
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json={
            "id": f"chatcmpl-{len(request.content)}", "object": "chat.completion",
            "created": 1, "model": MODEL, "choices": [{
                "index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 512, "completion_tokens": 20, "total_tokens": 532}})
    return openai.OpenAI(api_key="sk-test", base_url="http://provider.invalid/v1",
                         max_retries=0, http_client=httpx2.Client(
                             transport=httpx2.MockTransport(handler)))


def recorded_or_carried(llm: SessionOpenAI, agent: SessionHandle) -> Any:
    """The completion of one call: returned (and then recorded) or carried by the error."""
    before = len(agent.ledger())
    try:
        completion = llm.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "run it"}])
    except ReplyNotRecordedError as error:
        assert isinstance(error.__cause__, InvalidMessageError)
        return error.response
    assert len(agent.ledger()) == before + 2  # the user message and the reply
    return completion


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "run", "arguments": '{"cmd": "ls -la /very/long/pa'}}]},
    {"role": "assistant", "content": None, "refusal": "I cannot help with that."},
], ids=["malformed-arguments", "refusal"])
def test_an_odd_completion_reaches_the_caller_recorded_or_carried_with_its_usage_reported(
        client: Client, message: dict[str, Any]) -> None:
    agent = agent_of(client)
    reports = spy_usage(agent)
    completion = recorded_or_carried(SessionOpenAI(fixed_completion(message), agent), agent)
    given = {k: v for k, v in message.items() if v is not None}
    assert completion.choices[0].message.model_dump(exclude_none=True) == given
    assert reports == [512]
