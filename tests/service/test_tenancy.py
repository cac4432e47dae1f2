"""Tenant isolation, on SQLite and PostgreSQL: one tenant can neither read, list, append to,
fold, pause, nor delete another's sessions (404, as if they did not exist), and operator routes
need an admin key."""

from __future__ import annotations

from typing import Any

from conftest import LiveApi
from sessionfold.core.policy import FoldPolicy

POLICY = {"budget_tokens": 4000}
#: A call state as the guarded request writes it (a request out, nothing offered).
CALL = {"version": 1, "phase": "sending", "revision": 1, "last_seq": 0}


def every_route(http: Any, path: str, etag: str) -> dict[str, Any]:
    """The answer of each route on the session at ``path`` (``etag``: a window's, for the
    long-poll), by the route's name."""
    return {
        "read": http.get(path),
        "window": http.get(f"{path}/window"),
        "long-poll": http.get(f"{path}/window", params={"after": etag, "wait": 0}),
        "ledger": http.get(f"{path}/ledger"),
        "recall": http.post(f"{path}/recall", json={"query": "anything"}),
        "append": http.post(f"{path}/messages",
                            json={"messages": [{"role": "user", "content": "x"}]}),
        "append-openai": http.post(f"{path}/messages", json={
            "messages": [{"role": "user", "content": "x"}], "shape": "openai"}),
        "usage": http.post(f"{path}/usage", json={"usage": {"input_tokens": 5},
                                                  "seq": 0, "revision": 1}),
        "fold": http.post(f"{path}/fold"),
        "call": http.post(f"{path}/call", json={}),
        "call-reply": http.post(f"{path}/call/reply", json={"call": CALL, "reply": {
            "content": [{"type": "text", "text": "ok"}]}}),
        "pause": http.post(f"{path}/pause"),
        "resume": http.post(f"{path}/resume"),
        "delete": http.delete(path),
    }


def test_another_tenants_session_is_not_found_by_any_route(api: LiveApi) -> None:
    acme = api.http(api.key("acme"))
    globex = api.http(api.key("globex"))
    assert acme.post("/v1/sessions", json={"id": "shared-name", "policy": POLICY,
                                           "system": "acme's"}).status_code == 201
    acme.post("/v1/sessions/shared-name/messages",
              json={"messages": [{"role": "user", "content": "acme secret"}]})
    before = api.store.get_session("tenant:acme/shared-name")

    path = "/v1/sessions/shared-name"
    etag = acme.get(f"{path}/window").headers["etag"]
    for name, answer in every_route(globex, path, etag).items():
        assert answer.status_code == 404, (name, answer.text)
        assert answer.json()["error"]["reason"] == "session-not-found", name
        assert "acme" not in answer.text, name
    assert globex.get("/v1/sessions").json()["sessions"] == []
    # acme's session is untouched
    after = api.store.get_session("tenant:acme/shared-name")
    assert (after.revision, after.paused, after.ledger_len) == (before.revision, False, 1)
    assert acme.get(f"{path}/window").json()["messages"] == [
        {"role": "user", "content": "acme secret"}]


def test_every_route_names_a_missing_session_by_the_callers_own_id(api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    path = "/v1/sessions/nope"
    http.post("/v1/sessions", json={"id": "other", "policy": POLICY})
    etag = http.get("/v1/sessions/other/window").headers["etag"]
    for name, answer in every_route(http, path, etag).items():
        assert answer.status_code == 404, (name, answer.text)
        error = answer.json()["error"]
        assert error["reason"] == "session-not-found", name
        # The caller's id, never the store's tenant-qualified one.
        assert error["message"].startswith("no session 'nope'"), (name, error["message"])
        assert "tenant:" not in answer.text, (name, answer.text)


def test_the_librarys_other_errors_name_the_session_by_the_callers_own_id(
        api: LiveApi) -> None:
    http = api.http(api.key("acme"))
    http.post("/v1/sessions", json={"id": "agent-1", "policy": POLICY})
    call = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}]}
    answer = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.log"}]}
    path = "/v1/sessions/agent-1/messages"
    assert http.post(path, json={"messages": [{"role": "user", "content": "go"}, call, answer]},
                     headers={"Idempotency-Key": "turn-1"}).status_code == 201
    reused_key = http.post(path, json={"messages": [{"role": "user", "content": "else"}]},
                           headers={"Idempotency-Key": "turn-1"})
    reused_id = http.post(path, json={"messages": [call]})
    for answered, reason in ((reused_key, "invalid-input"), (reused_id, "tool-pairing")):
        error = answered.json()["error"]
        assert error["reason"] == reason, answered.text
        assert "session 'agent-1'" in error["message"], error["message"]
        assert "tenant:" not in answered.text, answered.text


def test_the_same_id_in_two_tenants_names_two_sessions(api: LiveApi) -> None:
    acme = api.http(api.key("acme"))
    globex = api.http(api.key("globex"))
    for http, who in ((acme, "acme"), (globex, "globex")):
        assert http.post("/v1/sessions", json={"id": "agent", "policy": POLICY,
                                               "system": who}).status_code == 201
    assert acme.get("/v1/sessions/agent/window").json()["system"] == "acme"
    assert globex.get("/v1/sessions/agent/window").json()["system"] == "globex"
    assert [s["id"] for s in acme.get("/v1/sessions").json()["sessions"]] == ["agent"]


def test_a_tenant_listing_never_shows_a_neighbours_ids_sharing_its_prefix(
        api: LiveApi) -> None:
    # "acme" and "acme-2": a store id prefix that is a string prefix of the other tenant's.
    acme = api.http(api.key("acme"))
    acme2 = api.http(api.key("acme-2"))
    acme.post("/v1/sessions", json={"id": "a", "policy": POLICY})
    acme2.post("/v1/sessions", json={"id": "b", "policy": POLICY})
    api.store.create_session("tenant:acme", FoldPolicy(budget_tokens=4000))  # the library's
    assert [s["id"] for s in acme.get("/v1/sessions").json()["sessions"]] == ["a"]
    assert [s["id"] for s in acme2.get("/v1/sessions").json()["sessions"]] == ["b"]


def test_operator_routes_need_an_admin_key(api: LiveApi) -> None:
    tenant = api.http(api.key("acme"))
    admin = api.http(api.key("ops", admin=True))
    tenant.post("/v1/sessions", json={"id": "a", "policy": POLICY})
    for path in ("/v1/admin/sessions", "/v1/admin/dead-letters", "/v1/admin/keys"):
        refused = tenant.get(path)
        assert refused.status_code == 403 and refused.json()["error"]["reason"] == "admin-only"
        assert admin.get(path).status_code == 200
    everyone = admin.get("/v1/admin/sessions").json()["sessions"]
    assert [(s["tenant"], s["id"]) for s in everyone] == [("acme", "a")]
    keys = admin.get("/v1/admin/keys").json()["keys"]
    assert {k["tenant"] for k in keys} == {"acme", "ops"}
    assert all("digest" not in k for k in keys)
