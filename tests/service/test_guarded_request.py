"""The guarded request over HTTP (``POST .../call`` and ``.../call/reply``): the client's call
loop served one step per request, on SQLite and PostgreSQL. The request is the one
``SessionHandle.call`` sends, the hard cap refuses what cannot fit (naming the message), recall
calls are answered in the model's own shape, an overflow folds inline once, and the call's state
travels with it, so another API process answers the reply."""

from __future__ import annotations

import base64
import contextlib
import io
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from conftest import LiveApi, serving
from PIL import Image
from sessionfold.client import anthropic_tool, connect, openai_tool
from sessionfold.core.policy import FoldPolicy
from sessionfold.service import create_app
from sessionfold.service.tenancy import store_id

SYSTEM = "You reconcile refunds. Cite ticket ids."
ACCOUNT = "ACCT-90417"
TOO_LONG = {"type": "error", "error": {"type": "invalid_request_error",
                                       "message": "prompt is too long: 9000 tokens > 3000 maximum"}}


def page(n: int, words: int = 400) -> str:
    return f"refunds.log page {n}: " + " ".join(f"REF-{n}-{i} ok" for i in range(words))


def tool_turn(n: int, words: int = 400) -> list[dict[str, Any]]:
    call_id = f"toolu_read_{n:03d}"
    return [{"role": "assistant", "content": [
                {"type": "tool_use", "id": call_id, "name": "read_log", "input": {"page": n}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": page(n, words)}]}]


def make_session(http: Any, sid: str, policy: dict[str, Any], *, pages: int = 0,
                 words: int = 400, system: str = SYSTEM) -> None:
    made = http.post("/v1/sessions", json={"id": sid, "policy": policy, "system": system})
    assert made.status_code == 201, made.text
    messages = [{"role": "user", "content": f"Reconcile the refunds of {ACCOUNT}."}]
    for n in range(pages):
        messages += tool_turn(n, words)
    assert http.post(f"/v1/sessions/{sid}/messages",
                     json={"messages": messages}).status_code == 201


def message_reply(reply_id: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    """A Messages API response, as the SDK's JSON."""
    return {"id": reply_id, "type": "message", "role": "assistant", "model": "claude-x",
            "content": list(blocks), "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 2100, "output_tokens": 20}}


def recall_use(call_id: str, **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "sessionfold_recall", "input": tool_input}


def chat_reply(reply_id: str, message: dict[str, Any]) -> dict[str, Any]:
    """A chat completion, as the SDK's JSON."""
    return {"id": reply_id, "object": "chat.completion", "model": "gpt-x",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2100, "completion_tokens": 20}}


def reply_to(http: Any, sid: str, call: dict[str, Any], **body: Any) -> Any:
    return http.post(f"/v1/sessions/{sid}/call/reply", json={"call": call, **body})


# --- the request -----------------------------------------------------------------------------

def test_the_guarded_request_is_the_one_session_handle_call_sends(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 4000, "keep_recent_turns": 1}, pages=4)
    answer = http.post("/v1/sessions/agent-1/call", json={"over_budget": "shrink"})
    assert answer.status_code == 200, answer.text
    request = answer.json()

    handle = api.client.session(store_id("acme", "agent-1"))
    loop = handle.open_call(over_budget="shrink", cache_breakpoints=True)
    step = loop.start()
    assert request["messages"] == step.view.messages
    assert request["system"] == SYSTEM and request["tools"] == step.tools() == [anthropic_tool()]
    assert request["call"] == loop.state.to_json()
    guard = request["guard"]
    # Four pages of ~2,000 tokens do not fit a 4,000-token budget: shrunk on the request alone.
    assert guard["outcome"] == "shrunk" and guard["unsent_tokens"] > 0
    assert guard["tokens"] <= guard["limit_tokens"] < guard["budget_tokens"] == 4000
    assert api.store.get_session(store_id("acme", "agent-1")).ledger_len == 9  # untouched


def test_under_the_cap_a_late_window_is_folded_inline_first(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 4000, "keep_recent_turns": 1}, pages=4)
    request = http.post("/v1/sessions/agent-1/call", json={}).json()
    guard = request["guard"]
    assert guard["outcome"] == "folded" and guard["inline_folds"] == 1
    assert guard["tokens"] <= guard["limit_tokens"]
    info = api.store.get_session(store_id("acme", "agent-1"))
    assert info.fold_revision > 0 and guard["revision"] == info.revision


def test_a_window_under_its_budget_goes_as_stored_without_the_recall_tool(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 16000})
    request = http.post("/v1/sessions/agent-1/call", json={"shape": "openai"}).json()
    assert request["guard"]["outcome"] == "under" and request["guard"]["unsent_tokens"] == 0
    # Nothing in it was edited, so nothing can be recalled: no tool to pay for.
    assert request["tools"] == []
    assert request["messages"] == [{"role": "system", "content": SYSTEM},
                                   {"role": "user",
                                    "content": f"Reconcile the refunds of {ACCOUNT}."}]


def test_the_recall_tool_definition_is_served_in_both_shapes(api: LiveApi) -> None:
    answer = api.http(api.key("acme")).get("/v1/recall-tool")
    assert answer.status_code == 200
    assert answer.json() == {"name": "sessionfold_recall", "version": 1,
                             "anthropic": anthropic_tool(), "openai": openai_tool()}


def test_a_request_that_cannot_fit_is_refused_naming_the_message(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    http.post("/v1/sessions", json={"id": "agent-1", "policy": {"budget_tokens": 1000},
                                    "system": SYSTEM})
    # An image is never cut: its ~1,600 tokens cannot go under a 1,000-token budget.
    image = io.BytesIO()
    Image.new("RGB", (1500, 1500), "white").save(image, format="PNG")
    data = base64.b64encode(image.getvalue()).decode()
    http.post("/v1/sessions/agent-1/messages", json={"messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is on it?"},
                                     {"type": "image", "source": {
                                         "type": "base64", "media_type": "image/png",
                                         "data": data}}]}]})
    refused = http.post("/v1/sessions/agent-1/call", json={})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["reason"] == "budget-exceeded" and error["seq"] == 0
    assert error["budget_tokens"] == 1000 and error["tokens"] > 1000
    assert "message #0" in error["message"] and "tenant:" not in error["message"]
    sent_anyway = http.post("/v1/sessions/agent-1/call", json={"over_budget": "send"}).json()
    assert sent_anyway["guard"]["outcome"] == "over-budget"


