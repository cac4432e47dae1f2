"""Fold economics in the runtime: prices as settings, priced visits, and idle (cold-cache) folds.

Against the real Redis and a real (SQLite) store, with a recording enqueue: the scheduler keeps
each session's last call time from the usage stream, and its sweep enqueues an ``idle`` fold for
a session idle past its cache's lifetime and past its idle trigger, never for a busy one. The
fold procedure prices the visit with the settings' one price table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sessionfold.core.economics import opening_trigger_tokens
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.prices import DEFAULT_PRICES
from sessionfold.core.summarizers import ExtractiveSummarizer
from sessionfold.core.window import SummarizerUsage
from sessionfold.runtime.fold_procedure import FoldJob, run_fold
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.prices import fold_pricing, summarizer_cost_usd
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent, UsagePublisher
from sessionfold.store.results import SessionInfo
from sessionfold.store.schema import sessions
from sessionfold.store.store import SessionStore
from sessionfold.workers.scheduler import Scheduler, skip_reason

BUDGET = 10_000  # trigger 8,500; idle trigger 5,000
NOW = 1_900_000_000.0  # the scheduler's clock in these tests


# --- prices are settings ------------------------------------------------------------------------

def test_a_bad_prices_setting_is_refused_naming_the_variable_the_model_and_the_field(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONFOLD_PRICES", '{"claude-haiku-4-5": {"cache_read_multiplier": 2}}')
    with pytest.raises(InvalidInputError, match=r"SESSIONFOLD_PRICES: prices of "
                       r"'claude-haiku-4-5': invalid ModelPrices: cache_read_multiplier is a "
                       r"discount on input"):
        Settings()
    monkeypatch.setenv("SESSIONFOLD_PRICES", '{"my-model": {"input_per_mtok": 1}}')
    with pytest.raises(InvalidInputError, match=r"prices of 'my-model'.*output_per_mtok: "
                       r"Field required"):
        Settings()
    monkeypatch.setenv("SESSIONFOLD_PRICES", "{claude: 1}")
    with pytest.raises(InvalidInputError, match=r"SESSIONFOLD_PRICES: not JSON"):
        Settings()


def test_an_agent_model_without_prices_is_refused_at_start() -> None:
    with pytest.raises(InvalidInputError, match=r"SESSIONFOLD_AGENT_MODEL: no prices for model "
                       r"'gpt-9'.*SESSIONFOLD_PRICES"):
        Settings(agent_model="gpt-9")


def test_the_prices_setting_feeds_the_one_table_summaries_and_folds_are_priced_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONFOLD_PRICES", '{"claude-haiku-5-5": {"input_per_mtok": 0.5}, '
                       '"my-agent": {"input_per_mtok": 4, "output_per_mtok": 20}}')
    settings = Settings(agent_model="my-agent", summarizer="anthropic",
                        anthropic_api_key="sk-test")
    table = settings.price_table()
    usage = SummarizerUsage(model="claude-haiku-5-5", input_tokens=1_000_000,
                            output_tokens=1_000_000)
    assert summarizer_cost_usd(usage, table) == pytest.approx(0.5 + 5.0)
    assert summarizer_cost_usd(usage) == pytest.approx(1.0 + 5.0)  # the defaults, unchanged
    pricing = fold_pricing(settings)
    assert pricing.agent.input_per_mtok == 4 and pricing.summarizer is not None
    assert pricing.summarizer.input_per_mtok == 0.5 and pricing.ttl == "5m"
    # The offline summarizer is free; the cache's lifetime follows its TTL unless set.
    offline = fold_pricing(Settings(summarizer="offline"))
    assert offline.summarizer is not None and offline.summarizer.input_per_mtok == 0
    assert offline.agent == DEFAULT_PRICES["claude-sonnet-4-5"]
    assert Settings(cache_ttl="1h").cache_cold_after_s == 3600
    assert Settings(cache_lifetime_s=30).cache_cold_after_s == 30


# --- the scheduler's idle sweep -------------------------------------------------------------------

class RecordingEnqueue:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, int | None, str, str | None]] = []

    def __call__(self, session_id: str, enqueued_epoch: int | None, trigger: str,
                 lock_token: str | None) -> str:
        self.jobs.append((session_id, enqueued_epoch, trigger, lock_token))
        return f"job-{len(self.jobs)}"


def tool_step(n: int) -> list[dict[str, Any]]:
    """A step whose reasoning outweighs its (maskable) tool output: masking it is shallow."""
    text = " ".join(f"reasoning{n}w{i}" for i in range(300))
    out = "\n".join(f"line {i} of step {n}: src/mod_{n}.py" for i in range(25))
    return [{"role": "assistant", "content": [
                {"type": "text", "text": text},
                {"type": "tool_use", "id": f"t{n}", "name": "bash",
                 "input": {"command": f"ls {n}"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"t{n}", "content": out}]}]


def new_session(store: SessionStore, sid: str, steps: int = 2, budget: int = BUDGET,
                **policy: Any) -> SessionInfo:
    store.create_session(sid, FoldPolicy(budget_tokens=budget, **policy), system="agent")
    store.append(sid, [{"role": "user", "content": "Fix TICKET-1 in src/app.py"},
                       *(m for n in range(1, steps + 1) for m in tool_step(n))])
    return store.get_session(sid)


def trigger_at_policys(store: SessionStore, *sids: str) -> None:
    """Store the policy's trigger as these sessions' own (what a priced visit that found the
    fold not paying before it leaves): a new session opens far lower, at half the target."""
    for sid in sids:
        policy = store.get_session(sid).policy
        with store.engine.begin() as conn:
            conn.execute(sa.update(sessions).where(sessions.c.id == sid)
                         .values(trigger_tokens=policy.trigger_tokens))


def call(info: SessionInfo, tokens: int, at: float) -> UsageEvent:
    return UsageEvent(session_id=info.id, seq=info.ledger_len - 1, revision=info.revision,
                      input_tokens=tokens, model="claude-sonnet-4-5", time=at)


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(scheduler_block_ms=10, scheduler_policy_cache_s=0,
                         scheduler_sweep_interval_s=3600)


@pytest.fixture
def enqueue() -> RecordingEnqueue:
    return RecordingEnqueue()


@pytest.fixture
def scheduler(settings: Settings, sqlite_store: SessionStore, redis_conn: redis.Redis,
              enqueue: RecordingEnqueue) -> Scheduler:
    return Scheduler(settings, sqlite_store, redis_conn, enqueue, consumer_name="sched-idle",
                     metrics_=Metrics(CollectorRegistry()), clock=lambda: NOW)


@pytest.fixture
def publisher(redis_conn: redis.Redis, settings: Settings) -> UsagePublisher:
    return UsagePublisher(redis_conn, Keys.from_settings(settings), maxlen=100_000)


def last_call(client: redis.Redis, settings: Settings, sid: str) -> float | None:
    keys = Keys.from_settings(settings)
    return client.zscore(keys.last_calls(keys.partition_of(sid)), sid)


@pytest.mark.redis
def test_the_scheduler_keeps_each_sessions_last_call_time_and_never_moves_it_back(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        redis_conn: redis.Redis, settings: Settings) -> None:
    info = new_session(sqlite_store, "s1")
    spaced = new_session(sqlite_store, "agent 7: west")  # an id may hold spaces
    publisher.publish(call(info, 6_000, at=NOW - 50))
    publisher.publish(call(spaced, 6_000, at=NOW - 60.25))
    scheduler.run_once()
    assert last_call(redis_conn, settings, "s1") == NOW - 50
    assert last_call(redis_conn, settings, "agent 7: west") == NOW - 60.25
    late = UsageEvent(session_id="s1", seq=info.ledger_len - 2, revision=info.revision,
                      input_tokens=5_000, time=NOW - 80)  # an older report, delivered late
    publisher.publish(late)
    scheduler.run_once()
    assert last_call(redis_conn, settings, "s1") == NOW - 50


@pytest.mark.redis
def test_the_idle_sweep_enqueues_an_idle_session_over_its_idle_trigger_and_not_a_busy_one(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        enqueue: RecordingEnqueue, redis_conn: redis.Redis, settings: Settings) -> None:
    idle = new_session(sqlite_store, "idle")
    busy = new_session(sqlite_store, "busy")
    small = new_session(sqlite_store, "small")
    windowed = new_session(sqlite_store, "windowed", economics="window")
    trigger_at_policys(sqlite_store, "idle", "busy", "small")
    lifetime = settings.cache_cold_after_s
    assert lifetime == 300
    # All between the idle trigger (5,000) and the trigger (8,500): no threshold job.
    publisher.publish(call(idle, 6_000, at=NOW - lifetime - 1))
    publisher.publish(call(busy, 6_000, at=NOW - lifetime + 5))
    publisher.publish(call(small, 4_000, at=NOW - 3600))
    publisher.publish(call(windowed, 7_000, at=NOW - 3600))
    stats = scheduler.run_once()
    assert stats.accepted == 4 and enqueue.jobs == []
    stats = scheduler.run_once()
    scheduler.sweep(stats)
    assert [(sid, trigger) for sid, _, trigger, _ in enqueue.jobs] == [("idle", "idle")]
    assert enqueue.jobs[0][1] == sqlite_store.get_session("idle").fold_epoch
    # Looked at once per idle gap: the idle and the too-small ones leave the set, the busy one
    # stays until it is idle too.
    assert last_call(redis_conn, settings, "idle") is None
    assert last_call(redis_conn, settings, "small") is None
    assert last_call(redis_conn, settings, "busy") == NOW - lifetime + 5
    scheduler.sweep(stats)
    assert len(enqueue.jobs) == 1
    # Its next call brings it back for the next idle gap.
    publisher.publish(call(sqlite_store.get_session("idle"), 6_100, at=NOW - lifetime - 0.5))
    scheduler.run_once()
    assert last_call(redis_conn, settings, "idle") == NOW - lifetime - 0.5


def test_an_idle_job_is_judged_by_the_idle_trigger_alone(sqlite_store: SessionStore) -> None:
    info = new_session(sqlite_store, "s1")
    trigger_at_policys(sqlite_store, "s1")
    sqlite_store.record_usage("s1", {"input_tokens": 6_000}, seq=info.ledger_len - 1,
                              revision=info.revision)
    info = sqlite_store.get_session("s1")
    assert skip_reason(info) == "under-trigger"
    assert skip_reason(info, trigger="idle") is None
    assert skip_reason(replace(info, current_tokens=4_000), trigger="idle") == \
        "under-idle-trigger"
    sqlite_store.set_paused("s1", True)
    assert skip_reason(sqlite_store.get_session("s1"), trigger="idle") == "paused"


# --- the fold procedure prices the visit ------------------------------------------------------

def report(store: SessionStore, sid: str, tokens: int) -> None:
    info = store.get_session(sid)
    store.record_usage(sid, {"input_tokens": tokens}, seq=info.ledger_len - 1,
                       revision=info.revision)


def test_an_idle_fold_pays_with_the_cold_cache_and_the_same_fold_warm_is_refused_on_record(
        sqlite_store: SessionStore, make_settings: Callable[..., Settings]) -> None:
    pricing = fold_pricing(make_settings())
    new_session(sqlite_store, "s1", steps=40, budget=90_000, layers=("mask-tool-results",))
    size = sqlite_store.get_session("s1").window_tokens
    report(sqlite_store, "s1", int(size * 1.01))  # ~0.7 of the budget: the idle range only
    summarizer = ExtractiveSummarizer()
    threshold = run_fold(sqlite_store, summarizer, FoldJob("s1", "j-threshold"),
                         pricing=pricing)
    # Past the target, where a priced session is first visited: masking alone is too shallow
    # to pay for the cache break yet, and the next visit waits for where it would.
    assert threshold.outcome == "refused" and "would-not-pay" in threshold.refusals
    assert sqlite_store.get_session("s1").trigger_tokens > int(size * 1.01)
    unpriced = run_fold(sqlite_store, summarizer, FoldJob("s1", "j-unpriced"))
    assert unpriced.outcome == "nothing-to-fold"  # unpriced: under the policy's trigger
    # Past the trigger the same shallow fold would not pay for its cache break: refused, with
    # the figures, and the record reads back from the store the same.
    report(sqlite_store, "s1", 77_000)
    warm = run_fold(sqlite_store, summarizer, FoldJob("s1", "j-warm"), pricing=pricing)
    assert warm.outcome == "refused" and "would-not-pay" in warm.refusals
    stored = sqlite_store.records("s1")[-1]
    assert stored.outcome == "refused" and stored.economics is not None
    assert stored.economics["why"] == "would-not-pay" and stored.economics["saving_now"] < 0
    assert [r.reason for r in stored.refusals if r.reason == "would-not-pay"]
    assert sqlite_store.get_session("s1").last_visit_outcome == "refused"
    # Idle past the cache's lifetime: the next call rewrites the cache anyway, so it pays.
    report(sqlite_store, "s1", int(size * 1.01) + 1)
    idle = run_fold(sqlite_store, summarizer, FoldJob("s1", "j-idle", trigger="idle"),
                    pricing=pricing)
    assert idle.outcome == "folded" and idle.record is not None
    assert idle.record.trigger == "idle" and idle.record.economics is not None
    assert idle.record.economics["cold"] and idle.record.economics["why"] == "pays"
    assert sqlite_store.records("s1")[-1].trigger == "idle"


def test_without_prices_a_dollars_policy_folds_as_before(sqlite_store: SessionStore) -> None:
    new_session(sqlite_store, "s1", steps=40, budget=90_000, layers=("mask-tool-results",))
    report(sqlite_store, "s1", 77_000)
    plain = run_fold(sqlite_store, ExtractiveSummarizer(), FoldJob("s1", "j1"))
    assert plain.outcome == "folded" and plain.record is not None
    assert plain.record.economics is None


# --- the next visit: where the cost model says, kept by the store --------------------------------

def test_a_priced_fold_moves_the_sessions_trigger_to_its_cycles_optimum_and_the_sweep_follows(
        sqlite_store: SessionStore, make_settings: Callable[..., Settings],
        scheduler: Scheduler, enqueue: RecordingEnqueue) -> None:
    pricing = fold_pricing(make_settings())
    new_session(sqlite_store, "s1", steps=40, budget=90_000)
    policy = sqlite_store.get_session("s1").policy
    opening = sqlite_store.get_session("s1").trigger_tokens
    assert opening == opening_trigger_tokens(policy) == policy.target_tokens // 2
    report(sqlite_store, "s1", 77_000)  # past the trigger (76,500)
    folded = run_fold(sqlite_store, ExtractiveSummarizer(), FoldJob("s1", "j1"), pricing=pricing)
    assert folded.outcome == "folded" and folded.record is not None
    assert folded.record.economics is not None and folded.record.economics["why"] == "pays"
    info = sqlite_store.get_session("s1")
    # The trigger of the cycle the fold chose: far under the policy's trigger.
    assert info.trigger_tokens == math.ceil(folded.record.economics["chosen"]["trigger_tokens"])
    assert info.current_tokens < info.trigger_tokens < policy.trigger_tokens
    assert not info.over_trigger and skip_reason(info) == "under-trigger"
    # An append that takes it past the new trigger says so (the nudge) and the sweep, the SQL
    # on the same column, finds it: due long before the policy's trigger.
    steps = [m for n in range(41, 200) for m in tool_step(n)]
    crossed = False
    for i in range(0, len(steps), 2):
        result = sqlite_store.append("s1", steps[i:i + 2])
        if result.crossed_trigger:
            crossed = True
            break
    info = sqlite_store.get_session("s1")
    assert crossed and info.over_trigger and info.current_tokens < policy.trigger_tokens
    assert skip_reason(info) is None
    assert [i.id for i in sqlite_store.over_trigger()] == ["s1"]
    stats = scheduler.run_once()
    scheduler.sweep(stats)
    assert [(sid, trigger) for sid, _, trigger, _ in enqueue.jobs] == [("s1", "threshold")]
    # The visit at the lowered trigger is priced like any: here it pays and folds again.
    again = run_fold(sqlite_store, ExtractiveSummarizer(), FoldJob("s1", "j2"), pricing=pricing)
    assert again.outcome == "folded" and again.record is not None
    assert again.record.economics is not None and again.record.economics["why"] == "pays"
    # A policy change opens low again (nothing priced under the new policy yet).
    sqlite_store.set_policy("s1", policy.model_copy(update={"keep_recent_turns": 3}))
    assert sqlite_store.get_session("s1").trigger_tokens == opening


def test_an_unpriced_visit_waits_for_the_policys_trigger_whatever_the_stored_one_says(
        sqlite_store: SessionStore, make_settings: Callable[..., Settings]) -> None:
    pricing = fold_pricing(make_settings())
    new_session(sqlite_store, "s1", steps=40, budget=90_000)
    policy = sqlite_store.get_session("s1").policy
    report(sqlite_store, "s1", 77_000)
    run_fold(sqlite_store, ExtractiveSummarizer(), FoldJob("s1", "j1"), pricing=pricing)
    lowered = sqlite_store.get_session("s1").trigger_tokens
    assert lowered < policy.trigger_tokens
    report(sqlite_store, "s1", lowered + 1_000)
    plain = run_fold(sqlite_store, ExtractiveSummarizer(), FoldJob("s1", "j2"))
    assert plain.outcome == "nothing-to-fold"
    assert f"the trigger of {policy.trigger_tokens}" in plain.detail
    # ...and its record puts the policy's trigger back.
    assert sqlite_store.get_session("s1").trigger_tokens == policy.trigger_tokens
