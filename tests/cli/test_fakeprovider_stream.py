"""The stand-in model streams as the Messages API does and speaks OpenAI's chat shape, as the
real ``anthropic`` and ``openai`` SDKs see it (over HTTP and in process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from sessionfold.cli.standin.fakeprovider import FakeProvider, FakeProviderServer, Fault, ToolUse
from sessionfold.core.overflow import is_context_overflow, overflow_tokens


def _request(text: str) -> Any:
    return [{"role": "user", "content": text}]


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(keep_requests=10)


@pytest.fixture
def server(provider: FakeProvider) -> Iterator[FakeProviderServer]:
    with provider.serve() as running:
        yield running


@pytest.fixture
def claude(server: FakeProviderServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-test", base_url=server.base_url, max_retries=0,
                               timeout=10)


@pytest.fixture
def gpt(server: FakeProviderServer) -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-test", base_url=server.base_url + "/v1", max_retries=0,
                         timeout=10)


# --- the Messages API, streamed ----------------------------------------------------------------

def test_a_streamed_reply_comes_as_the_apis_events_and_adds_up_to_the_plain_reply(
        provider: FakeProvider, claude: anthropic.Anthropic) -> None:
    text = "a question long enough to be sent back in several deltas " * 3
    plain = claude.messages.create(model="m", max_tokens=64, messages=_request(text))
    with claude.messages.stream(model="m", max_tokens=64, messages=_request(text)) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(deltas) > 3 and "".join(deltas) == final.content[0].text == plain.content[0].text
    assert final.stop_reason == "end_turn" and final.id.startswith("msg_")
    assert final.usage.input_tokens == plain.usage.input_tokens
    assert final.usage.output_tokens == plain.usage.output_tokens > 1
    raw = list(claude.messages.create(model="m", max_tokens=64, messages=_request(text),
                                      stream=True))
    kinds = [event.type for event in raw]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert set(kinds[2:-3]) == {"content_block_delta"}
    start, delta = raw[0], raw[-2]
    assert start.type == "message_start" and delta.type == "message_delta"
    assert start.message.usage.input_tokens == plain.usage.input_tokens
    assert start.message.usage.cache_read_input_tokens == 0  # the cache fields are there
    assert delta.delta.stop_reason == "end_turn"
    assert delta.usage.output_tokens == plain.usage.output_tokens


def test_a_streamed_tool_call_arrives_as_input_json_deltas(
        provider: FakeProvider, claude: anthropic.Anthropic) -> None:
    tool_input = {"cmd": "grep -rn ACCT-90417 /var/log/billing/ --include='*.log'"}
    provider.script_reply(["Looking.", ToolUse("bash", tool_input, id="toolu_mine")],
                          ToolUse("bash", tool_input))
    with claude.messages.stream(model="m", max_tokens=64, messages=_request("go")) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    call = final.content[1]
    assert call.type == "tool_use" and (call.id, call.name) == ("toolu_mine", "bash")
    assert call.input == tool_input
    pieces = [e.delta.partial_json for e in events
              if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(pieces) > 2 and json.loads("".join(pieces)) == tool_input
    raw = list(claude.messages.create(model="m", max_tokens=64, messages=_request("go"),
                                      stream=True))
    started = [e for e in raw if e.type == "content_block_start"]
    assert started[0].content_block.type == "tool_use"
    assert started[0].content_block.id.startswith("toolu_")


def test_events_are_written_as_sse_frames_one_chunk_each(server: FakeProviderServer) -> None:
    body = {"model": "m", "max_tokens": 8, "stream": True, "messages": _request("hi")}
    with httpx2.stream("POST", f"{server.base_url}/v1/messages", json=body) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert answer.headers["transfer-encoding"] == "chunked"
        frames = [line for line in answer.iter_lines() if line]
    names = [f.removeprefix("event: ") for f in frames if f.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-1] == "message_stop"
    data = [json.loads(f.removeprefix("data: ")) for f in frames if f.startswith("data: ")]
    assert [d["type"] for d in data] == names  # every event names its type twice, as the API


def test_a_streamed_request_too_long_is_refused_before_any_event(
        provider: FakeProvider, claude: anthropic.Anthropic) -> None:
    small = FakeProvider(context_window=1_000)
    with pytest.raises(anthropic.BadRequestError) as info, small.anthropic_client().messages.stream(
            model="m", max_tokens=8, messages=_request("word " * 2_000)):
        pass
    assert is_context_overflow(info.value)
    provider.script(Fault.overloaded())
    with pytest.raises(anthropic.OverloadedError):
        claude.messages.create(model="m", max_tokens=8, messages=_request("x"), stream=True)
    assert provider.stats.by_status[529] == 1


def test_a_streamed_reply_reports_the_prompt_cache_as_a_plain_one_does(
        claude: anthropic.Anthropic) -> None:
    head = {"type": "text", "text": "stable head " * 200, "cache_control": {"type": "ephemeral"}}
    messages: Any = [{"role": "user", "content": [head]}, {"role": "assistant", "content": "ok"},
                     {"role": "user", "content": "next"}]
    usages = []
    for _ in range(2):
        with claude.messages.stream(model="m", max_tokens=8, messages=messages) as stream:
            usages.append(stream.get_final_message().usage)
    first, second = usages
    assert first.cache_creation_input_tokens and not first.cache_read_input_tokens
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert not second.cache_creation_input_tokens


def test_the_in_process_client_streams_too(provider: FakeProvider) -> None:
    with provider.anthropic_client().messages.stream(
            model="m", max_tokens=8, messages=_request("in process")) as stream:
        text = "".join(stream.text_stream)
    assert "in process" in text and provider.stats.succeeded == 1


# --- OpenAI chat completions -------------------------------------------------------------------

def test_chat_completions_answer_the_openai_sdk_with_text_and_tool_calls(
        provider: FakeProvider, gpt: openai.OpenAI) -> None:
    provider.script_reply(["Checking.", ToolUse("bash", {"cmd": "ls"})])
    tools: Any = [{"type": "function", "function": {
        "name": "bash", "description": "run", "parameters": {"type": "object"}}}]
    asked: Any = [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "list the files"}]
    reply = gpt.chat.completions.create(model="gpt-test", messages=asked, tools=tools)
    (choice,) = reply.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("bash", {"cmd": "ls"})
    assert reply.model == "gpt-test" and reply.usage is not None
    # The prompt is counted as the Messages request it amounts to, tools included.
    converted = {"system": "You are terse.", "messages": _request("list the files"),
                 "tools": [{"name": "bash", "description": "run",
                            "input_schema": {"type": "object"}}]}
    assert reply.usage.prompt_tokens == provider.count_tokens(converted)
    assert reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert provider.requests[-1]["messages"] == asked  # kept as it was sent
    # The tool's answer goes back as a tool message; the reply callback reads it as a
    # tool_result.
    follow: Any = [*asked, choice.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "a.txt b.txt"}]
    done = gpt.chat.completions.create(model="gpt-test", messages=follow, tools=tools)
    assert done.choices[0].finish_reason == "stop"
    assert done.choices[0].message.content == "Noted (3 messages). Latest: a.txt b.txt"


def test_a_chat_stream_ends_with_done_and_carries_usage_only_when_asked(
        provider: FakeProvider, gpt: openai.OpenAI) -> None:
    provider.script_reply(["Two calls:", ToolUse("bash", {"cmd": "ls -la /srv/app"}),
                           ToolUse("read", {"path": "/etc/hosts"})],
                          ["Two calls:", ToolUse("bash", {"cmd": "ls -la /srv/app"}),
                           ToolUse("read", {"path": "/etc/hosts"})])
    plain = list(gpt.chat.completions.create(model="m", messages=_request("go"), stream=True))
    assert all(chunk.choices for chunk in plain)  # no usage chunk unless asked for
    assert plain[-1].choices[0].finish_reason == "tool_calls"
    text = "".join(c.choices[0].delta.content or "" for c in plain)
    arguments: dict[int, str] = {}
    names: dict[int, str] = {}
    for chunk in plain:
        for call in chunk.choices[0].delta.tool_calls or []:
            if call.function and call.function.name:
                names[call.index] = call.function.name
            arguments[call.index] = arguments.get(call.index, "") + (
                call.function.arguments or "" if call.function else "")
    assert text == "Two calls:" and names == {0: "bash", 1: "read"}
    assert json.loads(arguments[0]) == {"cmd": "ls -la /srv/app"}
    assert json.loads(arguments[1]) == {"path": "/etc/hosts"}
    counted = list(gpt.chat.completions.create(model="m", messages=_request("go"), stream=True,
                                               stream_options={"include_usage": True}))
    last = counted[-1]
    assert last.choices == [] and last.usage is not None and last.usage.prompt_tokens > 0
    assert all(chunk.usage is None for chunk in counted[:-1])


def test_a_chat_stream_is_sse_data_frames_ending_with_done(server: FakeProviderServer) -> None:
    body = {"model": "m", "stream": True, "messages": _request("hi")}
    with httpx2.stream("POST", f"{server.base_url}/v1/chat/completions", json=body) as answer:
        frames = [line for line in answer.iter_lines() if line]
    assert all(f.startswith("data: ") for f in frames) and frames[-1] == "data: [DONE]"
    assert json.loads(frames[0].removeprefix("data: "))["object"] == "chat.completion.chunk"


def test_a_chat_request_too_long_gets_openais_context_length_exceeded(
        provider: FakeProvider, server: FakeProviderServer) -> None:
    small = FakeProvider(context_window=1_000)
    with small.serve() as other:
        gpt = openai.OpenAI(api_key="sk", base_url=other.base_url + "/v1", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            gpt.chat.completions.create(model="m", messages=_request("word " * 2_000))
    assert info.value.code == "context_length_exceeded"
    assert is_context_overflow(info.value)
    sent = small.stats.max_prompt_tokens
    assert overflow_tokens(info.value) == (sent, 1_000)


def test_a_chat_prompt_cache_is_automatic_on_the_longest_prefix_seen(
        gpt: openai.OpenAI) -> None:
    history: Any = [{"role": "system", "content": "S " * 50},
                    {"role": "user", "content": "a long first turn " * 400}]
    first = gpt.chat.completions.create(model="m", messages=history)
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "and then?"}]
    second = gpt.chat.completions.create(model="m", messages=history)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= 1024 and cached % 128 == 0
    assert cached < second.usage.prompt_tokens


def test_a_malformed_chat_request_gets_openais_error_shape(server: FakeProviderServer) -> None:
    orphan = {"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_x", "content": "nobody asked"}]}
    answer = httpx2.post(f"{server.base_url}/v1/chat/completions", json=orphan)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and "message" in error
    empty = httpx2.post(f"{server.base_url}/v1/chat/completions", json={"model": "m"})
    assert empty.status_code == 400 and "messages" in empty.json()["error"]["message"]
