"""The fold task on a real Celery worker (PostgreSQL store, the scripted provider over HTTP as
the summarizer): retries, refusals, duplicates, dead letters, the lock; and its guards."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from pipeline_harness import (
    postgres_url,
    started,
    transcript_session,
    wait_until,
    worker_process,
)
from sessionfold.cli.standin.fakeprovider import FakeProvider, Fault
from sessionfold.core.errors import TransientSummarizerError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import SummarizerUsage
from sessionfold.runtime.fold_procedure import FoldJob
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.prices import summarizer_cost_usd
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.slots import SummarizerSlots
from sessionfold.store import SessionStore
from sessionfold.workers.celery_app import FOLD_TASK, WorkerRuntime, make_celery, make_enqueue
from sessionfold.workers.locks import FoldLock
from sessionfold.workers.tasks import _fold, fold_session, retry_countdown

# Only the paid layer: a visit either summarizes or folds nothing, so counting summarizer calls
# and folds is exact.
POLICY = FoldPolicy(budget_tokens=8000, layers=("summarize",))


@dataclass
class TaskEvents:
    """Celery task events as Flower receives them, captured on a thread."""

    app: Any
    seen: list[dict[str, Any]] = field(default_factory=list)
    _receiver: Any = None
    _thread: threading.Thread | None = None

    def start(self) -> TaskEvents:
        ready = threading.Event()

        def capture() -> None:
            with self.app.connection_for_read() as conn:
                self._receiver = self.app.events.Receiver(
                    conn, handlers={"*": self.seen.append})
                ready.set()
                self._receiver.capture(limit=None, timeout=None, wakeup=True)

        self._thread = threading.Thread(target=capture, daemon=True, name="task-events")
        self._thread.start()
        ready.wait(30)
        return self

    def of(self, task_id: str) -> list[str]:
        return [e["type"] for e in list(self.seen) if e.get("uuid") == task_id]

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        if self._thread is not None:
            self._thread.join(timeout=10)


@dataclass
class Pipeline:
    settings: Settings
    store: SessionStore
    provider: FakeProvider
    app: Any
    events: TaskEvents
    redis: redis.Redis

    def session(self, name: str) -> str:
        sid = f"{name}-{uuid.uuid4().hex[:6]}"
        conv = transcript_session("django__django-15554", 60)
        self.store.create_session(sid, POLICY, conv.system)
        self.store.append(sid, conv.messages)
        return sid

    def result(self, job_id: str, timeout_s: float = 120) -> dict[str, Any]:
        value: dict[str, Any] = self.app.AsyncResult(job_id).get(timeout=timeout_s)
        return value


@pytest.fixture(scope="module")
def pipeline(redis_url: str, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("tasks")
    prefix = f"sftest:tasks:{uuid.uuid4().hex[:8]}:"
    provider = FakeProvider()
    conn = redis_client(redis_url)
    with provider.serve() as server:
        settings = Settings(
            redis_url=redis_url, database_url=postgres_url(request), key_prefix=prefix,
            data_dir=tmp / "data", summarizer="anthropic", anthropic_api_key="sk-fake",
            anthropic_base_url=server.base_url, metrics_port=0, max_attempts=4,
            retry_backoff_base_s=0.2, retry_backoff_cap_s=1.0, visibility_timeout_s=120,
            task_time_limit_s=30, task_soft_time_limit_s=25, lock_ttl_s=60)
        app = make_celery(settings)
        events = TaskEvents(app).start()
        worker = started(request, worker_process(settings, tmp / "worker.log", concurrency=2))
        store = SessionStore.from_url(settings.database_url)
        try:
            yield Pipeline(settings, store, provider, app, events, conn)
        finally:
            events.stop()
            worker.stop()
            app.close()
            store.close()
            keys = [k for k in conn.scan_iter(match=Keys(prefix).all_pattern(), count=1000)]
            if keys:
                conn.delete(*keys)
            conn.close()


@pytest.fixture
def pipe(pipeline: Pipeline) -> Iterator[Pipeline]:
    """The module's pipeline with a provider that serves normally again after the test."""
    yield pipeline
    pipeline.provider.fail_always(None)
    pipeline.provider.release()
    pipeline.provider._script.clear()


