"""The append-time nudge: an append that takes a session past its trigger tells the scheduler at
once, through the real client, the real Redis streams and the real store (SQLite, and
PostgreSQL for the store's side), without a usage report and without touching what was
measured."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import redis
from pipeline_harness import postgres_url
from prometheus_client import CollectorRegistry
from sessionfold.client import Client, SessionHandle, connect
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import CompactionRecord
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import FIELD, NUDGE_FIELD, NudgeEvent, UsagePublisher
from sessionfold.store.results import SessionGate, SessionInfo, skip_reason
from sessionfold.store.store import SessionStore
from sessionfold.workers.scheduler import Scheduler

pytestmark = pytest.mark.redis

SID = "agent-nudged"
POLICY = FoldPolicy(budget_tokens=10_000)  # trigger at 8,500 tokens


class RecordingEnqueue:
    """Stands in for the Celery enqueue: remembers every job it was asked for."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, int | None, str]] = []

    def __call__(self, session_id: str, enqueued_epoch: int | None, trigger: str,
                 lock_token: str | None) -> str:
        self.jobs.append((session_id, enqueued_epoch, trigger))
        return f"job-{len(self.jobs)}"


class CountingStore(SessionStore):
    """The real store, counting the session reads the scheduler makes."""

    reads: list[str]
    gate_reads: list[str]

    def get_session(self, sid: str) -> SessionInfo:
        self.reads.append(sid)
        return super().get_session(sid)

    def session_gates(self, sids: Iterable[str]) -> dict[str, SessionGate]:
        wanted = list(sids)
        self.gate_reads += wanted
        return super().session_gates(wanted)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return postgres_url(request)


@pytest.fixture
def settings(make_settings: Callable[..., Settings], database_url: str) -> Settings:
    return make_settings(database_url=database_url, scheduler_block_ms=10,
                         scheduler_policy_cache_s=0, scheduler_sweep_interval_s=3600)


@pytest.fixture
def client(settings: Settings) -> Iterator[Client]:
    with connect(settings, migrate=True) as c:
        yield c


@pytest.fixture
def store(settings: Settings, client: Client) -> Iterator[CountingStore]:
    counting = CountingStore.from_url(settings.database_url)
    counting.reads = []
    counting.gate_reads = []
    yield counting
    counting.close()


@pytest.fixture
def enqueue() -> RecordingEnqueue:
    return RecordingEnqueue()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def scheduler(settings: Settings, store: CountingStore, redis_conn: redis.Redis,
              enqueue: RecordingEnqueue, registry: CollectorRegistry) -> Scheduler:
    sched = Scheduler(settings, store, redis_conn, enqueue, consumer_name="sched-n",
                      metrics_=Metrics(registry))
    sched.run_once()  # takes the partitions' leases and makes the groups; sweeps once
    store.reads.clear()
    return sched


