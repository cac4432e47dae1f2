"""Several schedulers share the partitions: disjoint ownership, handover, a killed scheduler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from pipeline_harness import wait_until
from prometheus_client import CollectorRegistry
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent, UsagePublisher
from sessionfold.store.results import SessionInfo, UsageReport
from sessionfold.store.store import SessionStore
from sessionfold.workers.partitions import PartitionLeases, rendezvous_owner
from sessionfold.workers.scheduler import Scheduler

PARTITIONS = 8
BUDGET = 10_000  # trigger at 8_500 tokens


class RecordingEnqueue:
    def __init__(self) -> None:
        self.jobs: list[str] = []

    def __call__(self, session_id: str, enqueued_epoch: int | None, trigger: str,
                 lock_token: str | None) -> str:
        self.jobs.append(session_id)
        return f"job-{len(self.jobs)}"


def new_session(store: SessionStore, sid: str) -> SessionInfo:
    store.create_session(sid, FoldPolicy(budget_tokens=BUDGET), system="ops agent")
    store.append(sid, [{"role": "user", "content": f"question about {sid}"},
                       {"role": "assistant", "content": "the pods restarted fine"}] * 3)
    return store.get_session(sid)


def usage(info: SessionInfo, tokens: int) -> UsageEvent:
    return UsageEvent(session_id=info.id, seq=info.ledger_len - 1, revision=info.revision,
                      input_tokens=tokens, model="claude-test")


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(partitions=PARTITIONS, scheduler_block_ms=10,
                         scheduler_policy_cache_s=0, scheduler_sweep_interval_s=3600,
                         scheduler_lease_ms=600, scheduler_claim_idle_ms=200)


def scheduler(settings: Settings, store: SessionStore, client: redis.Redis, name: str,
              enqueue: RecordingEnqueue) -> Scheduler:
    return Scheduler(settings, store, client, enqueue, consumer_name=name,
                     metrics_=Metrics(CollectorRegistry()))


def sessions_in_every_partition(store: SessionStore, keys: Keys) -> list[SessionInfo]:
    found: dict[int, SessionInfo] = {}
    i = 0
    while len(found) < keys.partitions:
        sid = f"agent-{i}"
        found.setdefault(keys.partition_of(sid), new_session(store, sid))
        i += 1
    return [found[p] for p in range(keys.partitions)]


def test_rendezvous_gives_each_partition_one_owner_and_a_join_moves_only_what_it_wins() -> None:
    three = ["a", "b", "c"]
    before = {p: rendezvous_owner(p, three) for p in range(64)}
    assert set(before.values()) == set(three)
    after = {p: rendezvous_owner(p, [*three, "d"]) for p in range(64)}
    moved = {p for p in range(64) if before[p] != after[p]}
    assert moved and all(after[p] == "d" for p in moved)
    assert rendezvous_owner(5, list(reversed(three))) == before[5]  # order does not matter


@pytest.mark.redis
def test_a_lease_held_by_one_member_is_not_taken_by_another(
        redis_conn: redis.Redis, redis_keys: Keys) -> None:
    keys = Keys(redis_keys.prefix, partitions=16)
    first = PartitionLeases(redis_conn, keys, member="first", ttl_ms=60_000)
    assert first.refresh().owned == frozenset(range(16))
    second = PartitionLeases(redis_conn, keys, member="second", ttl_ms=60_000)
    change = second.refresh()
    # The second wants about half, but the first still holds every lease until it lets go.
    assert change.owned == frozenset()
    surplus = first.surplus(change.members)
    assert surplus
    first.release(surplus)
    assert second.refresh().owned == surplus
    assert first.refresh().owned == frozenset(range(16)) - surplus


@pytest.mark.redis
def test_two_schedulers_split_the_partitions_and_each_event_is_handled_once(
        settings: Settings, sqlite_store: SessionStore, redis_conn: redis.Redis) -> None:
    keys = Keys.from_settings(settings)
    infos = sessions_in_every_partition(sqlite_store, keys)
    enqueue = RecordingEnqueue()
    a = scheduler(settings, sqlite_store, redis_conn, "a", enqueue)
    b = scheduler(settings, sqlite_store, redis_conn, "b", enqueue)
    a.rebalance()
    b.rebalance()  # b joins: a hands over at its next refresh
    a.rebalance()
    b.rebalance()
    assert a.leases.owned and b.leases.owned
    assert a.leases.owned.isdisjoint(b.leases.owned)
    assert a.leases.owned | b.leases.owned == frozenset(range(PARTITIONS))

    publisher = UsagePublisher(redis_conn, keys, maxlen=100_000)
    for info in infos:
        publisher.publish(usage(info, 9_000))  # every session over its trigger
    handled = {"a": 0, "b": 0}
    for _ in range(3):
        handled["a"] += a.run_once().accepted
        handled["b"] += b.run_once().accepted
    assert handled["a"] + handled["b"] == len(infos)
    assert handled["a"] == sum(keys.partition_of(i.id) in a.leases.owned for i in infos)
    assert sorted(enqueue.jobs) == sorted(i.id for i in infos)  # each once


@pytest.mark.redis
def test_each_scheduler_sweeps_only_its_partitions_and_no_session_is_left_out(
        settings: Settings, sqlite_store: SessionStore) -> None:
    keys = Keys.from_settings(settings)
    infos = sessions_in_every_partition(sqlite_store, keys)
    # Over their trigger in the store, with no event on any stream (Redis lost them).
    sqlite_store.record_usage_batch([
        UsageReport(session_id=i.id, usage=None, seq=i.ledger_len - 1, revision=i.revision,
                    model=None, prompt_tokens=9_000) for i in infos])
    client = redis.Redis.from_url(settings.redis_url or "", protocol=2)
    enqueue = RecordingEnqueue()
    a = scheduler(settings, sqlite_store, client, "a", enqueue)
    b = scheduler(settings, sqlite_store, client, "b", enqueue)
    for each in (a, b, a, b):  # b joins, a hands over, b takes its share
        each.rebalance()
    swept_a = a.sweep()
    swept_b = b.sweep()
    assert swept_a == sum(keys.partition_of(i.id) in a.leases.owned for i in infos)
    assert swept_a + swept_b == len(infos)
    assert sorted(enqueue.jobs) == sorted(i.id for i in infos)
    client.close()


@pytest.mark.redis
def test_a_scheduler_killed_mid_batch_loses_nothing(
        settings: Settings, sqlite_store: SessionStore, redis_conn: redis.Redis) -> None:
    keys = Keys.from_settings(settings)
    infos = sessions_in_every_partition(sqlite_store, keys)
    enqueue = RecordingEnqueue()
    doomed = scheduler(settings, sqlite_store, redis_conn, "doomed", enqueue)
    doomed.rebalance()
    assert doomed.leases.owned == frozenset(range(PARTITIONS))
    publisher = UsagePublisher(redis_conn, keys, maxlen=100_000)
    for info in infos:
        publisher.publish(usage(info, 9_000))
    read = doomed.consumer.read()
    assert len(read) == len(infos)
    # Killed here: read, nothing acknowledged, nothing written, its leases never renewed.
    heir = scheduler(settings, sqlite_store, redis_conn, "heir", enqueue)
    done: dict[str, Any] = {"accepted": 0}

    def heir_has_all() -> bool:
        done["accepted"] += heir.run_once().accepted
        return done["accepted"] == len(infos)

    wait_until(heir_has_all, timeout_s=60, what="the heir to take over every partition")
    assert heir.leases.owned == frozenset(range(PARTITIONS))  # the dead one's leases expired
    assert sorted(enqueue.jobs) == sorted(i.id for i in infos)
    for stream in keys.usage_streams():
        assert int(redis_conn.xpending(stream, settings.scheduler_group)["pending"]) == 0
    assert all(sqlite_store.get_session(i.id).measured_tokens == 9_000 for i in infos)


@pytest.mark.redis
def test_a_scheduler_that_hands_partitions_over_writes_out_what_waits_first(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis) -> None:
    # A long flush interval: values of sessions under their trigger wait in the scheduler.
    settings = make_settings(partitions=PARTITIONS, scheduler_block_ms=10,
                             scheduler_batch_size=2, scheduler_store_flush_ms=10_000,
                             scheduler_sweep_interval_s=3600, scheduler_lease_ms=60_000)
    keys = Keys.from_settings(settings)
    infos = sessions_in_every_partition(sqlite_store, keys)
    enqueue = RecordingEnqueue()
    first = scheduler(settings, sqlite_store, redis_conn, "first", enqueue)
    first.rebalance()
    publisher = UsagePublisher(redis_conn, keys, maxlen=100_000)
    for info in infos:
        publisher.publish(usage(info, 2_000))
    first.run_once()
    assert first._unwritten  # read, waiting to coalesce
    second = scheduler(settings, sqlite_store, redis_conn, "second", enqueue)
    second.rebalance()
    first.rebalance()  # hands over: flushes first
    assert not first._unwritten
    second.rebalance()
    assert second.leases.owned and first.leases.owned.isdisjoint(second.leases.owned)
    handed = [i for i in infos if keys.partition_of(i.id) in second.leases.owned]
    assert all(sqlite_store.get_session(i.id).measured_tokens == 2_000 for i in handed)


def test_a_scheduler_takes_its_leases_again_at_once_after_redis_restarts(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        private_redis: Any) -> None:
    """A restart empties Redis, the scheduler's partition leases with it. Until they are held
    again no agent can tell that a scheduler reads its session, and a request the guard cannot
    bring under the budget folds inline instead of waiting. The scheduler that finds its
    stream group gone (or Redis back after an outage) takes them again at its next batch, not
    a third of the lease time later (200 s here)."""
    settings = make_settings(redis_url=private_redis.url, partitions=PARTITIONS,
                             scheduler_lease_ms=600_000, scheduler_block_ms=10,
                             scheduler_sweep_interval_s=3600)
    keys = Keys.from_settings(settings)
    client = redis.Redis.from_url(private_redis.url, socket_timeout=2)
    scheduler = Scheduler(settings, sqlite_store, client, RecordingEnqueue(),
                          consumer_name="sched-restart", metrics_=Metrics(CollectorRegistry()))
    leases = [keys.partition_lease(p) for p in range(PARTITIONS)]
    try:
        scheduler.run_once()
        assert client.exists(*leases) == PARTITIONS
        private_redis.restart()
        assert client.exists(*leases) == 0
        for _ in range(20):  # an outage's backoff, then the group found missing
            scheduler.run_once()
            if client.exists(*leases) == PARTITIONS:
                break
        assert client.exists(*leases) == PARTITIONS
        assert scheduler.consumer.resets >= 1
    finally:
        client.close()
