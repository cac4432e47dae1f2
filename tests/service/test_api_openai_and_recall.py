"""The HTTP API in the OpenAI chat shape (appends, the window and its per-shape ETag) and the
recall route (by seq, by query, tenant-scoped, errors in the one shape), on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

from conftest import LiveApi
from prometheus_client import REGISTRY
from sessionfold.core.openai_shape import from_openai
from sessionfold.runtime.fold_procedure import FoldJob, run_fold
from sessionfold.service.tenancy import store_id

SYSTEM = "be brief"
POLICY = {"budget_tokens": 4000, "keep_recent_turns": 1}
ACCOUNT = "ACCT-90417"


def make_session(http: Any, sid: str = "agent-1", system: str = SYSTEM,
                 policy: dict[str, Any] = POLICY) -> None:
    answer = http.post("/v1/sessions", json={"id": sid, "policy": policy, "system": system})
    assert answer.status_code == 201, answer.text


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def calls(*ids: str, text: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": "bash", "arguments": json.dumps({"command": f"run {call_id}"})}}
        for call_id in ids]}


def tool(call_id: str, output: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def said(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


CONVERSATION = [
    {"role": "system", "content": SYSTEM},
    user(f"Reconcile the refunds of {ACCOUNT}."),
    calls("call_a", "call_b", text="Reading both ledgers."),
    tool("call_a", f"refund REF-1 for {ACCOUNT}: 40.00 EUR"),
    tool("call_b", "refund REF-2: pending"),
    said("REF-1 is settled, REF-2 is pending."),
]


def ledger_len(api: LiveApi, tenant: str, sid: str = "agent-1") -> int:
    return api.store.get_session(store_id(tenant, sid)).ledger_len


# --- the OpenAI shape -----------------------------------------------------------------------------

def test_openai_messages_are_appended_and_read_back_in_the_openai_shape(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    appended = http.post("/v1/sessions/agent-1/messages",
                         json={"messages": CONVERSATION, "shape": "openai"})
    assert appended.status_code == 201, appended.text
    assert (appended.json()["first_seq"], appended.json()["last_seq"]) == (0, 3)

    window = http.get("/v1/sessions/agent-1/window", params={"shape": "openai"})
    assert window.status_code == 200
    body = window.json()
    assert body["messages"] == CONVERSATION and body["shape"] == "openai"
    assert window.headers["etag"] == body["etag"] == f'"{body["incarnation"]}-1-openai"'
    anthropic = http.get("/v1/sessions/agent-1/window").json()
    assert anthropic["shape"] == "anthropic" and anthropic["etag"] != body["etag"]
    assert [b["tool_use_id"] for b in anthropic["messages"][2]["content"]] == ["call_a", "call_b"]


def test_the_shape_is_read_from_unambiguous_messages_and_an_explicit_one_wins(
        api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    auto = http.post("/v1/sessions/agent-1/messages", json={"messages": CONVERSATION[1:3]})
    assert auto.status_code == 201, auto.text
    refused = http.post("/v1/sessions/agent-1/messages",
                        json={"messages": [tool("call_a", "x"), tool("call_b", "y")],
                              "shape": "anthropic"})
    assert refused.status_code == 422
    assert refused.json()["error"]["reason"] == "invalid-message"
    assert "role must be 'user' or 'assistant'" in refused.json()["error"]["message"]
    mixed = http.post("/v1/sessions/agent-1/messages", json={"messages": [
        tool("call_a", "x"),
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_b"}]}]})
    assert mixed.status_code == 422 and "mix the OpenAI chat shape" in mixed.text
    bad_shape = http.post("/v1/sessions/agent-1/messages",
                          json={"messages": [user("x")], "shape": "chatml"})
    assert bad_shape.status_code == 422
    assert bad_shape.json()["error"]["reason"] == "invalid-request"
    other_system = http.post("/v1/sessions/agent-1/messages", json={"messages": [
        {"role": "system", "content": "be verbose"}, user("x")]})
    assert other_system.status_code == 400 and "fixed at creation" in other_system.text
    assert ledger_len(api, "acme") == 2


def test_a_partial_set_of_tool_messages_is_refused_and_nothing_is_written(
        api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": CONVERSATION[1:3]})
    partial = http.post("/v1/sessions/agent-1/messages",
                        json={"messages": [tool("call_a", "40.00 EUR")], "shape": "openai"})
    assert partial.status_code == 422
    error = partial.json()["error"]
    assert error["reason"] == "tool-pairing" and error["index"] == 0
    assert "call_b" in error["message"] and "in one request" in error["message"]
    assert ledger_len(api, "acme") == 2
    whole = http.post("/v1/sessions/agent-1/messages", json={
        "messages": [tool("call_a", "40.00 EUR"), tool("call_b", "pending")]})
    assert whole.status_code == 201 and whole.json()["last_seq"] == 2  # one user message
    orphan = http.post("/v1/sessions/agent-1/messages", json={
        "messages": [said("done"), user("next"), tool("nobody", "?")]})
    assert orphan.status_code == 422
    assert (orphan.json()["error"]["index"], orphan.json()["error"]["field"]) == (
        2, "tool_call_id")  # named in the request's own terms


def test_the_etag_differs_per_shape_and_matches_only_its_own(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": CONVERSATION})
    path = "/v1/sessions/agent-1/window"
    plain = http.get(path).headers["etag"]
    chat = http.get(path, params={"shape": "openai"}).headers["etag"]
    assert chat == plain[:-1] + '-openai"'
    assert http.get(path, params={"shape": "openai"},
                    headers={"If-None-Match": plain}).status_code == 200
    assert http.get(path, headers={"If-None-Match": chat}).status_code == 200
    same = http.get(path, params={"shape": "openai"}, headers={"If-None-Match": chat})
    assert same.status_code == 304 and same.headers["etag"] == chat
    assert http.get(path, headers={"If-None-Match": plain}).status_code == 304  # as before
    waited = http.get(path, params={"shape": "openai", "after": plain, "wait": 0})
    assert waited.status_code == 304 and waited.headers["etag"] == chat
    # The once-per-revision cache holds each rendering under its own key.
    sid = store_id("acme", "agent-1")
    state = api.store.window_states([sid])[sid]
    cached = [api.state.windows.cached(sid, state, False, shape) for shape in ("anthropic",
                                                                             "openai")]
    assert all(c is not None for c in cached) and cached[0].body != cached[1].body
    reads = api.state.windows.reads
    assert http.get(path, params={"shape": "openai"}).json()["messages"] == CONVERSATION
    assert api.state.windows.reads == reads  # served from the cache
    refused = http.get(path, params={"shape": "openai", "cache_breakpoints": True})
    assert refused.status_code == 400 and refused.json()["error"]["reason"] == "invalid-input"


def test_the_openai_window_keeps_tool_pairing_after_a_fold(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, policy={**POLICY, "layers": ["summarize"]})  # no masking: a summary
    http.post("/v1/sessions/agent-1/messages", json={"messages": CONVERSATION[:2]})
    for step in range(10):
        log = "\n".join(f"line {step}.{i}: refund batch settled" for i in range(60))
        answer = http.post("/v1/sessions/agent-1/messages", json={"messages": [
            calls(f"s{step}a", f"s{step}b", text=f"Step {step}."),
            tool(f"s{step}a", log), tool(f"s{step}b", log)]})
        assert answer.status_code == 201, answer.text
    sid = store_id("acme", "agent-1")
    assert run_fold(api.store, api.client.summarizer, FoldJob(sid, "job-1")).outcome == "folded"
    window = http.get("/v1/sessions/agent-1/window", params={"shape": "openai"}).json()
    assert any(item["kind"] == "summary" for item in window["items"])
    assert window["messages"][0] == {"role": "system", "content": SYSTEM}
    open_calls: set[str] = set()
    for message in window["messages"]:
        if message["role"] == "tool":
            open_calls.remove(message["tool_call_id"])  # KeyError: an orphan result
        else:
            assert not open_calls
            open_calls = {c["id"] for c in message.get("tool_calls") or []}
    from_openai(window["messages"])  # the library's own pairing check takes it back


# --- recall ---------------------------------------------------------------------------------------

def recall_count(kind: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("sessionfold_recall_requests_total",
                                     {"kind": kind, "outcome": outcome}) or 0.0


def test_recall_answers_by_seq_and_by_query_and_is_counted(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": CONVERSATION})
    served = recall_count("seq", "served")
    by_seq = http.post("/v1/sessions/agent-1/recall", json={"seq": "#2"})
    assert by_seq.status_code == 200, by_seq.text
    body = by_seq.json()
    assert (body["kind"], body["outcome"], body["next_seq"]) == ("seq", "served", None)
    assert f"refund REF-1 for {ACCOUNT}" in body["text"] and "ledger #2 user" in body["text"]
    assert body["tokens"] > 0
    assert recall_count("seq", "served") == served + 1

    by_query = http.post("/v1/sessions/agent-1/recall", json={"query": "REF-2"})
    assert by_query.status_code == 200
    assert by_query.json()["outcome"] == "served" and "refund REF-2: pending" in (
        by_query.json()["text"])
    paged = http.post("/v1/sessions/agent-1/recall", json={"seq": 2, "offset": 10})
    assert paged.status_code == 200 and "from character 10" in paged.json()["text"]
    past = http.post("/v1/sessions/agent-1/recall", json={"seq": "40-50"})
    assert past.json()["outcome"] == "unavailable" and "does not exist" in past.json()["text"]
    nothing = http.post("/v1/sessions/agent-1/recall", json={"query": "INC-0000"})
    assert nothing.json()["outcome"] == "no-match"


def test_recall_reads_only_the_callers_tenant(api: LiveApi) -> None:
    acme = api.http(api.key("acme"))
    globex = api.http(api.key("globex"))
    make_session(acme)
    acme.post("/v1/sessions/agent-1/messages", json={"messages": CONVERSATION})
    stranger = globex.post("/v1/sessions/agent-1/recall", json={"seq": "#1"})
    assert stranger.status_code == 404
    assert stranger.json()["error"]["reason"] == "session-not-found"
    assert ACCOUNT not in stranger.text
    make_session(globex)  # the same id in globex's tenant is another session
    globex.post("/v1/sessions/agent-1/messages", json={"messages": [user("globex only")]})
    searched = globex.post("/v1/sessions/agent-1/recall", json={"query": ACCOUNT})
    assert searched.status_code == 200 and searched.json()["outcome"] == "no-match"
    rows = globex.post("/v1/sessions/agent-1/recall", json={"seq": "0-5"}).json()["text"]
    assert "globex only" in rows and ACCOUNT not in rows


def test_a_malformed_recall_is_one_json_error_with_the_librarys_reason(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": CONVERSATION})
    before = api.store.get_session(store_id("acme", "agent-1")).revision
    cases = {
        "bad seq": ({"seq": "twelve"}, "seq must be a ledger row or range"),
        "backwards": ({"seq": "9-3"}, "ends before it starts"),
        "both": ({"seq": "1", "query": "x"}, "not both"),
        "neither": ({}, "give seq"),
        "negative offset": ({"seq": "1", "offset": -1}, "offset must be"),
        "offset with a query": ({"query": "x", "offset": 3}, "offset pages"),
    }
    for name, (body, says) in cases.items():
        answer = http.post("/v1/sessions/agent-1/recall", json=body)
        assert answer.status_code == 400, (name, answer.text)
        error = answer.json()["error"]
        assert (error["type"], error["reason"]) == ("invalid_request", "invalid-input"), name
        assert says in error["message"], (name, error)
    unknown = http.post("/v1/sessions/agent-1/recall", json={"seq": "1", "rows": 3})
    assert unknown.status_code == 422
    assert unknown.json()["error"]["reason"] == "invalid-request"
    assert "Traceback" not in unknown.text
    assert api.store.get_session(store_id("acme", "agent-1")).revision == before