# --- replies ---------------------------------------------------------------------------------

def test_a_recall_only_reply_is_answered_and_the_next_request_carries_it(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 16000, "recall_offer": "always"}, pages=1)
    request = http.post("/v1/sessions/agent-1/call", json={}).json()
    assert request["tools"] == [anthropic_tool()]
    step = reply_to(http, "agent-1", request["call"],
                    reply=message_reply("msg_1", recall_use("toolu_r1", query=ACCOUNT)))
    assert step.status_code == 200, step.text
    answer = step.json()
    assert answer["next"] == "send" and answer["request"]["call"]["rounds"] == 1
    assert [r["outcome"] for r in answer["recall"]] == ["served"]
    exchange = answer["request"]["messages"][-2:]
    assert exchange[0]["content"][0]["id"] == "toolu_r1"
    result = exchange[1]["content"][0]
    assert result["tool_use_id"] == "toolu_r1" and ACCOUNT in str(result["content"])

    done = reply_to(http, "agent-1", answer["request"]["call"],
                    reply=message_reply("msg_2", {"type": "text", "text": "All reconciled."}))
    assert done.json() == {"next": "done", "request": None, "recorded_seq": 5, "recall": [],
                           "tool_results": []}
    ledger = api.store.read_ledger(store_id("acme", "agent-1"))
    assert [e.origin for e in ledger[3:]] == ["recall", "recall", "agent"]


