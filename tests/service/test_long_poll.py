"""Long-polls: an app server waits on a window change or a fold, held by no thread, on SQLite
(batched polling) and PostgreSQL (LISTEN/NOTIFY)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx2
from conftest import LiveApi
from sessionfold.client.session import SessionHandle

POLICY = {"budget_tokens": 4000, "keep_recent_turns": 1}
WORDS = "the deployment log shows service alpha restarted after the config change " * 12


def start_session(api: LiveApi, tenant: str = "acme", sid: str = "agent-1") -> httpx2.Client:
    http = api.http(api.key(tenant))
    made = http.post("/v1/sessions", json={"id": sid, "policy": POLICY})
    assert made.status_code == 201, made.text
    return http


def fill(http: httpx2.Client, sid: str = "agent-1", turns: int = 10) -> None:
    for i in range(turns):
        answer = http.post(f"/v1/sessions/{sid}/messages", json={"messages": [
            {"role": "user", "content": f"question {i}: {WORDS}"},
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {i}: {WORDS}"}]},
        ]})
        assert answer.status_code == 201, answer.text


def fold(api: LiveApi, tenant: str = "acme", sid: str = "agent-1") -> None:
    handle = SessionHandle(api.client, f"tenant:{tenant}/{sid}")
    report = handle.fold_inline(trigger="manual", target_tokens=1000)
    assert report.outcome == "folded", report


class Poll(threading.Thread):
    """One long-poll on a thread of the test (the API's side is what is under test)."""

    def __init__(self, http: httpx2.Client, path: str, **params: Any) -> None:
        super().__init__(daemon=True)
        self.http, self.path, self.params = http, path, params
        self.answer: httpx2.Response | None = None

    def run(self) -> None:
        self.answer = self.http.get(self.path, params=self.params)


def wait_until_waiting(api: LiveApi, count: int) -> None:
    """Until ``count`` requests wait in the API (what they wait for is asserted after)."""
    for _ in range(2000):
        if api.state.watcher.waiting >= count:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{api.state.watcher.waiting} waiting, expected {count}")


def test_a_long_poll_answers_when_an_append_changes_the_window(api: LiveApi) -> None:
    http = start_session(api)
    etag = http.get("/v1/sessions/agent-1/window").headers["etag"]
    poll = Poll(api.http(api.key("acme")), "/v1/sessions/agent-1/window", after=etag, wait=25)
    poll.start()
    wait_until_waiting(api, 1)
    http.post("/v1/sessions/agent-1/messages",
              json={"messages": [{"role": "user", "content": "news"}]})
    poll.join(timeout=30)
    assert poll.answer is not None and poll.answer.status_code == 200
    assert poll.answer.json()["messages"] == [{"role": "user", "content": "news"}]
    assert poll.answer.headers["etag"] != etag


def test_waiting_for_a_fold_ignores_appends_and_answers_with_the_folded_window(
        api: LiveApi) -> None:
    http = start_session(api)
    fill(http)
    before = http.get("/v1/sessions/agent-1/window")
    poll = Poll(api.http(api.key("acme")), "/v1/sessions/agent-1/window",
                after=before.headers["etag"], wait=25, until="fold")
    poll.start()
    wait_until_waiting(api, 1)
    fill(http, turns=1)  # an append: the fold waiter keeps waiting
    assert poll.is_alive() and api.state.watcher.waiting == 1
    fold(api)
    poll.join(timeout=30)
    assert poll.answer is not None and poll.answer.status_code == 200, poll.answer
    body = poll.answer.json()
    assert body["fold_revision"] == body["revision"] > before.json()["revision"]
    assert any(item["kind"] != "message" for item in body["items"])


def test_a_long_poll_that_times_out_answers_304_with_the_current_etag(api: LiveApi) -> None:
    http = start_session(api)
    etag = http.get("/v1/sessions/agent-1/window").headers["etag"]
    answer = http.get("/v1/sessions/agent-1/window", params={"after": etag, "wait": 0.3})
    assert answer.status_code == 304 and answer.headers["etag"] == etag
    fill(http, turns=1)
    # Waiting for a fold after appends: still 304, with the ETag to poll with next.
    moved = http.get("/v1/sessions/agent-1/window",
                     params={"after": etag, "wait": 0.3, "until": "fold"})
    assert moved.status_code == 304 and moved.headers["etag"] != etag


def test_a_long_poll_on_a_session_deleted_meanwhile_answers_404(api: LiveApi) -> None:
    http = start_session(api)
    etag = http.get("/v1/sessions/agent-1/window").headers["etag"]
    poll = Poll(api.http(api.key("acme")), "/v1/sessions/agent-1/window", after=etag, wait=25)
    poll.start()
    wait_until_waiting(api, 1)
    assert http.delete("/v1/sessions/agent-1").status_code == 204
    poll.join(timeout=30)
    assert poll.answer is not None and poll.answer.status_code == 404


def test_many_waiters_hold_no_thread_and_share_one_read_of_the_folded_window(
        api: LiveApi) -> None:
    http = start_session(api)
    fill(http)
    etag = http.get("/v1/sessions/agent-1/window").headers["etag"]
    waiters = 300
    threads_before = threading.active_count()
    reads_before = api.state.windows.reads
    answers: list[httpx2.Response] = []

    async def wait_all() -> None:
        limits = httpx2.Limits(max_connections=waiters + 10)
        async with httpx2.AsyncClient(base_url=api.url, limits=limits, timeout=60,
                                      headers=http.headers) as client:
            polls = [asyncio.create_task(client.get(
                "/v1/sessions/agent-1/window",
                params={"after": etag, "wait": 25, "until": "fold"})) for _ in range(waiters)]
            answers.extend(await asyncio.gather(*polls))

    runner = threading.Thread(target=lambda: asyncio.run(wait_all()), daemon=True)
    runner.start()
    wait_until_waiting(api, waiters)
    # Every waiter is parked in the API; the server grew no thread per waiter.
    assert threading.active_count() - threads_before < 50
    fold(api)
    runner.join(timeout=60)
    assert len(answers) == waiters
    assert {a.status_code for a in answers} == {200}
    assert len({a.content for a in answers}) == 1
    assert api.state.windows.reads - reads_before == 1  # encoded once for all of them
