"""The inline overflow fallback: the provider says "prompt is too long", the client folds and
retries once — alone, and while a real worker's background fold of the session is in flight."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anthropic
import pytest
from pipeline_harness import (
    postgres_url,
    started,
    transcript_session,
    wait_until,
    worker_process,
)
from prometheus_client import REGISTRY
from sessionfold.cli.standin.fakeprovider import FakeProvider, Fault
from sessionfold.client import AsyncClient, Client, connect
from sessionfold.core.errors import ContextOverflowError
from sessionfold.core.messages import Message
from sessionfold.core.overflow import is_context_overflow
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings
from sessionfold.workers.celery_app import make_celery, make_enqueue

SID = "agent-overflow"
#: A budget past the stand-in's context window: the guard leaves the request whole (it is under
#: the budget) and the provider rejects it, as a model whose window is smaller than the budget
#: an operator set would.
POLICY = FoldPolicy(budget_tokens=100_000)


def guard_count(outcome: str) -> float:
    """``sessionfold_guarded_requests_total{outcome}`` as this process counts it."""
    return REGISTRY.get_sample_value("sessionfold_guarded_requests_total",
                                     {"outcome": outcome}) or 0.0


@pytest.fixture
def conversation() -> list[Message]:
    return transcript_session("django__django-15554", 60).messages


@pytest.fixture
def client(make_settings: Callable[..., Settings]) -> Iterator[Client]:
    with connect(make_settings()) as c:
        yield c


def _agent(client: Client, conversation: list[Message], policy: FoldPolicy = POLICY) -> Any:
    agent = client.session(SID, policy=policy, system="You fix bugs.")
    agent.append(conversation)
    return agent


def test_overflow_folds_inline_and_the_retry_succeeds(
        client: Client, conversation: list[Message]) -> None:
    agent = _agent(client, conversation)
    provider = FakeProvider(context_window=12_000)
    reply = agent.call(provider)
    assert reply.content[0].type == "text"
    assert provider.stats.by_status == {400: 1, 200: 1}  # rejected once, then served
    assert provider.stats.recent_prompt_tokens[-1] <= 12_000
    assert agent.inline_folds == 1 and agent.summarizer_calls >= 1
    assert client.summarizer_calls == agent.summarizer_calls
    record = client.store.records(SID)[-1]
    assert (record.trigger, record.outcome, record.forced) == ("overflow", "folded", True)
    # Half the model's window (named by the 400), the smaller of it and the budget.
    assert record.target_tokens == 12_000 // 2
    # The provider's own count from the 400 is what the fold started from.
    assert record.measured_by == "reported"
    assert record.measured_tokens == provider.stats.recent_prompt_tokens[0]
    assert [e.message for e in agent.ledger()] == conversation


def test_a_second_overflow_propagates_as_context_overflow_error(
        client: Client, conversation: list[Message]) -> None:
    agent = _agent(client, conversation)
    provider = FakeProvider(context_window=1_000)  # not even the task and the last turns fit
    with pytest.raises(ContextOverflowError) as info:
        agent.call(provider)
    assert isinstance(info.value.__cause__, anthropic.BadRequestError)
    assert is_context_overflow(info.value)
    assert provider.stats.by_status == {400: 2}  # one retry, not a loop
    assert agent.inline_folds == 1


def test_other_provider_errors_pass_through_without_folding(
        client: Client, conversation: list[Message]) -> None:
    agent = _agent(client, conversation)
    provider = FakeProvider(context_window=12_000)
    provider.script(Fault.overloaded())
    with pytest.raises(anthropic.OverloadedError):
        agent.call(provider)
    assert agent.inline_folds == 0 and client.store.spans(SID) == []


def test_async_call_folds_inline_on_overflow(
        make_settings: Callable[..., Settings], conversation: list[Message]) -> None:
    provider = FakeProvider(context_window=12_000)

    async def scenario() -> int:
        async with await AsyncClient.connect(make_settings()) as client:
            agent = await client.session(SID, policy=POLICY)
            await agent.append(conversation)

            async def model(system: str, messages: list[dict[str, Any]]) -> Any:
                return await asyncio.to_thread(provider, system, messages)

            await agent.call(model)
            return agent.summarizer_calls

    assert asyncio.run(scenario()) >= 1
    assert provider.stats.by_status == {400: 1, 200: 1}


def test_inline_fold_wins_over_a_background_fold_in_flight(
        make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
        tmp_path: Path, conversation: list[Message]) -> None:
    database = postgres_url(request)
    summarizer_api = FakeProvider()  # the worker's summarizer model, held mid-call below
    summarizer_api.hold()
    with summarizer_api.serve() as server:
        worker_settings = make_settings(database_url=database, summarizer="anthropic",
                                        anthropic_api_key="sk-fake",
                                        anthropic_base_url=server.base_url, metrics_port=0)
        started(request, worker_process(worker_settings, tmp_path / "worker.log"))
        with connect(make_settings(database_url=database)) as client:
            # Past its trigger (the background job has a fold to make), with a budget the
            # guard's cheap layers meet and the stand-in's 12k window still refuses; the
            # handle shrinks requests on their own, so the overflow is what folds inline.
            agent = _agent(client, conversation, FoldPolicy(budget_tokens=20_000))
            agent.over_budget = "shrink"
            app = make_celery(worker_settings)
            job_id = make_enqueue(app)(SID, None, "threshold", None)
            # The background job claimed the session and is waiting on its summarizer.
            assert summarizer_api.wait_for_calls(1, timeout_s=120)
            assert client.store.get_session(SID).claimed_by == job_id
            provider = FakeProvider(context_window=12_000)
            agent.call(provider)
            assert provider.stats.by_status == {400: 1, 200: 1}
            assert agent.last_fold is not None and agent.last_fold.outcome == "folded"
            summarizer_api.release()
            result = app.AsyncResult(job_id).get(timeout=120)
            app.close()
            assert result["session"] == SID and result["outcome"] == "stale"
            window = client.store.read_window(SID)
            assert sum(1 for item in window.items if item.kind == "summary") == 1
            assert {s.job_id for s in client.store.spans(SID)} == {agent.last_fold.job_id}
            assert [e.message for e in agent.ledger()] == conversation
            wait_until(lambda: client.store.get_session(SID).claimed_by is None,
                       timeout_s=30, what="the claim to be released")


@dataclass
class LateFold:
    """A background fold held on its summarizer while an agent's handle waits to call."""

    client: Client
    agent: Any
    summarizer_api: FakeProvider
    app: Any
    job_id: str

    def result(self) -> Any:
        """The fold job's result, once the summarizer is released."""
        try:
            return self.app.AsyncResult(self.job_id).get(timeout=120)
        finally:
            self.app.close()


