"""sessionfold's own keys on a real local Redis Cluster (tests/redis_cluster.py): the usage bus,
the partitioned scheduler's per-partition compare-and-set, leases, fold locks, summarizer slots
and spend, across a node restart that empties the node."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pipeline_harness import wait_until
from prometheus_client import CollectorRegistry
from redis.cluster import RedisCluster
from redis_cluster import RedisClusterHarness, cluster_fixture
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import SummarizerUsage
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.redis_conn import is_cluster, redis_client
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.slots import SummarizerSlots
from sessionfold.runtime.spend import SpendCap
from sessionfold.runtime.usage import UsageEvent, UsagePublisher
from sessionfold.store.results import SessionInfo
from sessionfold.store.store import SessionStore
from sessionfold.workers.celery_app import make_celery
from sessionfold.workers.locks import FoldLock
from sessionfold.workers.scheduler import Scheduler

BUDGET = 10_000  # trigger at 8_500 tokens
PARTITIONS = 8

redis_cluster = cluster_fixture(scope="function")


class RecordingEnqueue:
    def __init__(self) -> None:
        self.jobs: list[str] = []

    def __call__(self, session_id: str, enqueued_epoch: int | None, trigger: str,
                 lock_token: str | None) -> str:
        self.jobs.append(session_id)
        return f"job-{len(self.jobs)}"


def cluster_url(harness: RedisClusterHarness) -> str:
    return harness.url.replace("redis://", "redis+cluster://", 1)


@pytest.fixture
def cluster_settings(redis_cluster: RedisClusterHarness,
                     make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(redis_url=cluster_url(redis_cluster), partitions=PARTITIONS,
                         scheduler_block_ms=10, scheduler_policy_cache_s=0,
                         scheduler_sweep_interval_s=3600, scheduler_claim_idle_ms=200)


@pytest.fixture
def client(cluster_settings: Settings) -> Iterator[Any]:
    conn = redis_client(cluster_settings.redis_url or "")
    yield conn
    conn.close()


def sessions_in_every_partition(store: SessionStore, keys: Keys) -> list[SessionInfo]:
    found: dict[int, SessionInfo] = {}
    i = 0
    while len(found) < keys.partitions:
        # Ids with braces of their own: they must not move a key out of its partition's slot.
        sid = f"{{tenant}}-agent-{i}"
        if keys.partition_of(sid) not in found:
            store.create_session(sid, FoldPolicy(budget_tokens=BUDGET), system="ops agent")
            store.append(sid, [{"role": "user", "content": "how are the pods?"},
                               {"role": "assistant", "content": "restarted fine"}] * 3)
            found[keys.partition_of(sid)] = store.get_session(sid)
        i += 1
    return [found[p] for p in range(keys.partitions)]


def usage(info: SessionInfo, tokens: int, seq: int | None = None) -> UsageEvent:
    return UsageEvent(session_id=info.id, seq=info.ledger_len - 1 if seq is None else seq,
                      revision=info.revision, input_tokens=tokens, model="claude-test")


def drain(scheduler: Scheduler, want: Callable[[], bool], what: str) -> None:
    def step() -> bool:
        with contextlib.suppress(Exception):  # a node coming back: the next batch retries
            scheduler.run_once()
        return want()

    wait_until(step, timeout_s=90, what=what)


def test_a_cluster_url_gives_a_cluster_client_and_never_reaches_celery(
        cluster_settings: Settings, client: Any) -> None:
    assert is_cluster(client) and isinstance(client, RedisCluster)
    with pytest.raises(InvalidInputError, match="does not support Redis Cluster"):
        make_celery(cluster_settings)
    with pytest.raises(InvalidInputError, match="does not support Redis Cluster"):
        make_celery(cluster_settings.model_copy(
            update={"broker_url": cluster_settings.redis_url}))


def test_the_scheduler_measures_and_enqueues_every_partition_on_a_cluster_through_a_restart(
        redis_cluster: RedisClusterHarness, cluster_settings: Settings, client: Any,
        sqlite_store: SessionStore) -> None:
    keys = Keys.from_settings(cluster_settings)
    infos = sessions_in_every_partition(sqlite_store, keys)
    enqueue = RecordingEnqueue()
    scheduler = Scheduler(cluster_settings, sqlite_store, client, enqueue,
                          consumer_name="on-cluster", metrics_=Metrics(CollectorRegistry()))
    publisher = UsagePublisher(client, keys, maxlen=10_000)
    for info in infos:
        assert publisher.publish(usage(info, 2_000))  # under the trigger: measured only
    drain(scheduler, lambda: all(sqlite_store.get_session(i.id).measured_tokens == 2_000
                                 for i in infos), "every partition measured")
    assert scheduler.leases.owned == frozenset(range(PARTITIONS))
    assert enqueue.jobs == []
    for info in infos:  # each partition's hash holds its session's value
        assert client.hget(keys.measured(info.id), "tokens") == b"2000"

    # The node serving the first partition restarts empty: its stream, group, leases, measured
    # hashes and loaded scripts are gone.
    victim = redis_cluster.node_for_key(keys.usage_stream(0))
    redis_cluster.restart_node(victim)
    assert not client.exists(keys.usage_stream(0))  # it did come back empty
    for info in infos:
        publisher.publish(usage(info, 9_000))  # now over the trigger, every one
    drain(scheduler, lambda: sorted(enqueue.jobs) == sorted(i.id for i in infos),
          "every session over its trigger enqueued after the restart")
    assert sorted(enqueue.jobs) == sorted(i.id for i in infos)  # and each once
    lock = FoldLock.from_settings(cluster_settings, client)
    assert all(lock.holder(i.id) is not None for i in infos)
    assert sorted(lock.locked_sessions()) == sorted(i.id for i in infos)


def test_the_summarizer_guards_and_locks_work_on_a_cluster(
        cluster_settings: Settings, client: Any) -> None:
    keys = Keys.from_settings(cluster_settings)
    lock = FoldLock.from_settings(cluster_settings, client)
    token = lock.acquire("{a}b")
    assert token is not None and lock.acquire("{a}b") is None
    assert lock.extend("{a}b", token) and lock.release("{a}b", token)
    slots = SummarizerSlots(client, keys.summarizer_slots(), 1, ttl_s=30, wait_s=0)
    held = slots.try_acquire()
    assert held is not None and slots.try_acquire() is None
    slots.release(held)
    spend = SpendCap(client, 1.0, ttl_s=60)
    spend.add(keys.summarizer_spend("{a}b", 1),
              SummarizerUsage(model="claude-haiku-5-5", input_tokens=100_000,
                              output_tokens=10_000, calls=1))
    assert 0 < spend.spent(keys.summarizer_spend("{a}b", 1)) < 1.0
