"""The scheduler against the real Redis and a real (SQLite) store, with a recording enqueue."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry
from sessionfold.core.errors import StoreError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import CompactionRecord
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent, UsagePublisher
from sessionfold.store.results import SessionInfo, UsageBatch
from sessionfold.store.store import SessionStore
from sessionfold.workers.locks import FoldLock
from sessionfold.workers.scheduler import Scheduler

pytestmark = pytest.mark.redis

BUDGET = 10_000  # trigger at 8_500 tokens


class RecordingEnqueue:
    """Stands in for the Celery enqueue: remembers every job it was asked for."""

    def __init__(self, fail_for: set[str] | None = None) -> None:
        self.jobs: list[tuple[str, int | None, str, str | None]] = []
        self.fail_for = fail_for or set()
        self._guard = threading.Lock()

    def __call__(self, session_id: str, enqueued_epoch: int | None, trigger: str,
                 lock_token: str | None) -> str:
        if session_id in self.fail_for:
            raise ConnectionError("broker down")
        with self._guard:
            self.jobs.append((session_id, enqueued_epoch, trigger, lock_token))
            return f"job-{len(self.jobs)}"

    def sessions(self) -> list[str]:
        return [job[0] for job in self.jobs]


def turns(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append({"role": "user", "content": f"question {i} about the deployment"})
        out.append({"role": "assistant", "content": f"answer {i}: the pods restarted fine"})
    return out


def new_session(store: SessionStore, sid: str, n_turns: int = 3,
                budget: int = BUDGET, **policy: Any) -> SessionInfo:
    store.create_session(sid, FoldPolicy(budget_tokens=budget, **policy), system="ops agent")
    store.append(sid, turns(n_turns))
    return store.get_session(sid)


def usage(info: SessionInfo, tokens: int, *, seq: int | None = None,
          revision: int | None = None, at: float | None = None) -> UsageEvent:
    return UsageEvent(session_id=info.id, seq=info.ledger_len - 1 if seq is None else seq,
                      revision=info.revision if revision is None else revision,
                      input_tokens=tokens, model="claude-test",
                      time=time.time() if at is None else at)


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(scheduler_block_ms=10, scheduler_policy_cache_s=0,
                         scheduler_sweep_interval_s=3600)


@pytest.fixture
def publisher(redis_conn: redis.Redis, settings: Settings) -> UsagePublisher:
    return UsagePublisher(redis_conn, Keys.from_settings(settings), maxlen=100_000)


@pytest.fixture
def enqueue() -> RecordingEnqueue:
    return RecordingEnqueue()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def scheduler(settings: Settings, sqlite_store: SessionStore, redis_conn: redis.Redis,
              enqueue: RecordingEnqueue, registry: CollectorRegistry) -> Scheduler:
    return Scheduler(settings, sqlite_store, redis_conn, enqueue, consumer_name="sched-a",
                     metrics_=Metrics(registry))


def drain(scheduler: Scheduler, rounds: int = 5) -> list[Any]:
    return [scheduler.run_once() for _ in range(rounds)]


def pending(client: redis.Redis, settings: Settings) -> int:
    keys = Keys.from_settings(settings)
    return sum(int(client.xpending(stream, settings.scheduler_group)["pending"])
               for stream in keys.usage_streams() if client.exists(stream))


# --- deciding --------------------------------------------------------------------------------


def test_only_sessions_over_their_trigger_get_a_job(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        enqueue: RecordingEnqueue, redis_conn: redis.Redis, settings: Settings,
        registry: CollectorRegistry) -> None:
    over = new_session(sqlite_store, "over")
    under = new_session(sqlite_store, "under")
    publisher.publish(usage(over, 9_000, at=time.time() - 0.2))
    # Under its own trigger: a new (priced) session's is half its target, 3,000.
    assert under.trigger_tokens == 3_000
    publisher.publish(usage(under, 2_900))
    stats = scheduler.run_once()
    assert stats.events == 2 and stats.accepted == 2
    assert list(stats.enqueued) == ["over"]
    [(sid, epoch, trigger, token)] = enqueue.jobs
    assert (sid, epoch, trigger) == ("over", over.fold_epoch, "threshold")
    # The job carries the lock's token: the lock is held until the job releases it.
    assert FoldLock.from_settings(settings, redis_conn).holder("over") == token
    # The measured sizes went to the store, and the entries were acknowledged.
    assert sqlite_store.get_session("over").measured_tokens == 9_000
    assert sqlite_store.get_session("under").measured_tokens == 2_900
    assert pending(redis_conn, settings) == 0
    lag = registry.get_sample_value("sessionfold_scheduler_lag_seconds_sum")
    assert lag is not None and lag >= 0.2
    assert registry.get_sample_value("sessionfold_fold_jobs_enqueued_total",
                                     {"source": "stream"}) == 1


def test_one_job_per_session_until_it_releases_the_lock(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        enqueue: RecordingEnqueue, redis_conn: redis.Redis, settings: Settings) -> None:
    info = new_session(sqlite_store, "s1", n_turns=6)
    publisher.publish(usage(info, 9_000, seq=8))
    scheduler.run_once()
    publisher.publish(usage(info, 9_100, seq=9))
    publisher.publish(usage(info, 9_200, seq=10))
    stats = scheduler.run_once()
    assert stats.skipped == {"s1": "job-pending"}
    assert enqueue.sessions() == ["s1"]
    token = enqueue.jobs[0][3]
    assert token is not None
    assert FoldLock.from_settings(settings, redis_conn).release("s1", token)  # the job ended
    publisher.publish(usage(info, 9_300, seq=11))
    scheduler.run_once()
    assert enqueue.sessions() == ["s1", "s1"]


def test_an_older_report_never_overwrites_a_newer_one(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        redis_conn: redis.Redis, settings: Settings) -> None:
    info = new_session(sqlite_store, "s1", n_turns=5)
    measured = Keys.from_settings(settings).measured("s1")
    publisher.publish(usage(info, 5_000, seq=7))
    publisher.publish(usage(info, 4_000, seq=5))  # arrives later, measured earlier
    stats = scheduler.run_once()
    assert (stats.accepted, stats.superseded) == (1, 1)
    assert redis_conn.hmget(measured, "seq", "tokens") == [b"7", b"5000"]
    publisher.publish(usage(info, 3_000, seq=6))  # a later batch, still older
    stats = scheduler.run_once()
    assert (stats.accepted, stats.superseded) == (0, 1)
    assert redis_conn.hmget(measured, "seq", "tokens") == [b"7", b"5000"]
    stored = sqlite_store.get_session("s1")
    assert (stored.measured_seq, stored.measured_tokens) == (7, 5_000)
    publisher.publish(usage(info, 6_000, seq=9))
    assert scheduler.run_once().accepted == 1
    assert redis_conn.hmget(measured, "seq", "tokens") == [b"9", b"6000"]


def test_a_session_deleted_and_created_again_is_measured_afresh(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        redis_conn: redis.Redis, settings: Settings) -> None:
    first = new_session(sqlite_store, "s1", n_turns=6)
    for _ in range(3):
        sqlite_store.append("s1", turns(1))  # revisions move on
    info = sqlite_store.get_session("s1")
    publisher.publish(usage(info, 7_000))
    scheduler.run_once()
    assert sqlite_store.get_session("s1").measured_tokens == 7_000
    # Same id, new session (a replay run again): its revisions and seqs start over, lower.
    assert sqlite_store.delete_session("s1")
    again = new_session(sqlite_store, "s1", n_turns=1)
    assert (again.revision, again.ledger_len) < (info.revision, info.ledger_len)
    assert again.created_at > first.created_at
    publisher.publish(usage(again, 3_000))
    stats = scheduler.run_once()
    assert stats.accepted == 1
    assert sqlite_store.get_session("s1").measured_tokens == 3_000
    measured = Keys.from_settings(settings).measured("s1")
    assert redis_conn.hget(measured, "tokens") == b"3000"


def test_a_scheduler_with_a_stale_copy_of_a_recreated_session_cannot_undo_a_newer_one(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis, publisher: UsagePublisher) -> None:
    stale_settings = make_settings(scheduler_block_ms=10, scheduler_policy_cache_s=3600,
                                   scheduler_sweep_interval_s=3600)
    fresh_settings = make_settings(scheduler_block_ms=10, scheduler_policy_cache_s=0,
                                   scheduler_sweep_interval_s=3600)
    stale = Scheduler(stale_settings, sqlite_store, redis_conn, RecordingEnqueue(),
                      consumer_name="stale", metrics_=Metrics(CollectorRegistry()))
    fresh = Scheduler(fresh_settings, sqlite_store, redis_conn, RecordingEnqueue(),
                      consumer_name="fresh", metrics_=Metrics(CollectorRegistry()))
    old = new_session(sqlite_store, "s1", n_turns=6)
    publisher.publish(usage(old, 7_000))
    assert stale.run_once().accepted == 1  # it now holds the old session's info for an hour
    # It hands its partitions over, but its reader has not noticed yet (its next lease refresh
    # is not due): for a moment both schedulers read the partition, as during any handover.
    stale.leases.leave()
    sqlite_store.delete_session("s1")
    new = new_session(sqlite_store, "s1", n_turns=3)
    publisher.publish(usage(new, 3_000, seq=5))
    assert fresh.run_once().accepted == 1
    publisher.publish(usage(new, 2_000, seq=1))  # older than seq 5 of the new session
    assert stale.run_once().accepted == 0  # judged as the old session: refused, info dropped
    measured = Keys.from_settings(fresh_settings).measured("s1")
    assert redis_conn.hmget(measured, "seq", "tokens") == [b"5", b"3000"]
    publisher.publish(usage(new, 4_000, seq=5))
    assert stale.run_once().accepted == 1  # re-read: the new session, the same position
    assert redis_conn.hget(measured, "tokens") == b"4000"


def test_a_failed_store_write_is_retried_from_the_pending_entries(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis, publisher: UsagePublisher,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(scheduler_block_ms=10, scheduler_claim_idle_ms=100,
                             scheduler_policy_cache_s=0, scheduler_sweep_interval_s=3600)
    sched = Scheduler(settings, sqlite_store, redis_conn, RecordingEnqueue(),
                      metrics_=Metrics(CollectorRegistry()))
    info = new_session(sqlite_store, "s1")
    publisher.publish(usage(info, 5_000))
    real_write = sqlite_store.apply_usage_batch
    calls = []

    def flaky(reports: Any) -> UsageBatch:
        calls.append(len(reports))
        if len(calls) == 1:
            raise StoreError("database is locked")
        return real_write(reports)

    monkeypatch.setattr(sqlite_store, "apply_usage_batch", flaky)
    with pytest.raises(StoreError):
        sched.run_once()
    assert pending(redis_conn, settings) == 1  # not acknowledged: it will come back
    assert sqlite_store.get_session("s1").measured_tokens is None
    time.sleep(0.15)  # idle past claim_idle_ms: the entry is reclaimed …
    stats = sched.run_once()
    # … and, although Redis already holds this very measurement, it reaches the store now.
    assert stats.accepted == 1 and calls == [1, 1]
    assert sqlite_store.get_session("s1").measured_tokens == 5_000
    assert pending(redis_conn, settings) == 0


class CountingWrites:
    """Wraps a store's apply_usage_batch, remembering the sessions of every call."""

    def __init__(self, store: SessionStore) -> None:
        self.calls: list[list[str]] = []
        self._real = store.apply_usage_batch

    def __call__(self, reports: Any) -> UsageBatch:
        self.calls.append([r.session_id for r in reports])
        return self._real(reports)

    @classmethod
    def on(cls, store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> CountingWrites:
        """Count ``store``'s usage writes for the rest of the test."""
        writes = cls(store)
        monkeypatch.setattr(store, "apply_usage_batch", writes)
        return writes


def test_while_behind_reports_under_the_trigger_coalesce_before_the_store(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis, publisher: UsagePublisher,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One partition: the batches below are cut from one stream, in publishing order.
    settings = make_settings(scheduler_block_ms=10, scheduler_batch_size=5,
                             scheduler_store_flush_ms=10_000, scheduler_policy_cache_s=60,
                             scheduler_sweep_interval_s=3600, partitions=1)
    publisher = UsagePublisher(redis_conn, Keys.from_settings(settings), maxlen=100_000)
    enqueue = RecordingEnqueue()
    sched = Scheduler(settings, sqlite_store, redis_conn, enqueue,
                      metrics_=Metrics(CollectorRegistry()))
    quiet, hot = new_session(sqlite_store, "quiet", n_turns=8), new_session(sqlite_store, "hot")
    writes = CountingWrites.on(sqlite_store, monkeypatch)
    for seq in range(10):
        publisher.publish(usage(quiet, 2_000 + seq, seq=seq))
    publisher.publish(usage(hot, 9_000))  # over its trigger, in the third (full) batch
    for seq in range(10, 14):
        publisher.publish(usage(quiet, 2_000 + seq, seq=seq))
    first, second = sched.run_once(), sched.run_once()
    assert (first.events, second.events) == (5, 5)
    assert writes.calls == []  # behind: nothing under its trigger written yet …
    assert pending(redis_conn, settings) == 1  # … only the carrier of quiet's newest value waits
    third = sched.run_once()
    assert writes.calls == [["hot"]]  # past its trigger: written and decided at once
    assert list(third.enqueued) == ["hot"]
    assert sqlite_store.get_session("quiet").measured_seq is None
    last = sched.run_once()  # caught up: the read comes back empty, the rest is written
    assert last.events == 0 and last.written == 1
    assert writes.calls == [["hot"], ["quiet"]]
    assert sqlite_store.get_session("quiet").measured_seq == 13
    assert pending(redis_conn, settings) == 0


def test_with_flush_zero_every_batch_is_written(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis, publisher: UsagePublisher,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(scheduler_block_ms=10, scheduler_batch_size=5,
                             scheduler_store_flush_ms=0, scheduler_store_refresh_s=0,
                             scheduler_sweep_interval_s=3600)
    sched = Scheduler(settings, sqlite_store, redis_conn, RecordingEnqueue(),
                      metrics_=Metrics(CollectorRegistry()))
    info = new_session(sqlite_store, "s1", n_turns=8)
    writes = CountingWrites.on(sqlite_store, monkeypatch)
    for seq in range(15):
        publisher.publish(usage(info, 2_000 + seq, seq=seq))
    for _ in range(3):
        sched.run_once()
        assert pending(redis_conn, settings) == 0
    assert writes.calls == [["s1"], ["s1"], ["s1"]]


def test_under_its_trigger_a_session_is_written_once_per_refresh_interval(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis, publisher: UsagePublisher,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(scheduler_block_ms=10, scheduler_store_flush_ms=0,
                             scheduler_store_refresh_s=600, scheduler_policy_cache_s=0,
                             scheduler_sweep_interval_s=3600)
    registry = CollectorRegistry()
    enqueue = RecordingEnqueue()
    sched = Scheduler(settings, sqlite_store, redis_conn, enqueue, metrics_=Metrics(registry))
    info = new_session(sqlite_store, "s1", n_turns=8)  # budget 10,000: trigger 8,500
    writes = CountingWrites.on(sqlite_store, monkeypatch)
    measured = Keys.from_settings(settings).measured("s1")

    now = time.time()
    publisher.publish(usage(info, 2_000, seq=1, at=now - 20))
    first = sched.run_once()  # the first report this scheduler sees: written
    publisher.publish(usage(info, 2_500, seq=2, at=now - 10))
    second = sched.run_once()  # under the trigger, written just now: deferred
    assert (first.written, first.deferred, second.written, second.deferred) == (1, 0, 0, 1)
    assert writes.calls == [["s1"]]
    assert pending(redis_conn, settings) == 0  # acknowledged: nothing is redelivered
    # A deferred report moves only the session's last call time (the idle sweep's input);
    # the measured hash keeps the written report, which the next write's compare-and-set
    # is checked against.
    assert redis_conn.hmget(measured, "seq", "tokens") == [b"1", b"2000"]
    keys = Keys.from_settings(settings)
    assert redis_conn.zscore(keys.last_calls(keys.partition_of("s1")), "s1") == now - 10
    assert sqlite_store.get_session("s1").measured_seq == 1
    assert registry.get_sample_value("sessionfold_usage_events_total",
                                     {"result": "deferred"}) == 1
    assert registry.get_sample_value("sessionfold_usage_events_total",
                                     {"result": "accepted"}) == 1

    # Ten minutes on (the write's time moved back rather than the test made to wait): the
    # refresh interval has passed, and the next report is written.
    sched._written_at = {sid: (incarnation, at - 600, position)
                         for sid, (incarnation, at, position) in sched._written_at.items()}
    publisher.publish(usage(info, 3_000, seq=3))
    assert sched.run_once().written == 1
    assert sqlite_store.get_session("s1").measured_seq == 3

    publisher.publish(usage(info, 9_000, seq=4))  # past the trigger: written and decided
    past = sched.run_once()
    assert (past.written, past.deferred) == (1, 0)
    assert sqlite_store.get_session("s1").measured_tokens == 9_000
    assert [job[0] for job in enqueue.jobs] == ["s1"]
    assert writes.calls == [["s1"], ["s1"], ["s1"]]


def test_a_session_reporting_steadily_is_read_by_its_writes_alone(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis, publisher: UsagePublisher,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After its first read, a session's gate comes back with each write of its size: no
    gate query of its own however short the policy cache, and a change made around
    sessionfold (no nudge) is decided on at the next write."""
    settings = make_settings(scheduler_block_ms=10, scheduler_store_flush_ms=0,
                             scheduler_store_refresh_s=600, scheduler_policy_cache_s=0,
                             scheduler_sweep_interval_s=3600)
    enqueue = RecordingEnqueue()
    sched = Scheduler(settings, sqlite_store, redis_conn, enqueue,
                      metrics_=Metrics(CollectorRegistry()))
    info = new_session(sqlite_store, "s1", n_turns=8)  # budget 10,000: trigger 8,500
    gate_reads: list[list[str]] = []
    real_gates = sqlite_store.session_gates
    monkeypatch.setattr(sqlite_store, "session_gates",
                        lambda sids: gate_reads.append(list(sids)) or real_gates(sids))

    def ten_minutes_on() -> None:  # the write's time moved back: the next report is due
        sched._written_at = {sid: (incarnation, at - 600, position)
                             for sid, (incarnation, at, position) in sched._written_at.items()}

    publisher.publish(usage(info, 2_000, seq=1))
    assert sched.run_once().written == 1 and gate_reads == [["s1"]]  # the first: read
    for seq in (2, 3):
        ten_minutes_on()
        publisher.publish(usage(info, 2_000 + seq, seq=seq))
        assert sched.run_once().written == 1
    assert gate_reads == [["s1"]]  # written twice more, never read again
    assert sqlite_store.get_session("s1").measured_seq == 3

    # The trigger lowered in the store itself: nothing tells the scheduler. Its gate still
    # says 8,500, so a report of 5,000 is not urgent; its write brings the new gate (2,550),
    # and the decision after the write enqueues the fold.
    sqlite_store.set_policy("s1", FoldPolicy(budget_tokens=3_000))
    ten_minutes_on()
    publisher.publish(usage(info, 5_000, seq=4))
    stats = sched.run_once()
    assert stats.written == 1 and list(stats.enqueued) == ["s1"]
    assert [job[0] for job in enqueue.jobs] == ["s1"] and gate_reads == [["s1"]]

    # Deleted in the store: the write finds no row, and the session is known gone (its next
    # report is counted unknown, with no write).
    redis_conn.delete(Keys.from_settings(settings).fold_lock("s1"))
    sqlite_store.delete_session("s1")
    ten_minutes_on()
    publisher.publish(usage(info, 5_100, seq=5))
    assert sched.run_once().written == 1 and sched._gates["s1"][1] is None
    publisher.publish(usage(info, 5_200, seq=6))
    gone = sched.run_once()
    assert (gone.unknown, gone.written) == (1, 0)


def test_a_new_scheduler_writes_each_session_s_first_report(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis, publisher: UsagePublisher) -> None:
    # A restart (or a partition handed over): the new process has written nothing yet, so the
    # store gets the newest size at once whatever the one before wrote.
    settings = make_settings(scheduler_block_ms=10, scheduler_store_flush_ms=0,
                             scheduler_policy_cache_s=0, scheduler_sweep_interval_s=3600)
    assert settings.scheduler_store_refresh_s == 300
    info = new_session(sqlite_store, "s1", n_turns=8)
    for seq, tokens in ((1, 2_000), (2, 2_100)):
        sched = Scheduler(settings, sqlite_store, redis_conn, RecordingEnqueue(),
                          metrics_=Metrics(CollectorRegistry()))
        publisher.publish(usage(info, tokens, seq=seq))
        assert sched.run_once().written == 1
        assert sqlite_store.get_session("s1").measured_tokens == tokens
        stopped = threading.Event()
        stopped.set()
        sched.run_forever(stopped)  # stops at once, handing its partitions over


def test_stopping_writes_what_waits(
        make_settings: Callable[..., Settings], sqlite_store: SessionStore,
        redis_conn: redis.Redis, publisher: UsagePublisher) -> None:
    settings = make_settings(scheduler_block_ms=10, scheduler_batch_size=2,
                             scheduler_store_flush_ms=10_000, scheduler_sweep_interval_s=3600)
    sched = Scheduler(settings, sqlite_store, redis_conn, RecordingEnqueue(),
                      metrics_=Metrics(CollectorRegistry()))
    info = new_session(sqlite_store, "s1", n_turns=4)
    for seq in range(4):
        publisher.publish(usage(info, 2_000 + seq, seq=seq))
    sched.run_once()
    assert sqlite_store.get_session("s1").measured_seq is None
    stop = threading.Event()
    stop.set()
    sched.run_forever(stop)  # SIGTERM: the loop ends, and what waits is written first
    assert sqlite_store.get_session("s1").measured_seq == 1
    assert pending(redis_conn, settings) == 0  # what was read is acknowledged …
    nxt = Scheduler(settings, sqlite_store, redis_conn, RecordingEnqueue(),
                    metrics_=Metrics(CollectorRegistry()))
    assert nxt.run_once().events == 2  # … and the unread half is there for the next scheduler


def test_two_schedulers_at_once_keep_every_size_monotonic(
        settings: Settings, sqlite_store: SessionStore, redis_url: str,
        publisher: UsagePublisher) -> None:
    # Every report written (no refresh interval): the store must end at each newest one too.
    settings = settings.model_copy(update={"scheduler_store_refresh_s": 0})
    sessions = [new_session(sqlite_store, f"s{i}", n_turns=20) for i in range(4)]
    events = [usage(info, 1_000 + seq, seq=seq) for info in sessions for seq in range(40)]
    random.Random(7).shuffle(events)
    stop = threading.Event()
    seen: list[tuple[str, int]] = []
    guard = threading.Lock()

    def run(name: str) -> None:
        client = redis_client(redis_url)
        sched = Scheduler(settings, sqlite_store, client, RecordingEnqueue(),
                          consumer_name=name, metrics_=Metrics(CollectorRegistry()))
        measured = Keys.from_settings(settings)
        last: dict[str, int] = {}
        while not stop.is_set():
            sched.run_once(stop)
            for info in sessions:  # what every scheduler observes only ever moves forward
                raw = client.hget(measured.measured(info.id), "seq")
                if raw is not None:
                    assert int(raw) >= last.get(info.id, -1)
                    last[info.id] = int(raw)
                    with guard:
                        seen.append((name, int(raw)))
        client.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for i, ev in enumerate(events):
        publisher.publish(ev)
        if i % 16 == 0:
            time.sleep(0.005)  # let both schedulers take batches while events arrive
    deadline = time.monotonic() + 30
    keys = Keys.from_settings(settings)
    client = redis_client(redis_url)
    while time.monotonic() < deadline:
        if all(client.hget(keys.measured(i.id), "seq") == b"39" for i in sessions) and \
                pending(client, settings) == 0:
            break
        time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert {name for name, _ in seen} == {"a", "b"}
    for info in sessions:
        assert client.hget(keys.measured(info.id), "seq") == b"39"
        stored = sqlite_store.get_session(info.id)
        assert (stored.measured_seq, stored.measured_tokens) == (39, 1_039)
    client.close()


def test_nothing_to_fold_waits_for_growth_or_a_policy_change(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        enqueue: RecordingEnqueue, redis_conn: redis.Redis, settings: Settings) -> None:
    info = new_session(sqlite_store, "s1", n_turns=4)
    sqlite_store.record_usage("s1", {"input_tokens": 9_000}, seq=7, revision=info.revision)
    sqlite_store.record_visit("s1", CompactionRecord(
        trigger="threshold", outcome="nothing-to-fold", budget_tokens=BUDGET,
        target_tokens=6_000, measured_tokens=9_000, tokens_after=9_000))
    publisher.publish(usage(info, 9_000, seq=7))
    publisher.publish(usage(info, 9_000, seq=7))
    stats = scheduler.run_once()
    assert stats.skipped == {"s1": "no-growth-since-nothing-to-fold"}
    assert enqueue.jobs == []
    assert FoldLock.from_settings(settings, redis_conn).holder("s1") is None  # released
    # The policy changes (say, fewer protected turns): the verdict no longer stands.
    sqlite_store.set_policy("s1", FoldPolicy(budget_tokens=BUDGET, keep_recent_turns=1))
    assert scheduler.sweep() == 1
    assert enqueue.sessions() == ["s1"]


def test_a_refused_session_is_visited_again_once_its_window_grew(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        enqueue: RecordingEnqueue) -> None:
    info = new_session(sqlite_store, "s1", n_turns=4)
    sqlite_store.record_usage("s1", {"input_tokens": 9_000}, seq=7, revision=info.revision)
    sqlite_store.record_visit("s1", CompactionRecord(
        trigger="threshold", outcome="refused", budget_tokens=BUDGET, target_tokens=6_000,
        measured_tokens=9_000, tokens_after=9_000))
    assert scheduler.sweep() == 0
    grown = sqlite_store.append("s1", turns(1))
    publisher.publish(usage(sqlite_store.get_session("s1"), 9_400, seq=grown.last_seq))
    stats = scheduler.run_once()
    assert list(stats.enqueued) == ["s1"]


def test_paused_sessions_are_never_enqueued(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        enqueue: RecordingEnqueue) -> None:
    info = new_session(sqlite_store, "s1")
    sqlite_store.set_paused("s1", True)
    publisher.publish(usage(info, 9_900))
    scheduler.run_once()
    assert scheduler.sweep() == 0
    assert enqueue.jobs == []
    sqlite_store.set_paused("s1", False)
    assert scheduler.sweep() == 1


def test_the_sweep_finds_sessions_whose_events_redis_lost(
        scheduler: Scheduler, sqlite_store: SessionStore, enqueue: RecordingEnqueue,
        registry: CollectorRegistry) -> None:
    info = new_session(sqlite_store, "lost")
    new_session(sqlite_store, "fine")
    # Measured through another path (say, the client fell back to the store), no event.
    sqlite_store.record_usage("lost", {"input_tokens": 9_500}, seq=5, revision=info.revision)
    scheduler._next_sweep = 0.0
    stats = scheduler.run_once()
    assert stats.swept and list(stats.enqueued) == ["lost"]
    assert registry.get_sample_value("sessionfold_fold_jobs_enqueued_total",
                                     {"source": "sweep"}) == 1


def test_the_sweep_reports_how_many_sessions_are_past_their_whole_budget(
        scheduler: Scheduler, sqlite_store: SessionStore, registry: CollectorRegistry) -> None:
    near, past = new_session(sqlite_store, "near"), new_session(sqlite_store, "past")
    budget = near.policy.budget_tokens
    # "near" is past its trigger only; "past" is past the budget itself (folds not landing).
    sqlite_store.record_usage("near", {"input_tokens": near.policy.trigger_tokens + 100}, seq=5,
                              revision=near.revision)
    sqlite_store.record_usage("past", {"input_tokens": budget + 2_000}, seq=5,
                              revision=past.revision)
    scheduler.sweep()
    assert registry.get_sample_value("sessionfold_sessions_over_budget") == 1
    sqlite_store.delete_session("past")
    scheduler.sweep()
    assert registry.get_sample_value("sessionfold_sessions_over_budget") == 0


def test_the_sweep_counts_paused_sessions_past_their_whole_budget_apart(
        scheduler: Scheduler, sqlite_store: SessionStore, registry: CollectorRegistry) -> None:
    # A paused session is never folded in the background: it grows with every turn, and the
    # over-budget gauge (which counts sessions folds should bring down) never shows it.
    paused, running = new_session(sqlite_store, "paused"), new_session(sqlite_store, "running")
    budget = paused.policy.budget_tokens
    for info in (paused, running):
        sqlite_store.record_usage(info.id, {"input_tokens": budget * 3}, seq=5,
                                  revision=info.revision)
    sqlite_store.set_paused("paused", True)
    scheduler.sweep()
    assert registry.get_sample_value("sessionfold_paused_sessions_over_budget") == 1
    assert registry.get_sample_value("sessionfold_sessions_over_budget") == 1  # "running"
    sqlite_store.set_paused("paused", False)
    scheduler.sweep()
    assert registry.get_sample_value("sessionfold_paused_sessions_over_budget") == 0
    assert registry.get_sample_value("sessionfold_sessions_over_budget") == 2


def test_events_for_unknown_sessions_are_acknowledged_and_counted(
        scheduler: Scheduler, sqlite_store: SessionStore, publisher: UsagePublisher,
        redis_conn: redis.Redis, settings: Settings, registry: CollectorRegistry) -> None:
    known = new_session(sqlite_store, "known")
    publisher.publish(UsageEvent(session_id="ghost", seq=3, revision=1, input_tokens=99_000))
    publisher.publish(usage(known, 1_000))
    stats = scheduler.run_once()
    assert (stats.unknown, stats.accepted, stats.enqueued) == (1, 1, {})
    assert pending(redis_conn, settings) == 0
    assert registry.get_sample_value("sessionfold_usage_events_total",
                                     {"result": "unknown-session"}) == 1


def test_a_failed_enqueue_frees_the_lock_and_leaves_that_sessions_entries_pending(
        settings: Settings, sqlite_store: SessionStore, redis_conn: redis.Redis,
        publisher: UsagePublisher) -> None:
    enqueue = RecordingEnqueue(fail_for={"broken"})
    sched = Scheduler(settings, sqlite_store, redis_conn, enqueue,
                      metrics_=Metrics(CollectorRegistry()))
    broken, fine = new_session(sqlite_store, "broken"), new_session(sqlite_store, "fine")
    publisher.publish(usage(broken, 9_000))
    publisher.publish(usage(fine, 9_000))
    stats = sched.run_once()
    assert stats.skipped == {"broken": "enqueue-failed"}
    assert list(stats.enqueued) == ["fine"]
    assert FoldLock.from_settings(settings, redis_conn).holder("broken") is None
    assert pending(redis_conn, settings) == 1  # comes back through XAUTOCLAIM


# --- outages and shutdown --------------------------------------------------------------------


@pytest.fixture
def private_settings(make_settings: Callable[..., Settings], private_redis: Any) -> Settings:
    return make_settings(redis_url=private_redis.url, scheduler_block_ms=20,
                         scheduler_policy_cache_s=0, scheduler_sweep_interval_s=3600,
                         scheduler_claim_idle_ms=1000)


def wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_the_scheduler_survives_a_redis_restart(
        private_settings: Settings, private_redis: Any, sqlite_store: SessionStore) -> None:
    enqueue = RecordingEnqueue()
    client = redis_client(private_redis.url, socket_timeout=2, socket_connect_timeout=0.5)
    sched = Scheduler(private_settings, sqlite_store, client, enqueue,
                      metrics_=Metrics(CollectorRegistry()))
    sched.consumer._reconnect_max_s = 0.2
    pub_client = redis_client(private_redis.url, socket_timeout=0.25,
                              socket_connect_timeout=0.25, retries=0)
    publisher = UsagePublisher(pub_client, Keys.from_settings(private_settings),
                               maxlen=10_000, retry_initial_s=0.01, retry_max_s=0.05)
    before, after = new_session(sqlite_store, "before"), new_session(sqlite_store, "after")
    stop = threading.Event()
    loop = threading.Thread(target=sched.run_forever, args=(stop,))
    loop.start()
    try:
        publisher.publish(usage(before, 9_000))
        assert wait_for(lambda: enqueue.sessions() == ["before"])
        private_redis.kill()
        time.sleep(0.3)  # the loop meets the outage and backs off
        private_redis.start()  # empty: stream, group, locks, measured sizes all gone
        assert wait_for(lambda: publisher.publish(usage(after, 9_100)) or False, 10)
        assert wait_for(lambda: "after" in enqueue.sessions())
    finally:
        stop.set()
        loop.join(timeout=30)
    assert not loop.is_alive()
    assert enqueue.sessions() == ["before", "after"]


_SIGTERM_SCRIPT = textwrap.dedent("""
    import logging, sys, threading
    from sessionfold.store.store import SessionStore
    from sessionfold.runtime.redis_conn import redis_client
    from sessionfold.workers.scheduler import Scheduler, install_signal_handlers
    from sessionfold.runtime.settings import Settings

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    settings = Settings()
    store = SessionStore.from_url(settings.database_url)
    stop = threading.Event()
    install_signal_handlers(stop)
    sched = Scheduler(settings, store, redis_client(settings.redis_url),
                      lambda sid, epoch, trigger, token: "job")
    print("ready", flush=True)
    sched.run_forever(stop)
    print("clean exit", flush=True)
""")


def test_sigterm_stops_the_loop_gracefully(settings: Settings, sqlite_store: SessionStore,
                                           tmp_path: Path) -> None:
    env = {**os.environ, "REDIS_URL": settings.redis_url or "",
           "DATABASE_URL": settings.database_url or "",
           "SESSIONFOLD_KEY_PREFIX": settings.key_prefix,
           "SESSIONFOLD_DATA_DIR": str(tmp_path), "SESSIONFOLD_SCHEDULER_BLOCK_MS": "200"}
    proc = subprocess.Popen([sys.executable, "-c", _SIGTERM_SCRIPT], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert first == "ready", err
    assert proc.returncode == 0, err
    assert "stopping after this batch" in out
    assert out.rstrip().endswith("clean exit")


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    before = threading.active_count()
    yield
    assert wait_for(lambda: threading.active_count() <= before, 10)
