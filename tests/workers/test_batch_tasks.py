"""Batch folds on a real Celery worker (PostgreSQL store, the stand-in's Message Batches over
HTTP): the fold job sends the batch, a collection job lands it, and both task results (what
Flower lists) name the batch and what became of it; the metrics count it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from pipeline_harness import postgres_url, started, transcript_session, worker_process
from prometheus_client import CollectorRegistry
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.batch_folds import BatchTicket
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore
from sessionfold.workers import batch_tasks
from sessionfold.workers.celery_app import make_celery, make_collect, make_enqueue
from sessionfold.workers.pending_batches import PendingBatches


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def idle_session(store: SessionStore) -> str:
    sid = f"batch-{uuid.uuid4().hex[:6]}"
    conv = transcript_session("django__django-15554", 40)
    store.create_session(sid, FoldPolicy(budget_tokens=8000), conv.system)
    store.append(sid, conv.messages)
    size = store.get_session(sid).current_tokens
    store.set_policy(sid, FoldPolicy(budget_tokens=int(size / 0.6)))
    return sid


@pytest.fixture
def stack(redis_url: str, tmp_path: Any, request: pytest.FixtureRequest
          ) -> Iterator[tuple[Settings, SessionStore, FakeProvider, Any]]:
    provider = FakeProvider()
    clock = Clock()
    provider.batches.clock = clock
    provider.batches.delay_s = 300.0
    prefix = f"sftest:batches:{uuid.uuid4().hex[:8]}:"
    with provider.serve() as server:
        settings = Settings(
            redis_url=redis_url, database_url=postgres_url(request), key_prefix=prefix,
            data_dir=tmp_path / "data", summarizer="anthropic", anthropic_api_key="sk-fake",
            anthropic_base_url=server.base_url, summarizer_model="claude-haiku-4-5",
            batch_folds=True, metrics_port=0, visibility_timeout_s=120, task_time_limit_s=30,
            retry_backoff_base_s=0.2, retry_backoff_cap_s=1.0,
            task_soft_time_limit_s=25, lock_ttl_s=60)
        app = make_celery(settings)
        started(request, worker_process(settings, tmp_path / "worker.log"))
        store = SessionStore.from_url(settings.database_url)
        conn = redis_client(redis_url)
        try:
            yield settings, store, provider, app
        finally:
            app.close()
            store.close()
            keys = list(conn.scan_iter(match=Keys(prefix).all_pattern(), count=1000))
            if keys:
                conn.delete(*keys)
            conn.close()


@pytest.mark.redis
def test_the_fold_job_sends_the_batch_and_a_collection_job_lands_it_both_in_flower(
        stack: tuple[Settings, SessionStore, FakeProvider, Any]) -> None:
    settings, store, provider, app = stack
    sid = idle_session(store)
    sent = app.AsyncResult(make_enqueue(app)(sid, None, "idle", None)).get(timeout=120)
    assert sent["outcome"] == "batch-pending", sent
    assert sent["batch"]["event"] == "submitted" and sent["batch"]["provider"] == "anthropic"
    ticket = BatchTicket.from_json({k: v for k, v in sent["batch"].items() if k != "event"})
    keys = Keys.from_settings(settings)
    conn = redis_client(settings.redis_url or "")
    try:
        pending = PendingBatches(conn, keys)
        assert pending.count(keys.partition_of(sid)) == 1
        collect = make_collect(app)
        waiting = app.AsyncResult(collect(ticket.to_json(), None)).get(timeout=120)
        assert waiting["outcome"] == "batch-pending" and waiting["batch"]["event"] is None
        provider.batches.clock.now += 300  # type: ignore[attr-defined]
        landed = app.AsyncResult(collect(ticket.to_json(), None)).get(timeout=120)
        assert landed["outcome"] == "folded" and landed["batch"]["event"] == "collected"
        assert landed["job"] == sent["job"] and landed["session"] == sid
        assert pending.count(keys.partition_of(sid)) == 0  # the batch is over: forgotten
    finally:
        conn.close()
    assert store.get_session(sid).batch is None and store.spans(sid)


@pytest.mark.redis
def test_a_collection_counts_its_batch_and_its_visit_in_the_metrics(
        stack: tuple[Settings, SessionStore, FakeProvider, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, store, provider, app = stack
    sid = idle_session(store)
    sent = app.AsyncResult(make_enqueue(app)(sid, None, "idle", None)).get(timeout=120)
    provider.batches.clock.now += 300  # type: ignore[attr-defined]
    meter = Metrics(CollectorRegistry())
    monkeypatch.setattr(batch_tasks, "metrics", lambda: meter)
    ticket = {k: v for k, v in sent["batch"].items() if k != "event"}
    # The task's body in this process (its metrics are this test's to read).
    result = batch_tasks.collect_batch(SimpleNamespace(app=app), ticket)
    assert result["batch"]["event"] == "collected"
    sample = meter.registry.get_sample_value
    assert sample("sessionfold_batch_folds_total", {"event": "collected"}) == 1
    assert sample("sessionfold_folds_total", {"outcome": "folded", "trigger": "idle"}) == 1
