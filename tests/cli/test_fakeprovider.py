"""The scripted provider behaves like the Anthropic Messages API as the real SDK sees it."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from sessionfold.cli.files import load_conversation_file
from sessionfold.cli.standin.fakeprovider import FakeProvider, Fault, ToolUse
from sessionfold.core.retention import check_retention, extract_identifiers
from sessionfold.core.tokens import default_counter
from sessionfold.runtime.providers.anthropic import AnthropicSummarizer

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"


def _request(text: str) -> Any:  # the SDK's MessageParam list, as plain JSON
    return [{"role": "user", "content": text}]


def test_usage_is_counted_by_its_own_ratio_not_the_estimator() -> None:
    conv = load_conversation_file(TRANSCRIPTS / "django__django-15554.json")
    messages = [m.to_json() for m in conv.messages[:40]]
    provider = FakeProvider(context_window=1_000_000, chars_per_token=3.6, overhead_tokens=400)
    reply = provider(conv.system, messages)
    reported = reply.usage.input_tokens
    estimate = default_counter().messages(conv.messages[:40]) + default_counter().system(
        conv.system)
    assert reported == provider.count_tokens({"system": conv.system, "messages": messages})
    # Calibration has something to learn: the two counts differ by more than rounding.
    assert abs(reported - estimate) > 0.05 * estimate
    # The fixed overhead is in every count: an empty-ish request costs at least that.
    assert provider("", _request("hi")).usage.input_tokens >= 400


def test_request_over_the_context_window_gets_anthropics_own_400() -> None:
    provider = FakeProvider(context_window=2_000)
    with pytest.raises(anthropic.BadRequestError) as info:
        provider("", _request("word " * 5_000))
    err = info.value
    assert err.status_code == 400
    assert err.type == "invalid_request_error"
    n = provider.stats.max_prompt_tokens
    assert err.api_message == f"prompt is too long: {n} tokens > 2000 maximum"
    assert err.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {n} tokens > 2000 maximum"}}
    # A request that fits still succeeds afterwards.
    assert provider("", _request("short")).usage.input_tokens < 2_000


def test_script_answers_529_three_times_then_serves() -> None:
    provider = FakeProvider()
    provider.script(Fault.overloaded(), Fault.overloaded(), Fault.overloaded())
    for _ in range(3):
        with pytest.raises(anthropic.OverloadedError):
            provider("", _request("x"))
    assert provider("", _request("x")).content[0].type == "text"
    assert provider.stats.by_status[529] == 3
    assert provider.stats.succeeded == 1


def test_rate_limit_carries_retry_after_and_bad_request_can_be_permanent() -> None:
    provider = FakeProvider()
    provider.script(Fault.rate_limited(retry_after=2))
    with pytest.raises(anthropic.RateLimitError) as info:
        provider("", _request("x"))
    assert info.value.response.headers["retry-after"] == "2"
    provider.fail_always(Fault.bad_request())
    for _ in range(2):
        with pytest.raises(anthropic.BadRequestError):
            provider("", _request("x"))
    provider.fail_always(None)
    provider("", _request("x"))


def test_http_server_speaks_the_messages_api_to_the_real_sdk() -> None:
    provider = FakeProvider()
    provider.script(Fault.overloaded(), Fault.overloaded())
    with provider.serve() as server:
        # The SDK's own retries (2 by default) ride through two 529s.
        client = anthropic.Anthropic(api_key="sk-test", base_url=server.base_url, max_retries=2,
                                     timeout=10)
        reply = client.messages.create(model="claude-test", max_tokens=64,
                                       messages=_request("hello over http"))
        counted = client.messages.count_tokens(model="claude-test",
                                               messages=_request("hello over http"))
    assert provider.stats.calls == 3
    assert reply.model == "claude-test"
    assert reply.usage.input_tokens == counted.input_tokens


def test_prompt_cache_splits_the_same_total() -> None:
    provider = FakeProvider()
    head = {"type": "text", "text": "stable head " * 200, "cache_control": {"type": "ephemeral"}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": [head]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "next question"}]
    first = provider("sys", messages).usage
    second = provider("sys", messages).usage
    assert first.cache_creation_input_tokens and not first.cache_read_input_tokens
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    total = [u.input_tokens + (u.cache_read_input_tokens or 0)
             + (u.cache_creation_input_tokens or 0) for u in (first, second)]
    assert total[0] == total[1] == provider.count_tokens({"system": "sys", "messages": messages})


def test_a_breakpoint_moved_on_reads_the_prefix_cached_before_and_writes_the_rest() -> None:
    # As the Messages API bills it: the marker is not part of the content, and a breakpoint
    # finds a prefix cached at an earlier block (up to 20 back).
    provider = FakeProvider()
    mark = {"type": "ephemeral"}
    first = provider("sys", [
        {"role": "user", "content": [{"type": "text", "text": "task " * 300,
                                      "cache_control": mark}]},
        {"role": "assistant", "content": "on it " * 50}]).usage
    assert first.cache_creation_input_tokens and not first.cache_read_input_tokens
    grown = [{"role": "user", "content": "task " * 300},
             {"role": "assistant", "content": [{"type": "text", "text": "on it " * 50}]},
             {"role": "user", "content": [{"type": "text", "text": "next " * 40,
                                           "cache_control": mark}]}]
    second = provider("sys", grown).usage
    whole = provider.count_tokens({"system": "sys", "messages": grown})
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert second.cache_creation_input_tokens
    assert (second.input_tokens + second.cache_read_input_tokens
            + second.cache_creation_input_tokens) == whole
    # Past the look-back, nothing is found: the whole prefix is written again.
    far = [grown[0], *[{"role": "assistant" if i % 2 == 0 else "user", "content": f"m{i}"}
                       for i in range(22)],
           {"role": "assistant", "content": [{"type": "text", "text": "end",
                                              "cache_control": mark}]}]
    third = provider("sys", far).usage
    assert not third.cache_read_input_tokens and third.cache_creation_input_tokens


def test_bad_json_and_unknown_routes_are_errors_not_crashes() -> None:
    provider = FakeProvider()
    assert provider.handle("/v1/nothing", {})[0] == 404
    status, _, body = provider.handle("/v1/messages", {"messages": "not a list"})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, _, body = provider.handle("/v1/messages", {"messages": [{"role": "system",
                                                                     "content": "x"}]})
    assert status == 400 and "role" in body["error"]["message"]
    with provider.serve() as server:
        answer = httpx2.post(f"{server.base_url}/v1/messages", content=b"{not json",
                             headers={"content-type": "application/json"})
    assert answer.status_code == 400 and json.loads(answer.content)["type"] == "error"


def test_summarizer_requests_get_summaries_that_keep_identifiers() -> None:
    conv = load_conversation_file(TRANSCRIPTS / "django__django-15554.json")
    span = conv.messages[1:40]
    keep = extract_identifiers(span)
    assert keep  # the span names files a summary must keep
    summarizer = AnthropicSummarizer(client=FakeProvider().anthropic_client())
    asked = summarizer.summarize(span, must_keep=["ACCT-8842", *keep])
    assert all(identifier in asked.text for identifier in ["ACCT-8842", *keep])
    # Unasked, it keeps the transcript's identifiers verbatim, as the instruction says.
    unasked = summarizer.summarize(span)
    assert check_retention(unasked.text, keep, 0.8).ok and "ACCT-8842" not in unasked.text
    assert len(unasked.text) < sum(len(m.text()) for m in span)
    assert unasked.usage.calls == 1 and unasked.usage.input_tokens > 0


def test_held_calls_wait_in_flight_until_released() -> None:
    provider = FakeProvider()
    provider.hold()
    replies: list[Any] = []
    with provider.serve() as server:
        client = anthropic.Anthropic(api_key="sk-test", base_url=server.base_url, max_retries=0)
        thread = threading.Thread(target=lambda: replies.append(client.messages.create(
            model="m", max_tokens=8, messages=_request("wait for me"))))
        thread.start()
        assert provider.wait_for_calls(1, timeout_s=30)
        thread.join(timeout=0.2)
        assert thread.is_alive() and replies == []  # in flight, not answered
        provider.release()
        thread.join(timeout=30)
    assert len(replies) == 1 and provider.stats.succeeded == 1
    assert not provider.wait_for_calls(2, timeout_s=0.1)


def test_a_scripted_tool_call_comes_back_as_the_apis_tool_use_reply() -> None:
    provider = FakeProvider(keep_requests=5)
    provider.script_reply(ToolUse("sessionfold_recall", {"query": "ACCT-90417"}),
                          ["Two things:", ToolUse("bash", {"cmd": "ls"}, id="toolu_mine"),
                           ToolUse("sessionfold_recall", {"seq": "2"})])
    tools = [{"name": "sessionfold_recall", "description": "d",
              "input_schema": {"type": "object", "properties": {}}}]
    first = provider("sys", _request("where is the account?"), tools=tools)
    assert first.stop_reason == "tool_use" and first.usage.output_tokens > 0
    (call,) = first.content
    assert call.type == "tool_use" and call.name == "sessionfold_recall"
    assert call.input == {"query": "ACCT-90417"} and call.id.startswith("toolu_")
    second = provider("sys", _request("and?"))
    assert [b.type for b in second.content] == ["text", "tool_use", "tool_use"]
    assert second.content[1].id == "toolu_mine" and second.content[2].id != call.id
    third = provider("sys", _request("thanks"))  # the script is used up: text again
    assert third.stop_reason == "end_turn" and third.content[0].type == "text"
    assert provider.requests[0]["tools"] == tools and len(provider.requests) == 3


def test_a_summarizer_request_leaves_the_script_to_the_agent() -> None:
    provider = FakeProvider()
    provider.script_reply(ToolUse("sessionfold_recall", {"seq": "1"}))
    conv = load_conversation_file(TRANSCRIPTS / "django__django-15554.json")
    summary = AnthropicSummarizer(client=provider.anthropic_client()).summarize(
        conv.messages[1:10])
    assert summary.text  # a summary, not a tool call
    assert provider("sys", _request("next")).stop_reason == "tool_use"


def test_a_reply_callback_decides_tool_calls_from_the_request() -> None:
    def model(request: Any) -> Any:
        last = request["messages"][-1]
        if isinstance(last["content"], list):  # a tool result came back: answer in text
            return "got " + last["content"][0]["content"]
        return ToolUse("lookup", {"q": last["content"]})

    provider = FakeProvider(reply=model)
    reply = provider("sys", _request("ACCT-1"))
    assert reply.content[0].input == {"q": "ACCT-1"}
    done = provider("sys", [*_request("ACCT-1"),
                            {"role": "assistant", "content": [b.to_dict() for b in reply.content]},
                            {"role": "user", "content": [{"type": "tool_result",
                                                          "tool_use_id": reply.content[0].id,
                                                          "content": "found"}]}])
    assert done.content[0].text == "got found" and done.stop_reason == "end_turn"