def small_talk(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append({"role": "user", "content": f"question {i} about the deployment"})
        out.append({"role": "assistant", "content": f"answer {i}: the pods restarted fine"})
    return out


def big_output(tokens: int) -> list[dict[str, Any]]:
    """A user turn of about ``tokens`` tokens (a pasted log; under the clip size)."""
    text = "\n".join(f"log line {i}: request served in {i % 97} ms" for i in range(tokens // 12))
    return [{"role": "user", "content": text}]


def agent_of(client: Client, policy: FoldPolicy = POLICY) -> SessionHandle:
    agent = client.session(SID, policy=policy, system="ops agent")
    agent.append(small_talk(3))
    return agent


def stream_fields(redis_conn: redis.Redis, settings: Settings) -> list[dict[bytes, bytes]]:
    keys = Keys.from_settings(settings)
    return [fields for _, fields in redis_conn.xrange(keys.usage_stream_of(SID))]


def enqueued_by_nudge(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("sessionfold_fold_jobs_enqueued_total",
                                     {"source": "nudge"}) or 0.0


def test_only_the_append_that_crosses_the_trigger_says_so(client: Client) -> None:
    agent = agent_of(client)
    under = agent.append(big_output(2_000))
    assert under.current_tokens is not None and under.current_tokens < POLICY.trigger_tokens
    assert not under.crossed_trigger
    crossing = agent.append(big_output(2_400) + big_output(2_400) + big_output(2_400))
    assert crossing.current_tokens == agent.info().current_tokens > POLICY.trigger_tokens
    assert crossing.crossed_trigger
    still_over = agent.append(small_talk(1))
    assert not still_over.crossed_trigger  # already past it: the first nudge said it all
    assert agent.nudges == 1


def test_a_paused_session_is_not_nudged_for(client: Client) -> None:
    agent = agent_of(client)
    client.store.set_paused(SID, True)
    result = agent.append(big_output(2_400) * 4)
    assert result.current_tokens is not None and result.current_tokens > POLICY.trigger_tokens
    assert not result.crossed_trigger and agent.nudges == 0


def test_a_large_append_nudges_the_scheduler_which_enqueues_without_a_usage_report(
        client: Client, scheduler: Scheduler, enqueue: RecordingEnqueue,
        registry: CollectorRegistry, redis_conn: redis.Redis, settings: Settings) -> None:
    agent = agent_of(client)
    scheduler.run_once()
    assert enqueue.jobs == []

    agent.append(big_output(2_400) * 4)  # one tool-output-sized burst, past the trigger
    stats = scheduler.run_once()

    assert [(sid, trigger) for sid, _, trigger in enqueue.jobs] == [(SID, "threshold")]
    assert stats.nudged == 1 and stats.events == 0  # no usage event was read
    assert enqueued_by_nudge(registry) == 1
    fields = stream_fields(redis_conn, settings)
    assert [NUDGE_FIELD in f for f in fields] == [True]  # the stream held the nudge alone
    assert not any(FIELD in f for f in fields)


def test_a_nudge_does_not_alter_the_measured_size(
        client: Client, scheduler: Scheduler, enqueue: RecordingEnqueue,
        redis_conn: redis.Redis, settings: Settings) -> None:
    agent = agent_of(client)
    window = agent.window()
    agent.report_usage({"input_tokens": 1_500}, seq=window.last_seq, revision=window.revision)
    scheduler.run_once()
    measured = agent.info()
    assert measured.measured_tokens == 1_500
    keys = Keys.from_settings(settings)
    in_redis = redis_conn.hgetall(keys.measured(SID))

    agent.append(big_output(2_400) * 4)
    scheduler.run_once()

    after = agent.info()
    assert len(enqueue.jobs) == 1
    assert (after.measured_tokens, after.measured_seq, after.measured_revision) == (
        measured.measured_tokens, measured.measured_seq, measured.measured_revision)
    assert after.calibration == measured.calibration
    assert redis_conn.hgetall(keys.measured(SID)) == in_redis


def _past_the_trigger_after_a_visit_that_folded_nothing(client: Client, *, grown: bool
                                                        ) -> SessionInfo:
    """A session past its trigger whose last visit folded nothing, written through the store
    (no nudge, no report), then grown by an append that crosses nothing (``grown``)."""
    client.store.create_session(SID, POLICY, "ops agent")
    client.store.append(SID, small_talk(3) + big_output(2_400) * 4)
    size = client.store.get_session(SID).current_tokens
    client.store.record_visit(SID, CompactionRecord(
        trigger="threshold", outcome="nothing-to-fold", budget_tokens=POLICY.budget_tokens,
        target_tokens=POLICY.target_tokens, measured_tokens=size, tokens_after=size))
    if grown:
        client.store.append(SID, small_talk(2))
    return client.store.get_session(SID)


def test_a_request_held_past_the_line_nudges_the_scheduler_for_the_fold_it_waits_for(
        client: Client, scheduler: Scheduler, enqueue: RecordingEnqueue,
        registry: CollectorRegistry, redis_conn: redis.Redis, settings: Settings) -> None:
    """The session grew since a visit that folded nothing, by appends that cross no trigger
    (no nudge), and the agent's request, held past the guard's line while it waits for the
    fold, sends no usage report: only the sweep (an hour away here) would look. The wait
    nudges the scheduler itself, which queues the job at its next read (what CI caught: the
    agent gave up on the fold it waited for and folded inline, its summary on its own path)."""
    info = _past_the_trigger_after_a_visit_that_folded_nothing(client, grown=True)
    assert skip_reason(info) is None
    assert client.background_fold(info, info.current_tokens) == "expected"
    scheduler.run_once()
    assert enqueue.jobs == []
    assert not client.await_window_change(SID, info.revision, info.current_tokens,
                                          timeout_s=0.3)  # nothing lands: no worker here
    stats = scheduler.run_once()
    assert [(sid, trigger) for sid, _, trigger in enqueue.jobs] == [(SID, "threshold")]
    assert stats.nudged == 1 and enqueued_by_nudge(registry) == 1
    assert [NUDGE_FIELD in f for f in stream_fields(redis_conn, settings)] == [True]


def test_a_request_past_the_line_does_not_wait_for_a_fold_the_scheduler_would_pass_on(
        client: Client, scheduler: Scheduler, enqueue: RecordingEnqueue,
        redis_conn: redis.Redis, settings: Settings) -> None:
    """Not grown since the visit that folded nothing: the scheduler would queue no job, so the
    request neither waits for one nor nudges (it folds inline at once, if it must)."""
    info = _past_the_trigger_after_a_visit_that_folded_nothing(client, grown=False)
    assert skip_reason(info) == "no-growth-since-nothing-to-fold"
    assert client.background_fold(info, info.current_tokens) is None
    assert not client.await_window_change(SID, info.revision, info.current_tokens,
                                          timeout_s=30)
    scheduler.run_once()
    assert enqueue.jobs == [] and stream_fields(redis_conn, settings) == []


def test_nudges_of_one_session_in_a_batch_cost_one_store_read(
        client: Client, scheduler: Scheduler, store: CountingStore, enqueue: RecordingEnqueue,
        redis_conn: redis.Redis, settings: Settings) -> None:
    agent = agent_of(client)
    agent.append(big_output(2_400) * 4)
    publisher = UsagePublisher(redis_conn, Keys.from_settings(settings), maxlen=10_000)
    revision = agent.info().revision
    for _ in range(4):  # four more of the same session: redelivered, or several agents
        assert publisher.publish(NudgeEvent(SID, revision))

    stats = scheduler.run_once()

    assert stats.nudged == 1 and len(enqueue.jobs) == 1
    assert store.reads == [SID]
    # Another nudge while its job is pending: the fold lock answers, no store read at all.
    publisher.publish(NudgeEvent(SID, revision))
    stats = scheduler.run_once()
    assert stats.skipped == {SID: "job-pending"} and store.reads == [SID]


def test_a_nudge_of_a_session_under_its_trigger_enqueues_nothing(
        client: Client, scheduler: Scheduler, enqueue: RecordingEnqueue,
        redis_conn: redis.Redis, settings: Settings) -> None:
    agent = agent_of(client)
    publisher = UsagePublisher(redis_conn, Keys.from_settings(settings), maxlen=10_000)
    publisher.publish(NudgeEvent(SID, agent.info().revision))
    stats = scheduler.run_once()
    assert stats.nudged == 1 and stats.skipped == {SID: "under-trigger"}
    assert enqueue.jobs == []


def test_a_resume_reaches_a_scheduler_that_trusts_its_gate_through_a_nudge(
        client: Client, scheduler: Scheduler, store: CountingStore, enqueue: RecordingEnqueue,
        redis_conn: redis.Redis, settings: Settings) -> None:
    # The scheduler trusts a session's gate (paused, trigger…) while the session's size, which
    # it wrote itself, is fresh in the store: the change must come to it as a nudge.
    agent = agent_of(client)
    client.store.set_paused(SID, True)
    window = agent.window()
    agent.report_usage({"input_tokens": 9_000}, seq=window.last_seq, revision=window.revision)
    first = scheduler.run_once()  # past the trigger but paused: written, no job
    assert (first.written, enqueue.jobs) == (1, [])
    client.store.set_paused(SID, False)  # behind the scheduler's back: no nudge
    agent.report_usage({"input_tokens": 9_100}, seq=window.last_seq, revision=window.revision)
    stale = scheduler.run_once()
    assert (stale.deferred, enqueue.jobs) == (1, [])  # judged by the gate it holds

    client.set_paused(SID, False)  # through sessionfold (the service's resume): a nudge
    nudged = scheduler.run_once()
    assert nudged.nudged == 1 and [job[0] for job in enqueue.jobs] == [SID]

    # Nudged again while the job is pending: the fold lock answers, and the gate is dropped
    # all the same, so the next report is judged by the session as it is now.
    assert client.nudge(SID, window.revision)
    assert scheduler.run_once().skipped == {SID: "job-pending"}
    store.gate_reads.clear()
    agent.report_usage({"input_tokens": 9_200}, seq=window.last_seq, revision=window.revision)
    after = scheduler.run_once()
    assert store.gate_reads == [SID] and after.deferred == 0 and after.written == 1


def test_a_policy_changed_through_the_client_nudges_the_scheduler(
        client: Client, redis_conn: redis.Redis, settings: Settings) -> None:
    agent_of(client)
    before = stream_fields(redis_conn, settings)
    client.session(SID, policy=FoldPolicy(budget_tokens=20_000))
    client.session(SID, policy=FoldPolicy(budget_tokens=20_000))  # unchanged: no nudge
    added = stream_fields(redis_conn, settings)[len(before):]
    assert [NudgeEvent.from_fields(f).session_id for f in added] == [SID]
    assert client.store.get_session(SID).policy.budget_tokens == 20_000


def test_a_nudge_round_trips_and_a_malformed_one_is_refused() -> None:
    event = NudgeEvent("s 1", 7, time=12.5)
    assert NudgeEvent.from_fields(event.to_fields()) == event
    with pytest.raises(InvalidInputError):
        NudgeEvent.from_fields({NUDGE_FIELD: b'["s", -1, 0]'})
    with pytest.raises(InvalidInputError):
        NudgeEvent.from_fields({NUDGE_FIELD: b"not json"})
