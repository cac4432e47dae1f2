"""Inline folds meet the same summarizer guards as background folds: the global slots and the
per-session spend cap. Exhausted, they never keep the agent waiting: the inline fold still
folds, with the cheap layers and without the summarizer, and its record says why."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
from pipeline_harness import free_port, transcript_session
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.client import Client, SessionHandle, connect
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.summarizers import ExtractiveSummarizer, Summary
from sessionfold.core.window import SummarizerUsage
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.prices import summarizer_cost_usd
from sessionfold.runtime.providers.anthropic import AnthropicSummarizer
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.slots import SummarizerSlots
from sessionfold.runtime.spend import SpendCap
from sessionfold.runtime.wiring import open_redis, open_store, usage_publisher

SID = "agent-capped"
POLICY = FoldPolicy(budget_tokens=8000)
#: Low enough that masking old tool output alone cannot reach it: the summarize layer is reached.
DEEP = 1000


@pytest.fixture
def conversation() -> list[Message]:
    return transcript_session("django__django-15554", 60).messages


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(summarizer_max_concurrency=1, session_spend_cap_usd=0.01)


@pytest.fixture
def client(settings: Settings) -> Iterator[Client]:
    with connect(settings) as c:
        yield c


@pytest.fixture
def slots(settings: Settings, redis_conn: redis.Redis, redis_keys: Keys) -> SummarizerSlots:
    """The deployment's one global slot, as a worker elsewhere would take it."""
    return SummarizerSlots(redis_conn, redis_keys.summarizer_slots(),
                           settings.summarizer_max_concurrency, ttl_s=120, wait_s=0)


def _agent(client: Client, conversation: Sequence[Message]) -> SessionHandle:
    agent = client.session(SID, policy=POLICY, system="You fix bugs.")
    agent.append(list(conversation))
    return agent


class SlotWatcher:
    """The extractive summarizer, noting how many global slots are held during each call."""

    model = "watched-extractive"
    context_tokens = 1_000_000

    def __init__(self, slots: SummarizerSlots) -> None:
        self.slots = slots
        self.held: list[int] = []

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        self.held.append(self.slots.in_flight())
        return ExtractiveSummarizer().summarize(messages, previous_summary=previous_summary,
                                                must_keep=must_keep)


def _client_with(settings: Settings, summarizer: Any) -> Client:
    """The real client (its store, usage bus and guards from the wiring) with ``summarizer``."""
    url = open_redis(settings).url
    return Client(settings, open_store(settings), usage_publisher(settings, url),
                  redis_url=url, summarizer=summarizer)


def test_an_inline_fold_holds_a_global_slot_for_each_summarizer_call(
        settings: Settings, slots: SummarizerSlots, conversation: list[Message]) -> None:
    watcher = SlotWatcher(slots)
    with _client_with(settings, watcher) as client:
        agent = _agent(client, conversation)
        report = agent.fold_inline(target_tokens=DEEP)
    assert report.summarizer_calls >= 1 and watcher.held
    assert set(watcher.held) == {1}  # its own slot, taken for the call
    assert slots.in_flight() == 0  # and given back


def test_with_every_slot_busy_an_inline_fold_folds_with_the_cheap_layers_and_says_why(
        client: Client, slots: SummarizerSlots, conversation: list[Message]) -> None:
    holder = slots.try_acquire()  # a background fold elsewhere holds the only slot
    assert holder is not None
    agent = _agent(client, conversation)
    before = agent.window().tokens
    report = agent.fold_inline(target_tokens=DEEP)
    assert report.outcome == "folded" and report.summarizer_calls == 0
    assert agent.window().tokens < before  # the cheap layers did their part
    assert "mask-tool-results" in client.store.records(SID)[-1].layers_run
    record = client.store.records(SID)[-1]
    assert "summarize skipped: all 1 global summarizer slots are busy" in record.detail
    assert "slots are busy" in report.detail
    assert slots.in_flight() == 1  # the worker's slot is untouched; the agent took none
    slots.release(holder)
    again = agent.fold_inline(target_tokens=DEEP)
    assert again.summarizer_calls >= 1  # a free slot: the summarizer runs again


def test_an_overflowing_call_succeeds_while_the_slots_are_busy(
        client: Client, slots: SummarizerSlots, conversation: list[Message]) -> None:
    assert slots.try_acquire() is not None
    # A budget past the stand-in's window (the guard leaves the request whole, the provider
    # refuses it); the provider takes what masking old tool output leaves.
    agent = client.session(SID, policy=FoldPolicy(budget_tokens=100_000))
    agent.append(conversation)
    provider = FakeProvider(context_window=20_000)
    reply = agent.call(provider)
    assert reply.content[0].type == "text"
    assert provider.stats.by_status == {400: 1, 200: 1}  # rejected once, then served
    assert agent.inline_folds == 1 and agent.summarizer_calls == 0
    record = client.store.records(SID)[-1]
    assert (record.trigger, record.outcome) == ("overflow", "folded")
    assert "slots are busy" in record.detail and record.summarizer_usage.calls == 0


def test_past_its_spend_cap_an_inline_fold_goes_without_the_summarizer(
        client: Client, settings: Settings, redis_conn: redis.Redis, redis_keys: Keys,
        conversation: list[Message]) -> None:
    agent = _agent(client, conversation)
    spend = SpendCap(redis_conn, settings.session_spend_cap_usd, ttl_s=60)
    key = redis_keys.summarizer_spend(SID, agent.info().incarnation)
    spend.add(key, SummarizerUsage(model="claude-haiku-5-5", calls=1, input_tokens=20_000))
    assert spend.exhausted(key)
    report = agent.fold_inline(target_tokens=DEEP)
    assert report.outcome == "folded" and report.summarizer_calls == 0
    assert "summarize skipped: summarizer spend cap of $0.01 reached for this session" \
        in client.store.records(SID)[-1].detail


def test_what_an_inline_fold_pays_counts_against_the_sessions_spend(
        settings: Settings, redis_conn: redis.Redis, redis_keys: Keys,
        conversation: list[Message]) -> None:
    provider = FakeProvider()
    paid = AnthropicSummarizer(client=provider.anthropic_client())
    with _client_with(settings.model_copy(update={"session_spend_cap_usd": None}),
                      paid) as client:
        agent = _agent(client, conversation)
        report = agent.fold_inline(target_tokens=DEEP)
    assert report.summarizer_calls >= 1
    key = redis_keys.summarizer_spend(SID, report.incarnation or 0)
    spent = SpendCap(redis_conn, None, ttl_s=60).spent(key)
    assert spent == pytest.approx(summarizer_cost_usd(report.summarizer_usage)) and spent > 0


def test_with_redis_away_an_inline_fold_never_pays_blind_and_never_fails_the_agent(
        make_settings: Callable[..., Settings], conversation: list[Message]) -> None:
    settings = make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with connect(settings) as client:
        agent = _agent(client, conversation)
        report = agent.fold_inline(target_tokens=DEEP)
    assert report.outcome == "folded" and report.summarizer_calls == 0
    assert "could not be read (Redis unavailable)" in report.detail