@contextmanager
def _late_fold(make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
               tmp_path: Path, conversation: list[Message], *,
               guard_wait_s: float) -> Iterator[LateFold]:
    """A worker whose summarizer holds every call, a fold job it has taken for a 20k session,
    and the agent's handle on that session (its client waits ``guard_wait_s`` for a fold)."""
    database = postgres_url(request)
    summarizer_api = FakeProvider()
    summarizer_api.hold()
    with summarizer_api.serve() as server:
        worker_settings = make_settings(database_url=database, summarizer="anthropic",
                                        anthropic_api_key="sk-fake",
                                        anthropic_base_url=server.base_url, metrics_port=0)
        started(request, worker_process(worker_settings, tmp_path / "worker.log"))
        with connect(make_settings(database_url=database, guard_wait_s=guard_wait_s)) as client:
            agent = _agent(client, conversation, FoldPolicy(budget_tokens=20_000))
            app = make_celery(worker_settings)
            job_id = make_enqueue(app)(SID, None, "threshold", None)
            assert summarizer_api.wait_for_calls(1, timeout_s=120)
            yield LateFold(client, agent, summarizer_api, app, job_id)


def test_the_cap_waits_for_the_fold_in_flight_then_folds_inline_when_it_is_too_late(
        make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
        tmp_path: Path, conversation: list[Message]) -> None:
    """A background fold held on its summarizer is late: the next request is past the guard's
    line, so the default ``over_budget="cap"`` waits for it (``guard_wait_s``), then folds
    inline (its claim wins) instead of sending a shrink of the request alone; the late fold
    then loses its compare-and-set."""
    with _late_fold(make_settings, request, tmp_path, conversation, guard_wait_s=0.5) as late:
        agent, client = late.agent, late.client
        provider = FakeProvider()
        waited = guard_count("waited")
        agent.call(provider)
        assert provider.stats.by_status == {200: 1}
        assert agent.fold_waits == 1 and agent.fold_wait_s >= 0.5
        assert guard_count("waited") == waited  # it did not land: folded inline
        assert agent.cap_folds == 1 and agent.guarded_requests == 0
        assert agent.last_fold is not None and agent.last_fold.outcome == "folded"
        late.summarizer_api.release()
        assert late.result()["outcome"] == "stale"
        assert {s.job_id for s in client.store.spans(SID)} == {agent.last_fold.job_id}
        assert [e.message for e in agent.ledger()] == conversation