def test_529_three_times_then_success_folds_once_with_the_retries_in_task_events(
        pipe: Pipeline) -> None:
    sid = pipe.session("overloaded")
    pipe.provider.script(Fault.overloaded(), Fault.overloaded(), Fault.overloaded())
    calls_before = pipe.provider.stats.calls
    job_id = make_enqueue(pipe.app)(sid, None, "threshold", None)
    result = pipe.result(job_id)
    assert result["session"] == sid and result["outcome"] == "folded"
    visits = pipe.store.records(sid)
    assert [r.outcome for r in visits] == ["refused"] * 3 + ["folded"]
    # Three failed calls, then the calls of the one fold (it may chain more than one).
    assert pipe.provider.stats.calls - calls_before == 3 + visits[-1].summarizer_usage.calls
    assert all(any(f.reason == "summarizer-failed" for f in r.refusals) for r in visits[:3])
    wait_until(lambda: pipe.events.of(job_id).count("task-succeeded") == 1, timeout_s=30,
               what="the task-succeeded event")
    kinds = pipe.events.of(job_id)
    assert kinds.count("task-retried") == 3 and "task-sent" in kinds
    # Flower sees each delivery received and started from the events alone (the result
    # backend keeps no STARTED state: task_track_started is off).
    assert kinds.count("task-received") == 4 and kinds.count("task-started") == 4


def test_400_for_good_is_a_recorded_refusal_without_a_retry_storm(pipe: Pipeline) -> None:
    sid = pipe.session("bad-request")
    pipe.provider.fail_always(Fault.bad_request())
    calls_before = pipe.provider.stats.calls
    job_id = make_enqueue(pipe.app)(sid, None, "threshold", None)
    result = pipe.result(job_id)
    assert result["outcome"] == "refused" and "summarizer-failed" in result["refusals"]
    assert pipe.provider.stats.calls - calls_before == 1
    assert [r.outcome for r in pipe.store.records(sid)] == ["refused"]
    # The worker's events arrive in order: once the delivery's task-succeeded is seen, a retry
    # (which the worker announces before it ends the delivery) would have been seen too.
    wait_until(lambda: "task-succeeded" in pipe.events.of(job_id), timeout_s=30,
               what="the task-succeeded event")
    kinds = pipe.events.of(job_id)
    assert "task-retried" not in kinds
    assert kinds.count("task-received") == 1 and kinds.count("task-started") == 1
    assert pipe.provider.stats.calls - calls_before == 1


def test_five_deliveries_of_one_job_at_once_make_one_summarizer_call_and_one_fold(
        pipe: Pipeline) -> None:
    sid = pipe.session("duplicates")
    pipe.provider.hold()
    calls_before = pipe.provider.stats.calls
    job_id = str(uuid.uuid4())
    for _ in range(5):
        pipe.app.send_task(FOLD_TASK, args=[sid], kwargs={"trigger": "threshold"},
                           task_id=job_id)
    # One delivery holds the claim and waits on the summarizer; the other four find its claim.
    assert pipe.provider.wait_for_calls(calls_before + 1, timeout_s=60)
    wait_until(lambda: pipe.events.of(job_id).count("task-succeeded") == 4, timeout_s=60,
               what="four duplicate deliveries to stop at the claim")
    pipe.provider.release()
    wait_until(lambda: pipe.events.of(job_id).count("task-succeeded") == 5, timeout_s=60,
               what="the paying delivery to finish")
    (fold,) = [r for r in pipe.store.records(sid) if r.outcome == "folded"]
    # Only the paying delivery called the summarizer: exactly the calls its one fold records.
    assert pipe.provider.stats.calls - calls_before == fold.summarizer_usage.calls
    assert len(pipe.store.spans(sid)) >= 1
    assert pipe.result(job_id)["outcome"] in ("folded", "skipped")


