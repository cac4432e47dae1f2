"""Every bad input is a 4xx that says what is wrong, and no answer carries anything internal
(issue 33): usage counts, strict types, a system prompt the store refuses, oversized appends,
content the provider would refuse, store ids, and the store's own failures."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LiveApi, serving
from sessionfold.client import Client
from sessionfold.runtime.settings import Settings
from sessionfold.service import create_app
from sessionfold.store import SessionStore
from test_tenancy import every_route

POLICY = {"budget_tokens": 4000}


def make_session(http: Any, sid: str = "agent-1", **extra: Any) -> None:
    made = http.post("/v1/sessions", json={"id": sid, "policy": POLICY, **extra})
    assert made.status_code == 201, made.text


# --- usage: one strict reader, a 4xx naming the field ---------------------------------------

@pytest.mark.parametrize("value", ['"abc"', "[1]", "{}", "NaN", "Infinity", "-Infinity",
                                   "1e400", "true", "12.7", "-3"])
def test_a_usage_count_that_is_no_count_is_a_422_naming_the_field(api: LiveApi,
                                                                  value: str) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": [{"role": "user",
                                                                    "content": "hi"}]})
    for field in ("input_tokens", "cache_read_input_tokens"):
        body = f'{{"usage": {{"input_tokens": 100, "{field}": {value}}}, "seq": 0, ' \
               '"revision": 1}'
        answer = http.post("/v1/sessions/agent-1/usage", content=body.encode(),
                           headers={"Content-Type": "application/json"})
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["reason"] == "invalid-usage", error
        assert error["field"] == f"usage.{field}" and f"usage.{field}" in error["message"]


def test_strict_types_refuse_a_boolean_where_a_number_belongs(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": [
        {"role": "user", "content": "zero"}, {"role": "assistant", "content": "one"}]})
    refused = {
        "recall seq": ("/v1/sessions/agent-1/recall", {"seq": True}),
        "recall offset": ("/v1/sessions/agent-1/recall", {"seq": "0", "offset": True}),
        "usage seq": ("/v1/sessions/agent-1/usage", {"usage": {"input_tokens": 5},
                                                     "seq": True, "revision": 1}),
        "exist_ok": ("/v1/sessions", {"id": "b", "policy": POLICY, "exist_ok": "true"}),
        "policy count": ("/v1/sessions", {"id": "c", "policy": {"budget_tokens": "4000"}}),
        "policy turns": ("/v1/sessions", {"id": "d", "policy": {**POLICY,
                                                                "keep_recent_turns": True}}),
        "policy fraction": ("/v1/sessions", {"id": "e", "policy": {"budget_tokens": 4000.5}}),
    }
    for name, (path, body) in refused.items():
        answer = http.post(path, json=body)
        assert answer.status_code == 422, (name, answer.text)
        assert answer.json()["error"]["reason"] == "invalid-request", name
    assert http.post("/v1/sessions/agent-1/recall", json={"seq": 1}).json()["text"].count(
        "one") >= 1  # a number is still a row
    # JSON has one number type: 12.0 is the integer 12 where a count belongs.
    assert http.post("/v1/sessions", json={"id": "f", "policy": {
        "budget_tokens": 4000.0}}).status_code == 201
    assert http.post("/v1/sessions/agent-1/recall", json={"seq": 1.0}).status_code == 200


# --- a NUL in a new session's system prompt -------------------------------------------------

def test_a_nul_in_a_new_sessions_system_prompt_is_a_400_naming_the_field(
        api: LiveApi) -> None:
    http = api.http(api.key("rt2"))
    answer = http.post("/v1/sessions", json={"id": "p7", "policy": POLICY,
                                             "system": "be\x00brief"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["reason"] == "invalid-input" and error["message"].startswith("system ")
    assert "NUL" in error["message"] and "tenant:" not in answer.text
    assert http.get("/v1/sessions/p7").status_code == 404


def test_creating_an_existing_session_again_answers_as_before(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, system="be brief")
    again = http.post("/v1/sessions", json={"id": "agent-1", "policy": POLICY,
                                            "system": "be brief"})
    assert again.status_code == 409 and "tenant:" not in again.text
    same = http.post("/v1/sessions", json={"id": "agent-1", "policy": POLICY,
                                           "system": "be brief", "exist_ok": True})
    assert same.status_code == 200 and same.json()["id"] == "agent-1"
    other = http.post("/v1/sessions", json={"id": "agent-1", "policy": POLICY,
                                            "system": "be verbose", "exist_ok": True})
    assert other.status_code == 409


# --- no answer carries a store id -------------------------------------------------------------

def test_no_answer_of_any_route_carries_a_store_id(api: LiveApi) -> None:
    key = api.key("acme")
    http = api.http(key)
    admin = api.http(api.key("ops", admin=True))
    make_session(http, "a")
    make_session(http, "b")
    call = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}]}
    http.post("/v1/sessions/a/messages", json={"messages": [{"role": "user", "content": "go"},
                                                            call]},
              headers={"Idempotency-Key": "k1"})
    path = "/v1/sessions/a"
    etag = http.get(f"{path}/window").headers["etag"]
    answers: dict[str, Any] = {f"ok {k}": v for k, v in every_route(http, path, etag).items()}
    make_session(http, "a")  # every_route deleted it
    answers |= {
        "exists": http.post("/v1/sessions", json={"id": "b", "policy": POLICY}),
        "nul": http.post("/v1/sessions", json={"id": "n", "policy": POLICY, "system": "\x00"}),
        "reused key": http.post(f"{path}/messages", headers={"Idempotency-Key": "k1"},
                                json={"messages": [{"role": "user", "content": "x"}]}),
        "bad etag": http.get(f"{path}/window", params={"after": '"zz-1"'}),
        "recall range": http.post(f"{path}/recall", json={"seq": "#9-#3"}),
        "usage seq": http.post(f"{path}/usage", json={"usage": {"input_tokens": 5},
                                                      "seq": 99, "revision": 0}),
        "list": http.get("/v1/sessions", params={"limit": 1}),
        "admin sessions": admin.get("/v1/admin/sessions", params={"limit": 1}),
        "admin keys": admin.get("/v1/admin/keys"),
        "admin dead letters": admin.get("/v1/admin/dead-letters"),
        "missing": http.get("/v1/sessions/nope/window"),
    }
    for name, answer in answers.items():
        assert "tenant:" not in answer.text, (name, answer.text)
    page = admin.get("/v1/admin/sessions", params={"limit": 1}).json()
    following = admin.get("/v1/admin/sessions", params={"limit": 1,
                                                        "after": page["next_after"]}).json()
    assert [s["id"] for s in page["sessions"] + following["sessions"]] == ["a", "b"]


# --- appends: caps and content the provider would refuse --------------------------------------

def test_an_append_of_too_many_messages_or_too_large_a_message_is_refused(
        api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    many = http.post("/v1/sessions/agent-1/messages", json={"messages": [
        {"role": "user", "content": f"m{i}"} for i in range(5000)]})
    assert many.status_code == 422 and "1000" in many.text, many.text
    big = "x" * (9 * 1024 * 1024)  # within the body's 16 MiB, over a message's 8 MiB
    large = http.post("/v1/sessions/agent-1/messages", json={"messages": [
        {"role": "user", "content": "ok"}, {"role": "assistant", "content": big}]})
    assert large.status_code == 413, large.text[:300]
    error = large.json()["error"]
    assert (error["reason"], error["index"]) == ("too-large", 1)
    assert "8,388,608 bytes" in error["message"]
    huge = http.post("/v1/sessions/agent-1/messages", json={"messages": [
        {"role": "user", "content": "y" * (20 * 1024 * 1024)}]})
    assert huge.status_code == 413 and huge.json()["error"]["reason"] == "body-too-large"
    assert http.get("/v1/sessions/agent-1").json()["ledger_len"] == 0


@pytest.mark.parametrize(("source", "field"), [
    ({"type": "base64", "media_type": "image/png", "data": "!!!notb64"},
     "content[0].source.data"),
    ({"type": "url", "url": "file:///etc/passwd"}, "content[0].source.url"),
])
def test_an_image_the_provider_would_refuse_is_a_422_naming_the_field(
        api: LiveApi, source: dict[str, str], field: str) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    answer = http.post("/v1/sessions/agent-1/messages", json={"messages": [
        {"role": "user", "content": [{"type": "image", "source": source}]}]})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert (error["reason"], error["index"], error["field"]) == ("invalid-message", 0, field)


# --- the store away: a generic 503 with an error id, the details in the log --------------------

def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: nothing listens there


@pytest.fixture(params=["postgres", "sqlite"])
def store_away(request: pytest.FixtureRequest, make_settings: Callable[..., Settings],
               tmp_path: Path) -> Iterator[tuple[str, str]]:
    """An API whose store cannot be reached: ``(base URL, what the driver says of it)``."""
    if request.param == "postgres":
        port = _closed_port()
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/test"
        driver_says = str(port)
    else:
        url = f"sqlite:///{tmp_path / 'no-such-dir' / 'store.db'}"
        driver_says = "no-such-dir"  # the path, which the store's message names
    settings = make_settings(database_url=url, metrics_port=0, api_key_cache_s=0.0,
                             api_poll_interval_s=0.05)
    client = Client(settings, SessionStore.from_url(url), None)
    try:
        with serving(create_app(settings, client=client), settings) as base:
            yield base, driver_says
    finally:
        client.close()


def test_with_the_store_away_every_answer_is_a_generic_503_with_an_error_id(
        store_away: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    import httpx2

    base, driver_says = store_away
    caplog.set_level(logging.ERROR, logger="sessionfold.service.errors")
    with httpx2.Client(base_url=base, timeout=30, headers={
            "Authorization": "Bearer sfk_000000000000_" + "A" * 43}) as http:
        health = http.get("/healthz")
        assert health.status_code == 503
        store = health.json()["store"]
        assert not store["ok"] and "error id" in store["detail"]
        answers = {"healthz": health, **every_route(http, "/v1/sessions/agent-1", '"1-1"'),
                   "list": http.get("/v1/sessions"),
                   "create": http.post("/v1/sessions", json={"id": "x", "policy": POLICY})}
    ids = set()
    for name, answer in answers.items():
        assert answer.status_code == 503, (name, answer.text)
        text = answer.text
        assert driver_says not in text and "connection" not in text.lower(), (name, text)
        assert "Traceback" not in text and "sqlalchemy" not in text.lower(), (name, text)
        if name != "healthz":
            error = answer.json()["error"]
            assert error["reason"] in ("store-unavailable", "schema-mismatch"), (name, error)
            assert re.fullmatch("[0-9a-f]{12}", error["error_id"]), error
            ids.add(error["error_id"])
    assert len(ids) == len(answers) - 1  # one id per failure
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for error_id in ids:
        assert error_id in logged
    assert driver_says in logged  # the details are in the log, under the ids


# --- 405: every method the path answers -------------------------------------------------------

def test_a_405_names_every_method_the_path_answers(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    for path, method, allowed in (
            ("/v1/sessions/agent-1", "POST", {"GET", "DELETE"}),
            ("/v1/sessions", "DELETE", {"GET", "POST"}),
            ("/v1/sessions/agent-1/window", "PUT", {"GET"})):
        answer = http.request(method, path)
        assert answer.status_code == 405, (path, answer.text)
        assert answer.json()["error"]["reason"] == "method-not-allowed"
        named = {m.strip() for m in answer.headers["allow"].split(",")}
        assert allowed <= named and method not in named, (path, named)
