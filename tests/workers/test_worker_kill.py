"""A whole worker (main process and pool) killed with SIGKILL at the worst moments.

The worker is stopped deterministically at a fault point (it marks a file and waits), then its
process group is killed. Its unacknowledged message returns and a fresh worker takes it: on a
Redis broker through kombu's restore after the visibility timeout (short here), on RabbitMQ
when the dead worker's connection closes. The first two cases run on both brokers:

- killed after the summarizer returned, before the commit: the job comes back and folds once;
- killed after the commit, before the ack: the redelivery stops at the claim, no second
  summarizer call;
- a fold that kills its pool process every time: the store counts the abandoned claims of the
  session across the scheduler's new jobs; at ``max_attempts`` it is dead-lettered and paused,
  and no summarizer call is paid after that.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pipeline_harness import (
    PipelineProcess,
    postgres_url,
    scheduler_process,
    started,
    transcript_session,
    wait_until,
    worker_process,
)
from rabbitmq import rabbitmq_vhost
from sessionfold.cli.main import main
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.faults import KILL_AT_ENV, PAUSE_AT_ENV, PAUSE_MARKER_ENV
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore
from sessionfold.workers.celery_app import make_celery, make_enqueue

SID = "agent-killed"
POLICY = FoldPolicy(budget_tokens=8000, layers=("summarize",))


@dataclass
class Rig:
    settings: Settings
    store: SessionStore
    provider: FakeProvider
    app: Any
    start_worker: Callable[[str], PipelineProcess]
    #: Which broker the worker runs on: the fixture's param.
    broker: str = "redis-broker"


@pytest.fixture(params=["redis-broker", "rabbitmq-broker"])
def rig(make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
        tmp_path: Path) -> Iterator[Rig]:
    with contextlib.ExitStack() as stack:
        broker = (stack.enter_context(rabbitmq_vhost())
                  if request.param == "rabbitmq-broker" else None)
        yield from _rig(make_settings, request, tmp_path, broker)


def _rig(make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
         tmp_path: Path, broker: str | None) -> Iterator[Rig]:
    provider = FakeProvider()
    with provider.serve() as server:
        # Short visibility timeout: the dead worker's message comes back within seconds. The
        # hard time limit stays at half of it, as the settings require.
        settings = make_settings(
            database_url=postgres_url(request), summarizer="anthropic",
            anthropic_api_key="sk-fake", anthropic_base_url=server.base_url, metrics_port=0,
            visibility_timeout_s=12, task_time_limit_s=6, task_soft_time_limit_s=5,
            retry_backoff_base_s=0.5, retry_backoff_cap_s=2, lock_ttl_s=8, broker_url=broker)
        marker = tmp_path / "fault.marker"

        def start_worker(pause_at: str) -> PipelineProcess:
            return started(request, worker_process(
                settings, tmp_path / "worker.log", concurrency=1,
                **{PAUSE_AT_ENV: pause_at, PAUSE_MARKER_ENV: str(marker)}))

        app = make_celery(settings)
        with SessionStore.from_url(settings.database_url) as store:
            conv = transcript_session("django__django-15554", 60)
            store.create_session(SID, POLICY, conv.system)
            store.append(SID, conv.messages)
            yield Rig(settings, store, provider, app, start_worker, request.param)
        app.close()


def test_killed_after_the_summary_before_the_commit_the_job_returns_and_folds_once(
        rig: Rig, tmp_path: Path) -> None:
    worker = rig.start_worker("after-summary")
    job_id = make_enqueue(rig.app)(SID, None, "threshold", None)
    marker = tmp_path / "fault.marker"
    wait_until(marker.exists, timeout_s=120, what="the worker to reach the fault point")
    paid_before_kill = rig.provider.stats.succeeded
    assert paid_before_kill >= 1  # the summarizer answered ...
    assert rig.store.spans(SID) == []  # ... and nothing was committed
    worker.kill()
    rig.start_worker("after-summary")  # the marker exists: this one runs through
    result = rig.app.AsyncResult(job_id).get(timeout=180)
    assert result["outcome"] == "folded"
    # Redis returns the message after the visibility timeout, past the dead fold's lease: the
    # redelivery (its second delivery) claims and folds. RabbitMQ returns it at once, while
    # the lease is live: the redelivery waits it out and its retry (a new attempt, delivered
    # once) folds -- unless the new worker took longer to start than the lease ran.
    if result["job"] == job_id:
        assert result["deliveries"] == 2
    else:
        assert rig.broker == "rabbitmq-broker" and result["job"] == f"{job_id}~r1"
        assert result["deliveries"] == 1
    (fold,) = [r for r in rig.store.records(SID) if r.outcome == "folded"]
    assert fold.job_id == result["job"]
    assert {s.job_id for s in rig.store.spans(SID)} == {result["job"]}
    window = rig.store.read_window(SID)
    assert sum(1 for item in window.items if item.kind == "summary") == 1
    # The first summary died with the worker; the redelivery paid for its own, once.
    assert rig.provider.stats.succeeded == paid_before_kill + fold.summarizer_usage.calls


def test_killed_after_the_commit_before_the_ack_the_redelivery_stops_at_the_claim(
        rig: Rig, tmp_path: Path) -> None:
    worker = rig.start_worker("after-commit")
    job_id = make_enqueue(rig.app)(SID, None, "threshold", None)
    marker = tmp_path / "fault.marker"
    wait_until(marker.exists, timeout_s=120, what="the worker to reach the fault point")
    spans = rig.store.spans(SID)
    assert spans and {s.job_id for s in spans} == {job_id}  # committed, not acknowledged
    calls_at_kill = rig.provider.stats.calls
    worker.kill()
    rig.start_worker("after-commit")
    result = rig.app.AsyncResult(job_id).get(timeout=180)
    assert result["deliveries"] == 2
    assert (result["outcome"], result["claim"]) == ("skipped", "already-committed")
    assert rig.provider.stats.calls == calls_at_kill  # no second summarizer call
    assert [r.outcome for r in rig.store.records(SID)] == ["folded"]
    assert rig.store.spans(SID) == spans
    wait_until(lambda: rig.store.get_session(SID).claimed_by is None, timeout_s=10,
               what="no claim left behind")


def test_a_fold_that_kills_its_worker_every_time_is_dead_lettered_and_paused(
        make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    provider = FakeProvider()
    with provider.serve() as server:
        # Short leases (= the hard time limit) and a quick sweep: the scheduler comes back for
        # the session within seconds of each lost fold. Each new job has a new id. The soft
        # limit (6 s) leaves a loaded machine's fold time to reach its fault point; at 2 s a
        # slow first attempt was cut short before it, and died another way.
        settings = make_settings(
            database_url=postgres_url(request), summarizer="anthropic",
            anthropic_api_key="sk-fake", anthropic_base_url=server.base_url, metrics_port=0,
            max_attempts=2, visibility_timeout_s=20, task_time_limit_s=8,
            task_soft_time_limit_s=6, retry_backoff_base_s=0.5, retry_backoff_cap_s=2,
            lock_ttl_s=10, scheduler_sweep_interval_s=1, scheduler_block_ms=200)
        with SessionStore.from_url(settings.database_url) as store:
            conv = transcript_session("django__django-15554", 60)
            store.create_session(SID, POLICY, conv.system)
            store.append(SID, conv.messages)
            assert store.get_session(SID).over_trigger
            # The pool process dies after its summary arrived, before it commits, every time.
            worker = started(request, worker_process(
                settings, tmp_path / "worker.log", concurrency=1,
                **{KILL_AT_ENV: "after-summary"}))
            started(request, scheduler_process(settings, tmp_path / "scheduler.log"))
            wait_until(lambda: store.get_session(SID).paused, timeout_s=120,
                       what="the session to be given up and paused")
            calls_at_pause = provider.stats.calls
            info = store.get_session(SID)
            assert info.abandoned_folds == settings.max_attempts
            assert info.claimed_by is None
            (letter,) = [d for d in store.dead_letters() if d.session_id == SID]
            assert letter.attempts == settings.max_attempts
            assert (f"abandoned {settings.max_attempts} times in a row (worker lost)"
                    in letter.reason)
            records = store.records(SID)
            # Nothing but the refusal that says why: every other visit died with its worker.
            assert [r.outcome for r in records] == ["refused"]
            assert records[0].detail.startswith("dead-lettered") and records[0].job_id == \
                letter.job_id
            assert store.spans(SID) == []
            # One visit per abandoned claim paid the summarizer, each dying before its commit.
            deaths = worker.log_text().count("fault point after-summary reached")
            assert deaths == settings.max_attempts
            assert calls_at_pause >= settings.max_attempts
            # Paused: the scheduler's sweep (every second) and a lease later, nothing is paid.
            time.sleep(settings.task_time_limit_s + 3 * settings.scheduler_sweep_interval_s)
            assert provider.stats.calls == calls_at_pause
            assert store.get_session(SID).paused
            worker.stop()  # before the resume: the next fold would kill it again
            # The operator's resume lets folds run again, with a fresh count of attempts.
            monkeypatch.setenv("DATABASE_URL", str(settings.database_url))
            monkeypatch.chdir(tmp_path)
            assert main(["resume", SID]) == 0
            info = store.get_session(SID)
            assert not info.paused and info.abandoned_folds == 0 and info.claimed_by is None
