"""Folds done inline in an agent reach ``/metrics`` exactly once, however many schedulers run.

The agent's process serves no metrics (it is the user's process, on any host): its inline fold
publishes one event on the usage stream, the schedulers' consumer group hands it to exactly one
scheduler, and that scheduler counts it into its own ``folds_total{trigger="overflow"}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from pipeline_harness import transcript_session
from prometheus_client import CollectorRegistry
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.client import Client, connect
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent
from sessionfold.workers.scheduler import Scheduler

pytestmark = pytest.mark.redis

POLICY = FoldPolicy(budget_tokens=8000)


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(scheduler_block_ms=10, scheduler_sweep_interval_s=3600)


@pytest.fixture
def client(settings: Settings) -> Iterator[Client]:
    with connect(settings) as c:
        yield c


def _schedulers(settings: Settings, client: Client, conn: redis.Redis,
                n: int) -> list[tuple[Scheduler, Metrics]]:
    def enqueue(session_id: str, enqueued_epoch: int | None, trigger: str,
                lock_token: str | None) -> str:
        return "job"

    out = []
    for i in range(n):
        meter = Metrics(CollectorRegistry())
        out.append((Scheduler(settings, client.store, conn, enqueue, consumer_name=f"s{i}",
                              metrics_=meter), meter))
    return out


def _total(pairs: list[tuple[Scheduler, Metrics]], name: str, **labels: str) -> float:
    return sum(m.registry.get_sample_value(name, labels) or 0.0 for _, m in pairs)


def test_an_inline_fold_is_counted_once_by_one_of_two_schedulers(
        settings: Settings, client: Client, redis_conn: redis.Redis) -> None:
    agent = client.session("agent-1", policy=POLICY)
    agent.append(transcript_session("django__django-15554", 60).messages)
    provider = FakeProvider(context_window=12_000)
    agent.call(provider)  # rejected as too long, folded inline, retried
    record = client.store.records("agent-1")[-1]
    assert (record.trigger, record.outcome) == ("overflow", "folded")

    pairs = _schedulers(settings, client, redis_conn, 2)
    for _ in range(3):
        for scheduler, _meter in pairs:
            scheduler.run_once()
    folded = {"outcome": "folded", "trigger": "overflow"}
    assert _total(pairs, "sessionfold_folds_total", **folded) == 1
    assert sorted(m.registry.get_sample_value("sessionfold_folds_total", folded) or 0.0
                  for _, m in pairs) == [0.0, 1.0]
    assert _total(pairs, "sessionfold_tokens_saved_total") == \
        record.measured_tokens - record.tokens_after
    assert _total(pairs, "sessionfold_fold_duration_seconds_count", outcome="folded") == 1
    usage = record.summarizer_usage
    assert _total(pairs, "sessionfold_summarizer_tokens_total", model=usage.model,
                  kind="output") == usage.output_tokens
    # Read, counted and acknowledged: nothing left pending for a third scheduler to count.
    keys = Keys.from_settings(settings)
    pending: Any = redis_conn.xpending(keys.usage_stream(0), settings.scheduler_group)
    assert pending["pending"] == 0
    (third, meter), = _schedulers(settings, client, redis_conn, 1)
    third.run_once()
    assert meter.registry.get_sample_value("sessionfold_folds_total", folded) is None


def test_a_refused_inline_fold_counts_its_outcome_and_reasons(
        settings: Settings, client: Client, redis_conn: redis.Redis) -> None:
    agent = client.session("tiny", policy=POLICY)
    agent.append([{"role": "user", "content": "the task"}])
    report = agent.fold_inline(trigger="overflow")
    assert report.record is not None and report.outcome != "folded"
    pairs = _schedulers(settings, client, redis_conn, 2)
    for scheduler, _meter in pairs:
        scheduler.run_once()
    assert _total(pairs, "sessionfold_folds_total", outcome=report.outcome,
                  trigger="overflow") == 1
    for refusal in report.record.refusals:
        assert _total(pairs, "sessionfold_refusals_total", reason=refusal.reason) >= 1


def test_old_usage_readers_see_fold_events_only_as_entries_to_skip(
        settings: Settings, client: Client, redis_conn: redis.Redis) -> None:
    # A usage reader that knows only usage events (say, a tool reading the stream) is not
    # confused by fold events: they carry no usage field.
    agent = client.session("agent-2", policy=POLICY)
    agent.append([{"role": "user", "content": "the task"}])
    agent.fold_inline(trigger="overflow")
    keys = Keys.from_settings(settings)
    entries: Any = redis_conn.xrange(keys.usage_stream(0))
    assert entries and all(b"usage.v1" not in fields for _, fields in entries)
    with pytest.raises(Exception, match="lacks the field"):
        UsageEvent.from_fields(entries[0][1])


@pytest.mark.parametrize("change", [
    {"trigger": "because-i-said-so"}, {"outcome": "a-session-id-7"},
    {"refusals": ["made-up-reason"]}, {"tokens_saved": -5}, {"cost_usd": float("nan")},
    {"model": "x" * 500}, {"extra": 1},
])
def test_a_forged_fold_event_is_skipped_not_counted(
        settings: Settings, client: Client, redis_conn: redis.Redis,
        change: dict[str, Any]) -> None:
    # Label values come from the project's closed sets, never from what an entry says.
    import json

    visit = {"trigger": "overflow", "outcome": "folded", "refusals": [], "tokens_saved": 10,
             "model": "m", "input_tokens": 1, "output_tokens": 1, "cache_read_input_tokens": 0,
             "cache_creation_input_tokens": 0, "cost_usd": 0.0, "duration_s": 0.5, **change}
    keys = Keys.from_settings(settings)
    redis_conn.xadd(keys.usage_stream(0), {b"fold.v1": json.dumps(visit).encode()})
    (scheduler, meter), = _schedulers(settings, client, redis_conn, 1)
    scheduler.run_once()
    assert scheduler.consumer.malformed == 1 and scheduler.consumer.folds == 0
    assert meter.registry.get_sample_value(
        "sessionfold_folds_total", {"outcome": "folded", "trigger": "overflow"}) is None
    pending: Any = redis_conn.xpending(keys.usage_stream(0), settings.scheduler_group)
    assert pending["pending"] == 0
