"""The client against the real store and Redis: sessions, windows, usage reports, call()."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from anthropic.types import Usage
from pipeline_harness import free_port, transcript_session
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.client import (
    AsyncClient,
    Client,
    SessionHandle,
    connect,
    place_cache_breakpoints,
)
from sessionfold.core.errors import InvalidInputError, InvalidMessageError, SessionNotFoundError
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.fold_procedure import FoldJob, run_fold
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent

POLICY = FoldPolicy(budget_tokens=8000)


@pytest.fixture
def client(make_settings: Callable[..., Settings]) -> Iterator[Client]:
    with connect(make_settings()) as c:
        yield c


@pytest.fixture
def conversation() -> list[Message]:
    return transcript_session("django__django-15554", 60).messages


def _stream(conn: redis.Redis, keys: Keys) -> list[UsageEvent]:
    entries: Any = [e for stream in keys.usage_streams() for e in conn.xrange(stream)]
    events = [UsageEvent.from_fields(fields) for _, fields in entries]
    return sorted(events, key=lambda ev: ev.time)  # one stream per partition: merge by time


def test_session_is_created_with_a_policy_and_found_without_one(client: Client) -> None:
    with pytest.raises(SessionNotFoundError, match="pass policy="):
        client.session("a1")
    client.session("a1", policy=POLICY, system="You are terse.")
    assert client.session("a1").info().system == "You are terse."
    bigger = FoldPolicy(budget_tokens=16_000)
    client.session("a1", policy=bigger)
    assert client.store.get_session("a1").policy == bigger
    with pytest.raises(InvalidInputError, match="system prompt"):
        client.session("a1", system="You are verbose.")
    with pytest.raises(InvalidInputError, match="over_budget"):
        client.session("a1", over_budget="wait")  # type: ignore[arg-type]


def test_window_ledger_and_recover(client: Client, conversation: list[Message]) -> None:
    agent = client.session("a1", policy=POLICY)
    result = agent.append(conversation, key="batch-1")
    assert agent.append(conversation, key="batch-1").duplicate  # a retried append is not doubled
    view = agent.window()
    assert view.messages == [m.to_json() for m in conversation]
    assert (view.revision, view.last_seq) == (result.revision, len(conversation) - 1)
    report = run_fold(client.store, client.summarizer, FoldJob("a1", "job-1"))
    assert report.outcome == "folded"
    folded = agent.window()
    summary = next(item for item in folded.items if item.kind == "summary")
    assert folded.revision > view.revision and len(folded.messages) < len(view.messages)
    assert agent.recover(summary) == conversation[summary.start_seq:summary.end_seq + 1]
    assert agent.recover((summary.start_seq, summary.end_seq)) == agent.recover(summary)
    assert [e.message for e in agent.ledger()] == conversation


def test_cache_breakpoints_go_after_the_stable_head_and_on_the_last_message(
        client: Client, conversation: list[Message]) -> None:
    agent = client.session("a1", policy=POLICY)
    agent.append(conversation)
    run_fold(client.store, client.summarizer, FoldJob("a1", "job-1"))
    view = agent.window(cache_breakpoints=True)
    head = max(i for i, item in enumerate(view.items) if item.kind == "summary")
    marked = [i for i, m in enumerate(view.messages)
              if isinstance(m["content"], list)
              and any("cache_control" in b for b in m["content"])]
    assert marked == [head, len(view.messages) - 1]
    # Placing markers changes nothing stored: a plain read and the ledger carry none.
    assert "cache_control" not in str(agent.window().messages)
    assert "cache_control" not in str([e.message for e in agent.ledger()])


def test_cache_breakpoints_skip_thinking_blocks_and_leave_the_input_alone() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "answer"},
                    {"type": "thinking", "thinking": "hmm", "signature": "s"}]}]
    out = place_cache_breakpoints(messages, 0)
    assert out[0]["content"] == [{"type": "text", "text": "task",
                                  "cache_control": {"type": "ephemeral"}}]
    assert out[1]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in out[1]["content"][1]
    assert messages[0]["content"] == "task"  # the input is not modified


def test_report_usage_publishes_the_providers_counts(
        client: Client, redis_conn: redis.Redis, redis_keys: Keys) -> None:
    agent = client.session("a1", policy=POLICY)
    usage = Usage(input_tokens=120, output_tokens=30, cache_read_input_tokens=1000,
                  cache_creation_input_tokens=50)
    assert agent.report_usage(usage, seq=41, revision=7, model="claude-x")
    assert agent.report_usage({"input_tokens": 5, "output_tokens": 1}, seq=42, revision=8)
    first, second = _stream(redis_conn, redis_keys)
    assert (first.session_id, first.seq, first.revision, first.model) == ("a1", 41, 7, "claude-x")
    assert (first.input_tokens, first.cache_read_input_tokens,
            first.cache_creation_input_tokens, first.output_tokens) == (120, 1000, 50, 30)
    assert first.prompt_tokens == 1170 and second.input_tokens == 5
    # Zero prompt tokens is not a measurement: flagged, not sent. Garbage does not raise.
    assert not agent.report_usage({"input_tokens": 0}, seq=43, revision=9)
    assert not agent.report_usage({"input_tokens": -3}, seq=43, revision=9)
    assert agent.unmeasured == 1 and len(_stream(redis_conn, redis_keys)) == 2


def test_report_usage_never_fails_the_agent_when_redis_is_away(
        make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with connect(settings) as client:
        agent = client.session("a1", policy=POLICY)
        for seq in range(3):
            assert agent.report_usage({"input_tokens": 100}, seq=seq, revision=1) is False
        assert client.publisher is not None and client.publisher.buffered == 3


def test_call_within_budget_sends_the_window_and_reports_usage(
        client: Client, conversation: list[Message], redis_conn: redis.Redis,
        redis_keys: Keys) -> None:
    agent = client.session("a1", policy=FoldPolicy(budget_tokens=100_000), system="Be brief.")
    agent.append(conversation[:5])
    provider = FakeProvider()
    seen: list[tuple[str, list[dict[str, Any]]]] = []

    def model(system: str, messages: list[dict[str, Any]]) -> Any:
        seen.append((system, messages))
        return provider(system, messages)

    reply = agent.call(model)
    view = agent.window()
    assert seen == [("Be brief.", view.messages)]
    (event,) = _stream(redis_conn, redis_keys)
    assert event.input_tokens == reply.usage.input_tokens
    assert (event.seq, event.revision) == (view.last_seq, view.revision)
    assert agent.calls == 1 and client.summarizer_calls == 0


def test_past_the_budget_call_caps_sends_or_folds_first_by_option(
        client: Client, conversation: list[Message]) -> None:
    agent = client.session("a1", policy=POLICY)
    agent.append(conversation)
    provider = FakeProvider()
    sizes: list[int] = []

    def model(system: str, messages: list[dict[str, Any]]) -> Any:
        reply = provider(system, messages)
        sizes.append(reply.usage.input_tokens)
        return reply

    # "cap" (the default) and "send" both go out as the guard's best shrink, under the budget
    # here; "fold" folds the stored window inline first.
    agent.call(model)
    agent.call(model, over_budget="send")
    assert sizes[0] == sizes[1] <= POLICY.budget_tokens
    assert agent.summarizer_calls == agent.cap_folds == agent.inline_folds
    agent.call(model, over_budget="fold")
    assert agent.inline_folds >= 1 and agent.summarizer_calls >= 1
    assert client.summarizer_calls == agent.summarizer_calls
    assert client.store.records("a1")[-1].trigger == "overflow"
    with pytest.raises(InvalidInputError, match="over_budget must be one of"):
        agent.call(model, over_budget="later")  # type: ignore[arg-type]


def test_async_client_does_the_same_without_blocking_the_loop(
        make_settings: Callable[..., Settings], conversation: list[Message]) -> None:
    async def scenario() -> tuple[int, int, int]:
        async with await AsyncClient.connect(make_settings()) as client:
            agent = await client.session("a1", policy=FoldPolicy(budget_tokens=100_000))
            await agent.append(conversation[:5])
            provider = FakeProvider()

            async def model(system: str, messages: list[dict[str, Any]]) -> Any:
                await asyncio.sleep(0)
                return provider(system, messages)

            reply = await agent.call(model)
            view = await agent.window()
            ledger = await agent.ledger()
            return reply.usage.input_tokens, len(view.messages), len(ledger)

    tokens, window_len, ledger_len = asyncio.run(scenario())
    assert tokens > 0 and window_len == ledger_len == 5


def test_one_message_appended_without_a_list_is_refused_saying_how_to_pass_it(
        client: Client) -> None:
    agent = client.session("one", policy=FoldPolicy(budget_tokens=4000))
    message = {"role": "user", "content": "hello"}
    for alone in (message, Message.model_validate(message)):
        with pytest.raises(InvalidMessageError, match="list of messages"):
            agent.append(alone)  # type: ignore[arg-type]
    assert agent.ledger() == []


def test_handles_are_independent(client: Client) -> None:
    a = client.session("a1", policy=POLICY)
    b = client.session("b1", policy=POLICY)
    a.append([{"role": "user", "content": "hello"}])
    assert isinstance(b, SessionHandle) and b.window().messages == []
    assert a.window().messages == [{"role": "user", "content": "hello"}]


# --- OpenAI-shaped usage ---------------------------------------------------------------------

#: chat.completions usage: prompt_tokens already includes the cached tokens.
OPENAI_USAGE = {"prompt_tokens": 1234, "completion_tokens": 56, "total_tokens": 1290,
                "prompt_tokens_details": {"cached_tokens": 1000}}


def test_openai_usage_is_published_with_the_prompt_size_it_reports(
        client: Client, redis_conn: redis.Redis, redis_keys: Keys) -> None:
    from types import SimpleNamespace

    agent = client.session("a1", policy=POLICY)
    assert agent.report_usage(OPENAI_USAGE, seq=3, revision=1, model="gpt-4o")
    sdk_object = SimpleNamespace(prompt_tokens=2000, completion_tokens=7, total_tokens=2007,
                                 prompt_tokens_details=SimpleNamespace(cached_tokens=0))
    assert agent.report_usage(sdk_object, seq=4, revision=1)
    first, second = _stream(redis_conn, redis_keys)
    # Counted once: the cached tokens are inside prompt_tokens, not added to it.
    assert (first.prompt_tokens, first.output_tokens) == (1234, 56)
    assert (second.prompt_tokens, second.output_tokens) == (2000, 7)
    assert agent.unmeasured == 0


def test_an_openai_shaped_agent_is_measured_and_folded_in_the_background(
        client: Client, conversation: list[Message], redis_conn: redis.Redis) -> None:
    from sessionfold.workers.scheduler import Scheduler

    # The ledger's own estimate (about 22k tokens) stays under the trigger; only the provider's
    # count (which sees tool definitions and framing too) puts the session over it. (A priced
    # policy would be visited at half its target already: this one waits for its trigger.)
    agent = client.session("oa", policy=FoldPolicy(budget_tokens=40_000, economics="window"))
    agent.append(conversation)
    prompt = agent.info().policy.trigger_tokens + 500
    jobs: list[tuple[str, int | None, str]] = []

    def enqueue(session_id: str, enqueued_epoch: int | None, trigger: str,
                lock_token: str | None) -> str:
        jobs.append((session_id, enqueued_epoch, trigger))
        return f"job-{len(jobs)}"

    scheduler = Scheduler(client.settings, client.store, redis_conn, enqueue,
                          consumer_name="oa-sched")
    scheduler.run_once()  # the store sweep: nothing over its trigger yet
    assert jobs == [] and agent.info().current_tokens < prompt

    def openai_model(system: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        # What an OpenAI-shaped call returns (as a dict): no input_tokens anywhere.
        return {"model": "gpt-4o", "choices": [{"message": {"content": "ok"}}],
                "usage": {**OPENAI_USAGE, "prompt_tokens": prompt}}

    agent.call(openai_model)
    for _ in range(3):
        scheduler.run_once()
    assert agent.unmeasured == 0
    assert agent.info().current_tokens >= prompt, "the session is measured"
    assert [job[0] for job in jobs] == ["oa"], "and the scheduler enqueued its fold"
    # The job, as a worker runs it.
    before = agent.window()
    job = FoldJob("oa", "job-1", enqueued_epoch=jobs[0][1])
    report = run_fold(client.store, client.summarizer, job)
    assert report.outcome == "folded"
    after = agent.window()
    assert after.revision > before.revision and after.tokens < before.tokens
