"""The scheduler's sweep applies the store's retention rules: at most every prune_interval_s, in
bounded slices that carry on at the next sweep, on the one scheduler owning partition 0."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.settings import Settings
from sessionfold.store.store import SessionStore
from sessionfold.workers.scheduler import PRUNING_PARTITION, BatchStats, Scheduler

pytestmark = pytest.mark.redis

LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def _enqueue(session_id: str, enqueued_epoch: int | None, trigger: str,
             lock_token: str | None) -> str:
    raise AssertionError("no session here is over its trigger")


def _old_keys(url: str, sid: str, n: int) -> None:
    """``n`` keyed appends stamped long ago (past any retention age)."""
    with SessionStore.from_url(url, clock=lambda: LONG_AGO) as old:
        old.create_session(sid, FoldPolicy(budget_tokens=100_000))
        for i in range(n):
            old.append(sid, [{"role": "user", "content": f"turn {i}"}], key=f"k{i}")


def _scheduler(settings: Settings, store: SessionStore, client: redis.Redis,
               name: str) -> Scheduler:
    return Scheduler(settings, store, client, _enqueue, consumer_name=name,
                     metrics_=Metrics(CollectorRegistry()))


def _sweep(scheduler: Scheduler) -> BatchStats:
    stats = BatchStats()
    scheduler.sweep(stats)
    return stats


def _keys_left(store: SessionStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT count(*) FROM append_keys").scalar_one())


def test_the_sweep_prunes_in_slices_then_waits_for_the_interval(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis, tmp_path: Path) -> None:
    settings = make_settings(partitions=1, scheduler_sweep_interval_s=3600,
                             prune_interval_s=1.0, prune_batch=10, prune_sweep_batches=2)
    _old_keys(settings.store_url, "a", 35)
    scheduler = _scheduler(settings, sqlite_store, redis_conn, "sched-a")
    slices = []
    while not slices or not slices[-1].complete:
        pruned = _sweep(scheduler).pruned
        assert pruned is not None and pruned.batches <= 2
        slices.append(pruned)
        assert len(slices) < 20, "the prune never finished"
    # Two transactions of at most 10 rows per sweep: 35 keys take two sweeps, then the rest.
    assert [s.append_keys for s in slices[:2]] == [20, 15]
    assert sum(s.append_keys for s in slices) == 35 and _keys_left(sqlite_store) == 0
    # Done: the next sweeps leave the store alone until the interval has passed.
    _old_keys(settings.store_url, "b", 3)
    assert _sweep(scheduler).pruned is None
    time.sleep(1.1)
    again = _sweep(scheduler).pruned
    assert again is not None and again.append_keys == 3


def test_a_prune_interval_of_0_leaves_retention_to_the_cli(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis) -> None:
    settings = make_settings(partitions=1, scheduler_sweep_interval_s=3600, prune_interval_s=0)
    _old_keys(settings.store_url, "a", 3)
    scheduler = _scheduler(settings, sqlite_store, redis_conn, "sched-a")
    assert _sweep(scheduler).pruned is None
    assert _keys_left(sqlite_store) == 3


def test_only_the_scheduler_owning_partition_0_prunes(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_url: str) -> None:
    settings = make_settings(partitions=8, scheduler_sweep_interval_s=3600, scheduler_block_ms=10,
                             scheduler_lease_ms=600, scheduler_claim_idle_ms=200,
                             prune_interval_s=3600)
    _old_keys(settings.store_url, "a", 3)
    client = redis.Redis.from_url(redis_url, protocol=2)
    try:
        a = _scheduler(settings, sqlite_store, client, "a")
        b = _scheduler(settings, sqlite_store, client, "b")
        for each in (a, b, a, b):  # b joins, a hands over, b takes its share
            each.rebalance()
        assert a.leases.owned and b.leases.owned and not a.leases.owned & b.leases.owned
        owner, other = (a, b) if PRUNING_PARTITION in a.leases.owned else (b, a)
        assert _sweep(other).pruned is None
        assert _keys_left(sqlite_store) == 3
        pruned = _sweep(owner).pruned
        assert pruned is not None and pruned.append_keys == 3
    finally:
        client.close()