class _Delivery:
    """A stand-in for Celery's bound task: one delivery of job ``job_id``, run in this process
    on the pipeline app's runtime (the broker's ``redelivered`` mark set as given)."""

    def __init__(self, app: Any, job_id: str, *, redelivered: bool) -> None:
        self.app = app
        self.request = SimpleNamespace(id=job_id, retries=0,
                                       delivery_info={"redelivered": redelivered})

    def retry(self, **kwargs: Any) -> Exception:
        raise AssertionError(f"no retry expected here: {kwargs}")


def test_a_first_delivery_is_not_counted_and_a_redelivery_is(pipe: Pipeline) -> None:
    sid = pipe.session("counted")
    job_id = str(uuid.uuid4())
    key = Keys.from_settings(pipe.settings).fold_attempts(job_id)
    first = fold_session(_Delivery(pipe.app, job_id, redelivered=False), sid,
                         trigger="threshold")
    assert (first["deliveries"], first["outcome"]) == (1, "folded")
    assert pipe.redis.exists(key) == 0  # nothing was counted for it
    # The broker hands the same job out again (its worker was lost before the ack): counted.
    again = fold_session(_Delivery(pipe.app, job_id, redelivered=True), sid,
                         trigger="threshold")
    assert again["deliveries"] == 2
    assert (again["outcome"], again["claim"]) == ("skipped", "already-committed")
    assert pipe.redis.exists(key) == 0  # ran to its end: the count is cleared


def test_a_job_past_its_delivery_cap_is_dead_lettered_unpaid(pipe: Pipeline) -> None:
    sid = pipe.session("poison")
    job_id = str(uuid.uuid4())
    keys = Keys.from_settings(pipe.settings)
    # As if the job had been delivered max_attempts times already, its worker lost each time:
    # the first delivery plus max_attempts - 1 redeliveries counted; this is the next one.
    pipe.redis.set(keys.fold_attempts(job_id), pipe.settings.max_attempts - 1)
    calls_before = pipe.provider.stats.calls
    result = fold_session(_Delivery(pipe.app, job_id, redelivered=True), sid,
                          trigger="threshold")
    assert result["outcome"] == "dead-lettered"
    assert result["deliveries"] == pipe.settings.max_attempts + 1
    (letter,) = [d for d in pipe.store.dead_letters() if d.job_id == job_id]
    assert letter.session_id == sid and letter.attempts == pipe.settings.max_attempts + 1
    assert pipe.provider.stats.calls == calls_before
    assert pipe.store.get_session(sid).claimed_by is None
    assert pipe.store.records(sid)[-1].detail.startswith("dead-lettered")


def test_the_job_releases_the_schedulers_lock_when_it_ends(pipe: Pipeline) -> None:
    sid = pipe.session("locked")
    lock = FoldLock.from_settings(pipe.settings, pipe.redis)
    token = lock.acquire(sid)
    assert token is not None
    job_id = make_enqueue(pipe.app)(sid, pipe.store.get_session(sid).fold_epoch, "threshold",
                                    token)
    assert pipe.result(job_id)["outcome"] == "folded"
    assert lock.holder(sid) is None
    assert pipe.redis.get(Keys.from_settings(pipe.settings).fold_attempts(job_id)) is None


def test_past_its_spend_cap_a_session_folds_with_the_free_layers_only(
        pipeline: Pipeline, redis_url: str) -> None:
    settings = pipeline.settings.model_copy(update={"session_spend_cap_usd": 0.01})
    runtime = WorkerRuntime(settings, redis_url)
    sid = f"spender-{uuid.uuid4().hex[:6]}"
    conv = transcript_session("django__django-15554", 60)
    runtime.store.create_session(sid, FoldPolicy(budget_tokens=8000), conv.system)
    runtime.store.append(sid, conv.messages)
    key = runtime.keys.summarizer_spend(sid, runtime.store.get_session(sid).incarnation)
    runtime.redis.set(key, 0.02)  # already spent more than the cap
    calls_before = pipeline.provider.stats.calls
    report = _fold(runtime, FoldJob(sid, "job-1"))
    assert pipeline.provider.stats.calls == calls_before
    assert "spend cap" in report.detail
    assert "summarize" not in (report.record.layers_run if report.record else ())
    runtime.redis.delete(key)
    report = _fold(runtime, FoldJob(sid, "job-2"))
    assert report.summarizer_calls >= 1
    assert runtime.spend.spent(key) == pytest.approx(summarizer_cost_usd(report.summarizer_usage))
    runtime.redis.delete(key)
    runtime.close()


