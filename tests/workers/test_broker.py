"""The Redis broker transport (workers.broker): one client per channel, the same commands, the
same URLs, and a worker and Flower on it end to end (the machine's Redis, a ``redis://``
broker)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from kombu.transport import redis as kombu_redis
from pipeline_harness import (
    flower_lists,
    free_port,
    seeded_store,
    started,
    started_flower,
    wait_until,
    worker_process,
)
from sessionfold.runtime.keys import FOLD_QUEUE
from sessionfold.runtime.settings import Settings
from sessionfold.workers.broker import Channel, Transport, uses_shared_client
from sessionfold.workers.celery_app import make_celery, make_enqueue


def test_only_a_plain_redis_url_gets_the_shared_client_transport() -> None:
    assert uses_shared_client("redis://:pw@h:6380/3")
    assert uses_shared_client("REDIS://h")
    # TLS is turned on by kombu from the rediss scheme; the embedded server's socket URL names
    # its transport itself: both keep kombu's own.
    assert not uses_shared_client("rediss://h:6380/0")
    assert not uses_shared_client("redis+socket:///tmp/redis.sock")
    assert not uses_shared_client("amqp://guest:guest@127.0.0.1:5672//")


def test_the_app_connects_through_it_and_its_urls_still_read_redis(
        make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(redis_url="redis://:secret@127.0.0.1:6390/2")
    app = make_celery(settings)
    conn = app.connection_for_write()
    assert isinstance(conn.transport, Transport)
    # What the worker's banner and Flower's broker page render (Flower picks its broker client
    # by this scheme).
    assert conn.as_uri() == "redis://:**@127.0.0.1:6390/2"
    assert conn.as_uri(include_password=True) == "redis://:secret@127.0.0.1:6390/2"
    conn.release()
    app.close()
    tls = make_celery(make_settings(redis_url="rediss://127.0.0.1:6390/2"))
    conn = tls.connection_for_write()
    assert type(conn.transport) is kombu_redis.Transport
    conn.release()
    tls.close()


def test_a_channel_keeps_one_client_until_its_pool_is_replaced(
        make_settings: Callable[..., Settings]) -> None:
    app = make_celery(make_settings())
    with app.connection_for_write() as conn:
        channel = conn.channel()
        assert isinstance(channel, Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
            assert first.ping()
        given = object()
        with channel.conn_or_acquire(given) as passed:
            assert passed is given  # a client handed in is used as kombu uses it
        # kombu drops its pools after a fork or a lost connection: a new pool, a new client.
        channel._disconnect_pools()
        with channel.conn_or_acquire() as third:
            assert third is not first
            assert third.connection_pool is channel.pool
            assert third.ping()
        channel.close()
        assert channel._shared_client is None
    app.close()


def test_a_worker_and_flower_on_a_redis_broker_fold_and_list_the_job(
        make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    """Events, acknowledgement and the unacknowledged-set bookkeeping all go through the
    shared client: a fold job runs, nothing stays unacknowledged, and Flower lists the job
    with its session (from the events) and its outcome, and reads the queue's length."""
    settings = make_settings(metrics_port=0, flower_port=free_port())
    assert uses_shared_client(settings.redis_url or "")
    seeded_store(settings.database_url, "s1")
    _, flower_url = started_flower(request, settings, tmp_path / "flower.log")
    started(request, worker_process(settings, tmp_path / "worker.log"))
    app = make_celery(settings)
    job_id = make_enqueue(app)("s1", None, "manual", None)
    result = app.AsyncResult(job_id).get(timeout=120)
    assert result["session"] == "s1" and result["outcome"] == "folded"
    assert result["deliveries"] == 1

    task = flower_lists(flower_url, job_id)
    assert "s1" in task["args"] and "folded" in task["result"]
    assert task["received"] and task["started"]  # from the events, not the result backend
    queues = httpx2.get(f"{flower_url}/api/queues/length", timeout=10).json()
    assert FOLD_QUEUE in {q["name"] for q in queues["active_queues"]}

    def acknowledged() -> bool:
        with app.connection_for_read() as conn:
            channel = conn.default_channel
            with channel.conn_or_acquire() as client:
                return int(client.hlen(channel.unacked_key)) == 0

    wait_until(acknowledged, timeout_s=30, what="the job to be acknowledged")
    app.close()