def test_the_cap_sends_the_window_the_fold_in_flight_leaves_when_it_lands_in_time(
        make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
        tmp_path: Path, conversation: list[Message], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same late fold, released while the agent waits for it: the request goes out on the
    window the background fold left, and no summarizer is called on the agent's path."""
    with _late_fold(make_settings, request, tmp_path, conversation, guard_wait_s=120) as late:
        agent, client = late.agent, late.client
        waiting = threading.Event()
        wait = client.await_window_change

        def waits(session_id: str, revision: int, tokens: int, timeout_s: float) -> bool:
            waiting.set()
            return wait(session_id, revision, tokens, timeout_s)

        monkeypatch.setattr(client, "await_window_change", waits)
        provider = FakeProvider(keep_requests=5)
        waited = guard_count("waited")
        caller = threading.Thread(target=agent.call, args=(provider,))
        caller.start()
        assert waiting.wait(60), "the request did not wait for the fold on its way"
        late.summarizer_api.release()
        caller.join(120)
        assert not caller.is_alive()
        assert provider.stats.by_status == {200: 1}
        assert agent.fold_waits == 1 and agent.cap_folds == 0 == agent.summarizer_calls
        assert guard_count("waited") == waited + 1
        assert late.result()["outcome"] == "folded"
        assert {s.job_id for s in client.store.spans(SID)} == {late.job_id}
        # What went out is the window the background fold left.
        assert provider.requests[-1]["messages"] == agent.window(recall=True).messages


def test_a_fold_that_lands_between_two_reads_of_the_wait_is_sent_not_folded_again(
        make_settings: Callable[..., Settings], conversation: list[Message],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker commits its fold before its job lets go of the session's fold lock. A request
    that read the session row before the commit and looks for the lock after it finds nothing
    on its way: it reads the row once more, and goes out on the window the fold left, with no
    fold of its own (what CI once caught: the agent then folded that window again, measured by
    the size of the one before)."""
    with connect(make_settings(guard_wait_s=30)) as client:
        agent = _agent(client, conversation, FoldPolicy(budget_tokens=20_000))
        worker = client.session(SID)  # stands for the worker's visit
        landed: list[Any] = []

        def lock_gone_after_the_commit(info: Any, tokens: int) -> None:
            if not landed:
                landed.append(worker.fold_inline(trigger="threshold"))
            return None

        monkeypatch.setattr(client, "background_fold", lock_gone_after_the_commit)
        provider = FakeProvider(keep_requests=5)
        agent.call(provider)
        assert [r.outcome for r in landed] == ["folded"]
        assert agent.fold_waits == 1
        assert agent.inline_folds == 0 == agent.cap_folds == agent.summarizer_calls
        assert provider.requests[-1]["messages"] == agent.window(recall=True).messages
        assert [e.message for e in agent.ledger()] == conversation


def test_a_fold_that_lands_after_the_wait_gave_up_is_measured_not_folded_again(
        make_settings: Callable[..., Settings], conversation: list[Message],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same fold, landing after the wait found nothing on its way and before the agent's
    inline claim: the inline visit finds the window it measured replaced, records that
    (``stale``, naming both revisions) and folds nothing; the request goes out on the new
    window."""
    with connect(make_settings(guard_wait_s=30)) as client:
        agent = _agent(client, conversation, FoldPolicy(budget_tokens=20_000))
        worker = client.session(SID)
        landed: list[Any] = []

        def gave_up_then_it_lands(session_id: str, revision: int, tokens: int,
                                  timeout_s: float) -> bool:
            landed.append(worker.fold_inline(trigger="threshold"))
            return False

        monkeypatch.setattr(client, "await_window_change", gave_up_then_it_lands)
        provider = FakeProvider(keep_requests=5)
        waited = guard_count("waited")
        agent.call(provider)
        assert [r.outcome for r in landed] == ["folded"]
        assert agent.cap_folds == 0 == agent.summarizer_calls
        assert agent.last_fold is not None and agent.last_fold.outcome == "stale"
        assert "window moved" in agent.last_fold.detail
        assert guard_count("waited") == waited + 1
        records = client.store.records(SID)
        assert records[-1].outcome == "stale" and records[-1].job_id == agent.last_fold.job_id
        assert [s.job_id for s in client.store.spans(SID)] == [landed[0].job_id]
        assert provider.requests[-1]["messages"] == agent.window(recall=True).messages


class _Clock:
    """``time`` for the wait, advanced by its own sleeps (the wait reads no other clock)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_fold_found_expected_after_a_long_pending_wait_still_gets_its_grace(
        make_settings: Callable[..., Settings], conversation: list[Message],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job holds the fold lock for ten seconds and ends without folding (it read the window
    before the request's append): the next job is only expected. Its grace counts from then,
    not from the start of the wait (what the demo once hit: the grace had run out before the
    job was even expected, so the agent folded inline)."""
    clock = _Clock()
    with connect(make_settings()) as client:
        _agent(client, conversation, FoldPolicy(budget_tokens=20_000))
        info = client.store.get_session(SID)
        read = client.store.get_session

        def row(sid: str) -> Any:
            fresh = read(sid)  # the next job's fold lands at 11.5 s
            return replace(fresh, revision=fresh.revision + 1) if clock.now >= 11.5 else fresh

        monkeypatch.setattr(client.store, "get_session", row)
        monkeypatch.setattr(client, "background_fold",
                            lambda i, tokens: "pending" if clock.now < 10 else "expected")
        nudges: list[str] = []
        monkeypatch.setattr(client, "nudge", lambda sid, revision: nudges.append(sid) or True)
        monkeypatch.setattr("sessionfold.client.connection.time", clock)
        assert client.await_window_change(SID, info.revision, info.current_tokens, 15.0)
        assert 11.5 <= clock.now < 12.5 and nudges == [SID]