def test_in_the_openai_shape_recall_is_answered_as_a_tool_message(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 16000, "recall_offer": "always"}, pages=1)
    request = http.post("/v1/sessions/agent-1/call", json={"shape": "openai"}).json()
    assert request["tools"] == [openai_tool()]
    assert request["messages"][0] == {"role": "system", "content": SYSTEM}
    recall_call = {"content": None, "tool_calls": [
        {"id": "call_r1", "type": "function",
         "function": {"name": "sessionfold_recall", "arguments": f'{{"query": "{ACCOUNT}"}}'}}]}
    step = reply_to(http, "agent-1", request["call"], shape="openai",
                    reply=chat_reply("chatcmpl-1", recall_call)).json()
    assert step["next"] == "send"
    tool_message = step["request"]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_r1"
    assert ACCOUNT in tool_message["content"]
    done = reply_to(http, "agent-1", step["request"]["call"], shape="openai",
                    reply=chat_reply("chatcmpl-2", {"content": "Done."})).json()
    assert done["next"] == "done"
    last = api.store.read_ledger(store_id("acme", "agent-1"))[-1].message
    assert last is not None and last.to_json() == {"role": "assistant", "content": [
        {"type": "text", "text": "Done."}]}


def test_a_reply_mixing_recall_with_own_tools_gets_the_answers_in_its_own_shape(
        api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 16000, "recall_offer": "always"}, pages=1)
    call = http.post("/v1/sessions/agent-1/call", json={"shape": "openai"}).json()["call"]
    mixed = {"content": None, "tool_calls": [
        {"id": "call_own", "type": "function",
         "function": {"name": "read_log", "arguments": '{"page": 2}'}},
        {"id": "call_r", "type": "function",
         "function": {"name": "sessionfold_recall", "arguments": '{"seq": "2"}'}}]}
    done = reply_to(http, "agent-1", call, shape="openai",
                    reply=chat_reply("chatcmpl-1", mixed)).json()
    assert done["next"] == "done" and [r["kind"] for r in done["recall"]] == ["seq"]
    (answer,) = done["tool_results"]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_r"
    assert "REF-0-1 ok" in answer["content"]
    # The caller's next message: its own result beside the answer, in one append.
    appended = http.post("/v1/sessions/agent-1/messages", json={"shape": "openai", "messages": [
        {"role": "tool", "tool_call_id": "call_own", "content": page(2, 10)}, answer]})
    assert appended.status_code == 201, appended.text


def test_a_reply_posted_again_is_recorded_once(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 16000})
    call = http.post("/v1/sessions/agent-1/call", json={}).json()["call"]
    reply = message_reply("msg_once", {"type": "text", "text": "Checked."})
    first = reply_to(http, "agent-1", call, reply=reply).json()
    again = reply_to(http, "agent-1", call, reply=reply).json()
    assert first["recorded_seq"] == again["recorded_seq"] == 1
    assert api.store.get_session(store_id("acme", "agent-1")).ledger_len == 2


