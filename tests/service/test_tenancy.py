"""Tenant isolation, on SQLite and PostgreSQL: one tenant can neither read, list, append to,
fold, pause, nor delete another's sessions (404, as if they did not exist), and operator routes
need an admin key."""

from __future__ import annotations

from conftest import LiveApi
from sessionfold.core.policy import FoldPolicy

POLICY = {"budget_tokens": 4000}


def test_another_tenants_session_is_not_found_by_any_route(api: LiveApi) -> None:
    acme = api.http(api.key("acme"))
    globex = api.http(api.key("globex"))
    assert acme.post("/v1/sessions", json={"id": "shared-name", "policy": POLICY,
                                           "system": "acme's"}).status_code == 201
    acme.post("/v1/sessions/shared-name/messages",
              json={"messages": [{"role": "user", "content": "acme secret"}]})
    before = api.store.get_session("tenant:acme/shared-name")

    path = "/v1/sessions/shared-name"
    attempts = {
        "read": globex.get(path),
        "window": globex.get(f"{path}/window"),
        "ledger": globex.get(f"{path}/ledger"),
        "append": globex.post(f"{path}/messages",
                              json={"messages": [{"role": "user", "content": "x"}]}),
        "usage": globex.post(f"{path}/usage", json={"usage": {"input_tokens": 5},
                                                    "seq": 0, "revision": 1}),
        "fold": globex.post(f"{path}/fold"),
        "pause": globex.post(f"{path}/pause"),
        "resume": globex.post(f"{path}/resume"),
        "delete": globex.delete(path),
    }
    for name, answer in attempts.items():
        assert answer.status_code == 404, (name, answer.text)
        assert answer.json()["error"]["reason"] == "session-not-found", name
        assert "acme" not in answer.text, name
    assert globex.get("/v1/sessions").json()["sessions"] == []
    # acme's session is untouched
    after = api.store.get_session("tenant:acme/shared-name")
    assert (after.revision, after.paused, after.ledger_len) == (before.revision, False, 1)
    assert acme.get(f"{path}/window").json()["messages"] == [
        {"role": "user", "content": "acme secret"}]


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
