"""The per-session fold lock: one holder, token-checked release and extend, expiry."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from sessionfold.core.errors import RedisUnavailableError
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.workers.locks import FoldLock

pytestmark = pytest.mark.redis


@pytest.fixture
def lock(redis_conn: redis.Redis, redis_keys: Keys) -> FoldLock:
    return FoldLock(redis_conn, redis_keys, ttl_ms=60_000)


def test_one_holder_at_a_time_per_session(lock: FoldLock) -> None:
    token = lock.acquire("s1")
    assert token is not None
    assert lock.acquire("s1") is None
    assert lock.acquire("s2") is not None  # other sessions are independent
    assert lock.holder("s1") == token


def test_release_needs_the_holders_token(lock: FoldLock) -> None:
    token = lock.acquire("s1")
    assert token is not None
    assert not lock.release("s1", "not-the-token")
    assert lock.holder("s1") == token
    assert lock.release("s1", token)
    assert lock.holder("s1") is None
    assert not lock.release("s1", token)  # twice: nothing left to release
    assert lock.acquire("s1") is not None


def test_a_late_release_never_frees_the_next_holders_lock(redis_conn: redis.Redis,
                                                          redis_keys: Keys) -> None:
    short = FoldLock(redis_conn, redis_keys, ttl_ms=50)
    slow_job = short.acquire("s1")
    assert slow_job is not None
    time.sleep(0.1)  # the slow job's lock expired …
    next_job = short.acquire("s1")  # … and the next job took it
    assert next_job is not None and next_job != slow_job
    assert not short.release("s1", slow_job)  # the slow job ends: compare-and-delete refuses
    assert short.holder("s1") == next_job
    assert not short.extend("s1", slow_job)


def test_extend_resets_the_time_to_live_for_the_holder_only(redis_conn: redis.Redis,
                                                            redis_keys: Keys) -> None:
    lock = FoldLock(redis_conn, redis_keys, ttl_ms=5_000)
    token = lock.acquire("s1")
    assert token is not None
    assert redis_conn.pttl(redis_keys.fold_lock("s1")) <= 5_000
    assert lock.extend("s1", token, ttl_ms=600_000)
    assert redis_conn.pttl(redis_keys.fold_lock("s1")) > 5_000
    assert not lock.extend("s1", "other", ttl_ms=1)
    assert redis_conn.pttl(redis_keys.fold_lock("s1")) > 5_000
    assert lock.extend("s1", token)  # default: the lock's own ttl
    assert redis_conn.pttl(redis_keys.fold_lock("s1")) <= 5_000


def test_many_simultaneous_acquires_yield_one_token(redis_url: str, redis_keys: Keys) -> None:
    start = threading.Barrier(12)
    tokens: list[str | None] = []
    guard = threading.Lock()

    def contender() -> None:
        client = redis_client(redis_url)
        mine = FoldLock(client, redis_keys, ttl_ms=60_000)
        start.wait()
        got = mine.acquire("hot")
        with guard:
            tokens.append(got)
        client.close()

    threads = [threading.Thread(target=contender) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [t for t in tokens if t is not None]
    assert len(tokens) == 12 and len(winners) == 1


def test_locked_sessions_lists_pending_folds(lock: FoldLock) -> None:
    for sid in ("a", "b:c", "d"):
        lock.acquire(sid)
    token = lock.holder("d")
    assert token is not None
    lock.release("d", token)
    assert sorted(lock.locked_sessions()) == ["a", "b:c"]


def test_redis_errors_surface_as_redis_unavailable(private_redis: Any) -> None:
    client = redis_client(private_redis.url, socket_connect_timeout=0.5, retries=0)
    lock = FoldLock(client, Keys("l:"), ttl_ms=1000)
    private_redis.kill()
    with pytest.raises(RedisUnavailableError, match="acquiring a fold lock"):
        lock.acquire("s1")
    with pytest.raises(RedisUnavailableError, match="releasing a fold lock"):
        lock.release("s1", "t")


def test_a_quiet_release_frees_the_lock_and_only_logs_a_lost_redis(
        lock: FoldLock, private_redis: Any, caplog: pytest.LogCaptureFixture) -> None:
    token = lock.acquire("q")
    lock.release_quietly("q", token)
    assert lock.holder("q") is None
    lock.release_quietly("q", None)  # a job that never held it: nothing to do
    client = redis_client(private_redis.url, socket_connect_timeout=0.5, retries=0)
    gone = FoldLock(client, Keys("l:"), ttl_ms=1000)
    private_redis.kill()
    with caplog.at_level("WARNING", logger="sessionfold.workers.locks"):
        gone.release_quietly("q", "some-token")  # does not raise
    assert "could not release the fold lock of q" in caplog.text