def test_the_last_round_s_recall_only_reply_goes_back_with_its_answers(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    policy = {"budget_tokens": 16000, "recall_offer": "always", "recall_max_rounds": 1}
    make_session(http, "agent-1", policy, pages=1)
    call = http.post("/v1/sessions/agent-1/call", json={}).json()["call"]
    step = reply_to(http, "agent-1", call,
                    reply=message_reply("msg_1", recall_use("toolu_r1", query="REF-0-7"))).json()
    assert step["next"] == "send"
    done = reply_to(http, "agent-1", step["request"]["call"],
                    reply=message_reply("msg_2", recall_use("toolu_r2", seq="1"))).json()
    # The round count came back with the call: no round is left, so the reply is the call's.
    assert done["next"] == "done"
    (result,) = done["tool_results"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_r2"


# --- errors of the model call ------------------------------------------------------------------

def test_an_overflow_folds_inline_once_and_a_second_is_a_context_overflow(
        api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 16000, "keep_recent_turns": 1}, pages=5)
    request = http.post("/v1/sessions/agent-1/call", json={}).json()
    retry = reply_to(http, "agent-1", request["call"], error={"status": 400, "body": TOO_LONG})
    assert retry.status_code == 200, retry.text
    step = retry.json()
    assert step["next"] == "send" and step["request"]["call"]["retried"] is True
    assert step["request"]["guard"]["outcome"] == "folded"
    assert step["request"]["guard"]["inline_folds"] == 1
    assert step["request"]["guard"]["revision"] > request["guard"]["revision"]
    again = reply_to(http, "agent-1", step["request"]["call"],
                     error={"status": 400, "body": TOO_LONG})
    assert again.status_code == 400
    error = again.json()["error"]
    assert error["reason"] == "context-overflow"
    assert "prompt is too long: 9000 tokens" in error["message"]
    assert "tenant:" not in error["message"]


def test_an_error_that_is_no_overflow_is_the_callers_to_raise(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 16000})
    call = http.post("/v1/sessions/agent-1/call", json={}).json()["call"]
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    step = reply_to(http, "agent-1", call, error={"status": 529, "body": overloaded})
    assert step.json()["next"] == "raise"
    # Even a "too long" text is no overflow under a status that cannot mean one.
    step = reply_to(http, "agent-1", call, error={"status": 429, "body": TOO_LONG})
    assert step.json()["next"] == "raise"


@pytest.mark.parametrize("tampered", [
    {"phase": "done"}, {"rounds": -1}, {"unknown": 1}, {"version": 2}, {"rounds": True}])
def test_a_call_state_that_is_not_as_written_is_refused(api: LiveApi,
                                                        tampered: dict[str, Any]) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 16000})
    call = http.post("/v1/sessions/agent-1/call", json={}).json()["call"]
    answer = reply_to(http, "agent-1", {**call, **tampered},
                      reply=message_reply("msg_1", {"type": "text", "text": "ok"}))
    assert answer.status_code == 422, answer.text
    assert api.store.get_session(store_id("acme", "agent-1")).ledger_len == 1


# --- any API process -----------------------------------------------------------------------------

@contextlib.contextmanager
def second_api(api: LiveApi) -> Iterator[str]:
    """Another API process on the same store and Redis (its own client and app)."""
    client = connect(api.settings)
    try:
        with serving(create_app(api.settings, client=client), api.settings) as url:
            yield url
    finally:
        client.close()


def test_any_api_process_answers_the_reply(api: LiveApi) -> None:
    key = api.key("acme")
    http = api.http(key)
    make_session(http, "agent-1", {"budget_tokens": 16000, "recall_offer": "always"}, pages=1)
    call = http.post("/v1/sessions/agent-1/call", json={}).json()["call"]
    with second_api(api) as url:
        with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                           timeout=60.0) as other:
            step = reply_to(other, "agent-1", call,
                            reply=message_reply("msg_1", recall_use("toolu_r1", query=ACCOUNT)))
        assert step.status_code == 200, step.text
        answer = step.json()
    assert answer["next"] == "send" and answer["recall"][0]["outcome"] == "served"
    done = reply_to(http, "agent-1", answer["request"]["call"],
                    reply=message_reply("msg_2", {"type": "text", "text": "Done."})).json()
    assert done["next"] == "done" and done["recorded_seq"] == 5


def test_the_policy_is_read_again_at_each_step(api: LiveApi) -> None:
    """The call carries no policy: a reply is guarded by the session's policy as it is now."""
    http = api.http(api.key("acme"))
    make_session(http, "agent-1", {"budget_tokens": 16000, "recall_offer": "always"}, pages=2)
    call = http.post("/v1/sessions/agent-1/call", json={}).json()["call"]
    api.store.set_policy(store_id("acme", "agent-1"),
                         FoldPolicy(budget_tokens=2000, keep_recent_turns=1,
                                    recall_offer="always"))
    step = reply_to(http, "agent-1", call,
                    reply=message_reply("msg_1", recall_use("toolu_r1", query="REF-1-3")))
    request = step.json()["request"]
    assert request["guard"]["budget_tokens"] == 2000
    assert request["guard"]["tokens"] <= request["guard"]["limit_tokens"]
