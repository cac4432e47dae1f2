"""The tenant routes over real HTTP: sessions, appends, the window and its ETag, usage, ledger,
pause/resume/delete, and the one error shape (on SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import LiveApi
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.usage import NudgeEvent

POLICY = {"budget_tokens": 4000, "keep_recent_turns": 1}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def make_session(http: Any, sid: str = "agent-1", **extra: Any) -> dict[str, Any]:
    answer = http.post("/v1/sessions", json={"id": sid, "policy": POLICY,
                                             "system": "be brief", **extra})
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_a_session_is_created_appended_to_and_read_back_with_its_etag(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    made = make_session(http)
    assert made["id"] == "agent-1" and made["tenant"] == "acme" and made["revision"] == 0
    appended = http.post("/v1/sessions/agent-1/messages",
                         json={"messages": [user("hello"), assistant("hi")]})
    assert appended.status_code == 201
    assert appended.json() == {"first_seq": 0, "last_seq": 1, "revision": 1, "duplicate": False,
                               "crossed_trigger": False}

    window = http.get("/v1/sessions/agent-1/window")
    assert window.status_code == 200
    body = window.json()
    assert body["system"] == "be brief"
    assert body["messages"] == [user("hello"), assistant("hi")]
    assert body["last_seq"] == 1 and body["revision"] == 1
    assert window.headers["etag"] == body["etag"] == f'"{body["incarnation"]}-1"'


def test_if_none_match_answers_304_until_the_window_changes(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": [user("one")]})
    etag = http.get("/v1/sessions/agent-1/window").headers["etag"]
    unchanged = http.get("/v1/sessions/agent-1/window", headers={"If-None-Match": etag})
    assert unchanged.status_code == 304 and unchanged.headers["etag"] == etag
    http.post("/v1/sessions/agent-1/messages", json={"messages": [assistant("two")]})
    changed = http.get("/v1/sessions/agent-1/window", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag


def test_an_etag_of_a_deleted_and_recreated_id_does_not_match_the_new_session(
        api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": [user("old")]})
    old = http.get("/v1/sessions/agent-1/window").headers["etag"]
    assert http.delete("/v1/sessions/agent-1").status_code == 204
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": [user("new")]})
    fresh = http.get("/v1/sessions/agent-1/window", headers={"If-None-Match": old})
    assert fresh.status_code == 200  # same revision 1, another incarnation
    assert fresh.json()["messages"] == [user("new")]


def test_an_idempotency_key_retry_is_not_appended_twice(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    turn = {"messages": [user("once")]}
    first = http.post("/v1/sessions/agent-1/messages", json=turn,
                      headers={"Idempotency-Key": "turn-1"})
    again = http.post("/v1/sessions/agent-1/messages", json=turn,
                      headers={"Idempotency-Key": "turn-1"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["duplicate"] is True and again.json()["first_seq"] == 0
    other = http.post("/v1/sessions/agent-1/messages", json={"messages": [user("else")]},
                      headers={"Idempotency-Key": "turn-1"})
    assert other.status_code == 400
    assert other.json()["error"]["reason"] == "invalid-input"
    assert len(http.get("/v1/sessions/agent-1/ledger").json()["entries"]) == 1


def test_library_errors_keep_their_reason_in_the_one_error_shape(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                           "content": "x"}]}
    answer = http.post("/v1/sessions/agent-1/messages", json={"messages": [orphan]})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["type"] == "invalid_request" and error["reason"] == "tool-pairing"
    assert error["index"] == 0 and "Traceback" not in answer.text
    missing = http.get("/v1/sessions/nobody/window")
    assert missing.status_code == 404
    assert missing.json()["error"]["reason"] == "session-not-found"
    bad_policy = http.post("/v1/sessions", json={"id": "x", "policy": {"budget_tokens": 5}})
    assert bad_policy.status_code == 422
    assert bad_policy.json()["error"]["reason"] == "invalid-policy"
    bad_body = http.post("/v1/sessions", json={"id": "x"})
    assert bad_body.status_code == 422
    assert bad_body.json()["error"]["reason"] == "invalid-request"
    no_route = http.get("/v1/nothing-here")
    assert no_route.status_code == 404 and no_route.json()["error"]["reason"] == "no-such-route"


def test_a_request_without_a_live_key_is_refused(api: LiveApi) -> None:
    assert api.http().get("/v1/sessions").status_code == 401
    assert api.http("sfk_000000000000_" + "A" * 43).get("/v1/sessions").status_code == 401
    key = api.key("acme")
    assert api.http(key).get("/v1/sessions").status_code == 200
    key_id = key.split("_")[1]
    assert api.store.revoke_api_key(key_id)
    refused = api.http(key).get("/v1/sessions")  # the test API trusts no key from a cache
    assert refused.status_code == 401
    assert refused.json()["error"] == {"type": "authentication", "reason": "unauthorized",
                                       "message": "the API key is unknown or revoked"}


def test_creating_an_existing_id_conflicts_unless_exist_ok(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    again = http.post("/v1/sessions", json={"id": "agent-1", "policy": POLICY,
                                            "system": "be brief"})
    assert again.status_code == 409 and again.json()["error"]["reason"] == "session-exists"
    ok = http.post("/v1/sessions", json={"id": "agent-1", "policy": POLICY,
                                         "system": "be brief", "exist_ok": True})
    assert ok.status_code == 200 and ok.json()["id"] == "agent-1"


def test_sessions_are_listed_in_pages(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    for i in range(5):
        make_session(http, f"s{i}")
    first = http.get("/v1/sessions", params={"limit": 2}).json()
    assert [s["id"] for s in first["sessions"]] == ["s0", "s1"]
    second = http.get("/v1/sessions", params={"limit": 2, "after": first["next_after"]}).json()
    assert [s["id"] for s in second["sessions"]] == ["s2", "s3"]
    last = http.get("/v1/sessions", params={"limit": 2, "after": second["next_after"]}).json()
    assert [s["id"] for s in last["sessions"]] == ["s4"] and last["next_after"] is None


def test_the_ledger_is_read_in_pages_by_seq(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    turns = [user("q0"), assistant("a0"), user("q1"), assistant("a1"), user("q2")]
    http.post("/v1/sessions/agent-1/messages", json={"messages": turns})
    page = http.get("/v1/sessions/agent-1/ledger", params={"start": 1, "limit": 2}).json()
    assert [e["seq"] for e in page["entries"]] == [1, 2] and page["next_start"] == 3
    assert page["entries"][0]["message"] == assistant("a0")
    tail = http.get("/v1/sessions/agent-1/ledger", params={"start": 3, "limit": 5}).json()
    assert [e["seq"] for e in tail["entries"]] == [3, 4] and tail["next_start"] is None


def test_pause_and_resume_are_reported_on_the_session_and_nudge_its_scheduler(
        api: LiveApi, redis_conn: Any) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    assert http.post("/v1/sessions/agent-1/pause").json()["paused"] is True
    assert api.store.get_session("tenant:acme/agent-1").paused
    assert http.post("/v1/sessions/agent-1/resume").json()["paused"] is False
    # Each one nudges the session's scheduler, which then reads the change at once.
    stream = Keys.from_settings(api.settings).usage_stream_of("tenant:acme/agent-1")
    nudges = [NudgeEvent.from_fields(fields) for _, fields in redis_conn.xrange(stream)]
    assert [n.session_id for n in nudges] == ["tenant:acme/agent-1"] * 2


def nudges_of(api: LiveApi, redis_conn: Any, sid: str) -> list[NudgeEvent]:
    stream = Keys.from_settings(api.settings).usage_stream_of(sid)
    return [NudgeEvent.from_fields(fields) for _, fields in redis_conn.xrange(stream)
            if b"nudge.v1" in fields]


LONG = "the reconciliation log line repeats itself " * 500  # ~3,500 tokens: past the trigger


@pytest.mark.parametrize("shape", ["anthropic", "openai"])
def test_an_append_that_crosses_the_trigger_says_so_and_nudges_the_scheduler_at_once(
        api: LiveApi, redis_conn: Any, shape: str) -> None:
    http = api.http(api.key("acme"))
    make_session(http)  # budget 4,000: the trigger is at 3,400 tokens
    sid = "tenant:acme/agent-1"
    small = http.post("/v1/sessions/agent-1/messages", json={"messages": [user("hello")]})
    assert small.status_code == 201 and small.json()["crossed_trigger"] is False
    assert nudges_of(api, redis_conn, sid) == []
    reply = assistant(LONG) if shape == "anthropic" else {"role": "assistant", "content": LONG}
    big = http.post("/v1/sessions/agent-1/messages",
                    json={"messages": [reply], "shape": shape})
    assert big.status_code == 201, big.text
    assert big.json()["crossed_trigger"] is True
    # The scheduler hears of it now, not at its next store sweep (~30 s later).
    assert [(n.session_id, n.revision) for n in nudges_of(api, redis_conn, sid)] == [
        (sid, big.json()["revision"])]
    # Past the trigger already: the next append crosses nothing and nudges no more.
    after = http.post("/v1/sessions/agent-1/messages", json={"messages": [user("more")]})
    assert after.json()["crossed_trigger"] is False
    assert len(nudges_of(api, redis_conn, sid)) == 1


def test_a_fold_asked_for_over_http_nudges_the_scheduler_and_enqueues_no_job(
        api: LiveApi, redis_conn: Any) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    sid = "tenant:acme/agent-1"
    appended = http.post("/v1/sessions/agent-1/messages", json={"messages": [user("hello")]})
    answer = http.post("/v1/sessions/agent-1/fold")
    assert answer.status_code == 202, answer.text
    revision = appended.json()["revision"]
    assert answer.json() == {"session_id": "agent-1", "revision": revision, "nudged": True}
    # The scheduler decides (it enqueues a job if the session needs one); the API enqueued
    # nothing itself: no Celery key under the deployment's prefix.
    assert [(n.session_id, n.revision) for n in nudges_of(api, redis_conn, sid)] == [
        (sid, revision)]
    celery = Keys.from_settings(api.settings).celery_prefix()
    assert list(redis_conn.scan_iter(match=celery + "*")) == []


def test_an_append_to_a_paused_session_crosses_no_trigger_and_nudges_nothing(
        api: LiveApi, redis_conn: Any) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/pause")
    paused = len(nudges_of(api, redis_conn, "tenant:acme/agent-1"))  # the pause's own
    big = http.post("/v1/sessions/agent-1/messages", json={"messages": [user(LONG)]})
    assert big.status_code == 201 and big.json()["crossed_trigger"] is False
    assert len(nudges_of(api, redis_conn, "tenant:acme/agent-1")) == paused


@pytest.mark.parametrize("usage", [
    {"input_tokens": 900, "cache_read_input_tokens": 100, "output_tokens": 5},
    {"prompt_tokens": 1000, "completion_tokens": 5},
], ids=["anthropic", "openai"])
def test_usage_in_either_provider_shape_reaches_the_usage_bus(
        api: LiveApi, usage: dict[str, int], redis_conn: Any) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    http.post("/v1/sessions/agent-1/messages", json={"messages": [user("hi")]})
    answer = http.post("/v1/sessions/agent-1/usage",
                       json={"usage": usage, "seq": 0, "revision": 1, "model": "m"})
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"prompt_tokens": 1000, "published": True}
    found = [key for key in redis_conn.scan_iter(
        match=Keys.from_settings(api.settings).all_pattern()) if b"usage" in key]
    assert found, "no usage stream was written"


def test_a_usage_report_of_zero_tokens_is_refused_as_unmeasurable(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http)
    answer = http.post("/v1/sessions/agent-1/usage",
                       json={"usage": {"input_tokens": 0}, "seq": 0, "revision": 0})
    assert answer.status_code == 422
    assert answer.json()["error"]["reason"] == "usage-unmeasurable"


def test_healthz_needs_no_key_and_names_both_services(api: LiveApi) -> None:
    answer = api.http().get("/healthz")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["store"]["ok"] and body["redis"]["ok"]
    assert body["long_poll"] == ("listen" if api.store.engine.dialect.name == "postgresql"
                                 else "poll")


def test_metrics_count_requests_per_route_template_never_per_session(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    make_session(http, "secret-session-name")
    http.get("/v1/sessions/secret-session-name/window")
    http.get("/v1/sessions/nobody/window")
    text = api.http().get("/metrics").text
    assert 'route="/v1/sessions/{session_id}/window"' in text
    assert "secret-session-name" not in text
    assert ('sessionfold_api_requests_total{method="GET",'
            'route="/v1/sessions/{session_id}/window",status="4xx"}') in text