def test_a_session_created_again_does_not_inherit_the_spend_of_its_predecessor(
        make_settings: Callable[..., Settings], redis_url: str) -> None:
    settings = make_settings(session_spend_cap_usd=0.01)
    with SessionStore.from_url(settings.database_url) as store:
        store.migrate()
    runtime = WorkerRuntime(settings, redis_url)
    conv = transcript_session("django__django-15554", 60)
    try:
        runtime.store.create_session("s", FoldPolicy(budget_tokens=8000), conv.system)
        runtime.store.append("s", conv.messages)
        spent = runtime.keys.summarizer_spend("s", runtime.store.get_session("s").incarnation)
        runtime.redis.set(spent, 0.02)  # the first session spent more than the cap
        capped = _fold(runtime, FoldJob("s", "job-1"))
        assert "spend cap" in capped.detail and capped.summarizer_calls == 0
        runtime.store.delete_session("s")
        runtime.store.create_session("s", FoldPolicy(budget_tokens=8000), conv.system)
        runtime.store.append("s", conv.messages)
        fresh = _fold(runtime, FoldJob("s", "job-2"))
        assert "spend cap" not in fresh.detail and fresh.summarizer_calls >= 1
        assert fresh.outcome == "folded"
    finally:
        runtime.close()


def test_global_summarizer_slots_cap_concurrent_calls(redis_conn: redis.Redis,
                                                      redis_keys: Keys) -> None:
    slots = SummarizerSlots(redis_conn, redis_keys.summarizer_slots(), 2, ttl_s=30, wait_s=10)
    inside = 0
    peak = 0
    guard = threading.Lock()

    def call() -> None:
        nonlocal inside, peak
        with slots.hold():
            with guard:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.05)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 2 and slots.in_flight() == 0


def test_a_full_house_of_slots_is_a_transient_error_and_dead_holders_expire(
        redis_conn: redis.Redis, redis_keys: Keys) -> None:
    slots = SummarizerSlots(redis_conn, redis_keys.summarizer_slots(), 1, ttl_s=0.3,
                            wait_s=0.05, retry_after_s=2)
    holder = slots.try_acquire()  # a worker that dies holding its slot
    assert holder is not None
    with pytest.raises(TransientSummarizerError) as info, slots.hold():
        pass
    assert info.value.retry_after == 2
    time.sleep(0.4)
    assert slots.try_acquire() is not None  # the dead holder's slot expired


def test_retry_countdown_grows_honours_retry_after_and_stays_under_the_cap() -> None:
    waits = [retry_countdown(n, base_s=2, cap_s=60) for n in range(8)]
    assert all(0 < w <= 60 for w in waits)
    assert waits[0] <= 2 and waits[3] > waits[0] and waits[7] >= 48
    assert retry_countdown(0, base_s=2, cap_s=60, retry_after=30) == 30
    assert retry_countdown(0, base_s=2, cap_s=60, retry_after=3600) == 60
    assert retry_countdown(40, base_s=2, cap_s=60) <= 60


def test_summarizer_cost_uses_the_model_family() -> None:
    haiku = SummarizerUsage(model="claude-haiku-5-5", input_tokens=1_000_000,
                            output_tokens=1_000_000)
    sonnet = haiku.model_copy(update={"model": "claude-sonnet-4"})
    assert summarizer_cost_usd(haiku) == pytest.approx(6.0)
    assert summarizer_cost_usd(sonnet) == pytest.approx(18.0)
    cached = SummarizerUsage(model="claude-haiku-5-5", cache_read_input_tokens=1_000_000)
    assert summarizer_cost_usd(cached) == pytest.approx(0.1)
