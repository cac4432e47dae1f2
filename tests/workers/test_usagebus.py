"""The usage bus against a real Redis: events and their publisher (``sessionfold.runtime.usage``),
consumer groups and dead consumers (``sessionfold.workers.usage_consumer``), outages."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import anthropic.types
import pytest
import redis
from sessionfold.core.errors import InvalidInputError
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.usage import FIELD, UsageEvent, UsagePublisher
from sessionfold.workers.usage_consumer import StreamEntry, UsageConsumer

pytestmark = pytest.mark.redis


@pytest.fixture
def redis_keys(redis_prefix: str) -> Keys:
    """One partition: these tests are about one stream (partitions have tests of their own)."""
    return Keys(redis_prefix, partitions=1)


def event(sid: str = "s1", seq: int = 1, revision: int = 1, tokens: int = 1000,
          **kw: Any) -> UsageEvent:
    return UsageEvent(session_id=sid, seq=seq, revision=revision, input_tokens=tokens, **kw)


def publish(client: redis.Redis, keys: Keys, events: list[UsageEvent]) -> None:
    publisher = UsagePublisher(client, keys, maxlen=100_000)
    for ev in events:
        assert publisher.publish(ev)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- events ----------------------------------------------------------------------------------


def test_an_event_round_trips_through_the_stream(redis_conn: redis.Redis,
                                                 redis_keys: Keys) -> None:
    ev = UsageEvent(session_id="agent/7 ü", seq=41, revision=7, input_tokens=1200,
                    cache_read_input_tokens=30_000, cache_creation_input_tokens=800,
                    output_tokens=350, model="claude-haiku-5-5", time=1_700_000_000.25)
    publish(redis_conn, redis_keys, [ev])
    [(_, fields)] = redis_conn.xrange(redis_keys.usage_stream(0))
    assert list(fields) == [FIELD]  # one field: readers pay per field
    assert UsageEvent.from_fields(fields) == ev
    assert ev.prompt_tokens == 32_000
    assert ev.position == (7, 41)


def test_events_read_anthropic_usage_objects_and_dicts() -> None:
    usage = anthropic.types.Usage(input_tokens=900, output_tokens=120,
                                  cache_read_input_tokens=None, cache_creation_input_tokens=40)
    ev = UsageEvent.from_usage("s1", usage, seq=3, revision=2, model="m", time_s=5.0)
    assert (ev.input_tokens, ev.cache_read_input_tokens, ev.cache_creation_input_tokens,
            ev.output_tokens, ev.prompt_tokens) == (900, 0, 40, 120, 940)
    from_dict = UsageEvent.from_usage("s1", {"input_tokens": 900, "output_tokens": 120,
                                             "cache_creation_input_tokens": 40},
                                      seq=3, revision=2, model="m", time_s=5.0)
    assert from_dict == ev


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"session_id": ""}, "session_id"),
    ({"seq": -1}, "seq"),
    ({"revision": True}, "revision"),
    ({"input_tokens": 1.5}, "input_tokens"),
    ({"time": float("nan")}, "time"),
])
def test_bad_events_are_refused_with_the_field_named(kwargs: dict[str, Any],
                                                     message: str) -> None:
    values: dict[str, Any] = {"session_id": "s", "seq": 0, "revision": 0, "input_tokens": 1}
    values.update(kwargs)
    with pytest.raises(InvalidInputError, match=message):
        UsageEvent(**values)


# --- consuming -------------------------------------------------------------------------------


def consumer(client: redis.Redis, keys: Keys, name: str, **kw: Any) -> UsageConsumer:
    kw.setdefault("block_ms", 10)
    return UsageConsumer(client, keys, consumer=name, **kw)


def pending(client: redis.Redis, keys: Keys, group: str = "schedulers") -> int:
    return int(client.xpending(keys.usage_stream(0), group)["pending"])


def test_a_consumer_reads_in_batches_and_entries_stay_pending_until_acked(
        redis_conn: redis.Redis, redis_keys: Keys) -> None:
    events = [event(seq=i) for i in range(25)]
    publish(redis_conn, redis_keys, events)  # before the group exists: still consumed
    c = consumer(redis_conn, redis_keys, "a", batch_size=10)
    batches = [c.read() for _ in range(4)]
    assert [len(b) for b in batches] == [10, 10, 5, 0]
    assert [e.event for b in batches for e in b] == events
    assert pending(redis_conn, redis_keys) == 25
    assert c.ack(batches[0]) == 10
    assert c.ack(batches[1] + batches[2]) == 15
    assert pending(redis_conn, redis_keys) == 0


def test_consumers_of_one_group_share_the_entries_without_overlap(
        redis_conn: redis.Redis, redis_keys: Keys) -> None:
    publish(redis_conn, redis_keys, [event(seq=i) for i in range(40)])
    a = consumer(redis_conn, redis_keys, "a", batch_size=7)
    b = consumer(redis_conn, redis_keys, "b", batch_size=7)
    seen: dict[str, list[int]] = {"a": [], "b": []}
    while True:
        got_a, got_b = a.read(), b.read()
        if not got_a and not got_b:
            break
        seen["a"] += [e.event.seq for e in got_a]
        seen["b"] += [e.event.seq for e in got_b]
    assert seen["a"] and seen["b"]
    assert not set(seen["a"]) & set(seen["b"])
    assert sorted(seen["a"] + seen["b"]) == list(range(40))


def test_a_dead_consumers_unacked_entries_are_claimed_by_another(
        redis_conn: redis.Redis, redis_keys: Keys) -> None:
    publish(redis_conn, redis_keys, [event(seq=i) for i in range(5)])
    dead = consumer(redis_conn, redis_keys, "dead", batch_size=100)
    assert len(dead.read()) == 5  # … and it never acknowledges them
    publish(redis_conn, redis_keys, [event(seq=5)])
    patient = consumer(redis_conn, redis_keys, "patient", claim_idle_ms=60_000)
    # Idle for less than claim_idle_ms: a live consumer's entries are left alone.
    mine = patient.read()
    assert [e.event.seq for e in mine] == [5]
    patient.ack(mine)
    rescuer = consumer(redis_conn, redis_keys, "rescuer", claim_idle_ms=50)
    time.sleep(0.1)  # the dead consumer's entries are now idle longer than 50 ms
    claimed = rescuer.read()
    assert sorted(e.event.seq for e in claimed) == [0, 1, 2, 3, 4]
    assert rescuer.claimed == 5
    owners = redis_conn.xpending_range(redis_keys.usage_stream(0), "schedulers", "-", "+", 100,
                                       consumername="rescuer")
    assert len(owners) == 5
    rescuer.ack(claimed)
    assert pending(redis_conn, redis_keys) == 0


def test_malformed_entries_are_acknowledged_and_skipped(redis_conn: redis.Redis,
                                                        redis_keys: Keys) -> None:
    stream = redis_keys.usage_stream(0)
    redis_conn.xadd(stream, {"session": "s1", "seq": "3"})  # not our layout
    redis_conn.xadd(stream, {FIELD: b"{not json"})
    redis_conn.xadd(stream, {FIELD: b'["s1", 1, 2]'})  # too short
    redis_conn.xadd(stream, {FIELD: b'["s1", -1, 2, 10, 0, 0, 0, "m", 1.0]'})  # negative seq
    publish(redis_conn, redis_keys, [event(seq=9)])
    c = consumer(redis_conn, redis_keys, "a")
    assert [e.event.seq for e in c.read()] == [9]
    assert c.malformed == 4
    assert pending(redis_conn, redis_keys) == 1


@pytest.mark.parametrize("raw", [True, False])
def test_the_raw_reader_and_redis_py_s_parsing_read_the_same_entries(
        redis_url: str, redis_prefix: str, raw: bool) -> None:
    """A consumer reads through a client on the same pool whose replies skip redis-py's
    reshaping of each entry (``_decode`` takes the server's flat field list). Without it (a
    cluster client) redis-py's parsing serves: both read the same events, and skip the same
    malformed entries, in the same order."""
    client = redis_client(redis_url)
    keys = Keys(f"{redis_prefix}:raw{raw}", partitions=1)
    try:
        c = consumer(client, keys, "a")
        assert c._reader is not None and c._reader.connection_pool is client.connection_pool
        if not raw:
            c._reader = None
        stream = keys.usage_stream(0)
        publish(client, keys, [event(seq=1, tokens=100)])
        client.xadd(stream, {FIELD: b"{not json"})
        client.xadd(stream, {FIELD: event(seq=2).to_payload(), "note": b"a newer field"})
        publish(client, keys, [event(sid="s2", seq=3, model="m", time=12.5)])
        read = c.read()
        assert [(e.event.session_id, e.event.seq) for e in read] == [
            ("s1", 1), ("s1", 2), ("s2", 3)]
        assert read[2].event == event(sid="s2", seq=3, model="m", time=12.5)
        assert all(type(e.entry_id) is bytes and e.partition == 0 for e in read)
        assert c.malformed == 1 and c.ack(read) == 3
        assert pending(client, keys) == 0
    finally:
        client.delete(keys.usage_stream(0))
        client.close()


def test_dead_consumers_without_pending_entries_are_pruned(redis_conn: redis.Redis,
                                                           redis_keys: Keys) -> None:
    publish(redis_conn, redis_keys, [event(seq=0), event(seq=1), event(seq=2)])
    idle_done = consumer(redis_conn, redis_keys, "idle-done", batch_size=1)
    idle_done.ack(idle_done.read())
    holding = consumer(redis_conn, redis_keys, "holding", batch_size=1)
    assert holding.read()  # keeps one pending: must not be pruned (that would drop it)
    me = consumer(redis_conn, redis_keys, "me")
    me.ack(me.read())
    time.sleep(0.05)
    assert me.prune_consumers(idle_ms=20) == 1
    names = {c["name"] for c in redis_conn.xinfo_consumers(redis_keys.usage_stream(0),
                                                           "schedulers")}
    assert names == {b"holding", b"me"}


def test_a_consumer_rides_out_a_redis_restart(private_redis: Any) -> None:
    client = redis_client(private_redis.url, socket_timeout=2, socket_connect_timeout=0.5)
    keys = Keys("bus:")
    publish(client, keys, [event(seq=0)])
    c = consumer(client, keys, "a", claim_idle_ms=60_000, reconnect_max_s=0.2)
    c.ack(c.read())
    private_redis.kill()
    stop = threading.Event()
    assert c.read(stop) == []  # no raise while Redis is away
    assert c.read(stop) == []
    private_redis.start()  # empty: the stream and the group are gone (NOGROUP)
    publish(client, keys, [event(seq=1)])
    got: list[StreamEntry] = []
    for _ in range(20):
        got = c.read(stop)
        if got:
            break
    assert [e.event.seq for e in got] == [1]
    assert c.ack(got) == 1


def test_a_consumer_without_redis_waits_and_returns_empty(private_redis: Any) -> None:
    client = redis_client(private_redis.url, socket_connect_timeout=0.5, retries=0)
    private_redis.kill()
    c = consumer(client, Keys("x:", partitions=1), "a", reconnect_max_s=0.05)
    assert c.read() == []
    # A lost ack is not an error: the entry comes back.
    assert c.ack([StreamEntry(b"1-0", event(), 0)]) == 0


# --- publishing ------------------------------------------------------------------------------


def test_the_stream_is_trimmed_approximately(redis_conn: redis.Redis, redis_keys: Keys) -> None:
    publisher = UsagePublisher(redis_conn, redis_keys, maxlen=100)
    for i in range(1000):
        publisher.publish(event(seq=i))
    length = redis_conn.xlen(redis_keys.usage_stream(0))
    assert 100 <= length < 1000


def test_publishing_with_redis_down_never_raises_and_flushes_after_restart(
        private_redis: Any, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    client = redis_client(private_redis.url, socket_timeout=0.25,
                          socket_connect_timeout=0.25, retries=0)
    keys = Keys("pub:", partitions=1)
    publisher = UsagePublisher(client, keys, maxlen=10_000, buffer_max=5, clock=clock)
    assert publisher.publish(event(seq=0))
    private_redis.kill()
    caplog.set_level(logging.WARNING, logger="sessionfold.runtime.usage")
    sent = [publisher.publish(event(seq=i)) for i in range(1, 13)]
    clock.now += 1.0  # past the retry delay: the next publish tries Redis again, still down
    sent.append(publisher.publish(event(seq=13)))
    assert sent == [False] * 13
    assert publisher.buffered == 5
    assert publisher.dropped == 8  # the oldest go first
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(unreachable) == 1  # one warning per outage, not one per event
    private_redis.start()
    clock.now += 10.0
    assert publisher.publish(event(seq=14))
    assert publisher.buffered == 0
    seqs = [UsageEvent.from_fields(f).seq for _, f in client.xrange(keys.usage_stream(0))]
    assert seqs == [9, 10, 11, 12, 13, 14]  # the new server lost seq 0; order kept
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def test_a_zero_buffer_drops_during_an_outage(private_redis: Any) -> None:
    clock = FakeClock()
    client = redis_client(private_redis.url, socket_connect_timeout=0.25, retries=0)
    publisher = UsagePublisher(client, Keys("z:", partitions=1), maxlen=10_000, buffer_max=0,
                               clock=clock)
    private_redis.kill()
    assert not publisher.publish(event(seq=1))
    assert not publisher.publish(event(seq=2))
    assert (publisher.buffered, publisher.dropped) == (0, 2)
    private_redis.start()
    clock.now += 10
    assert publisher.publish(event(seq=3))
    assert [UsageEvent.from_fields(f).seq for _, f in client.xrange("z:usage:{p0}")] == [3]


def test_one_publisher_serves_many_threads(redis_conn: redis.Redis, redis_keys: Keys) -> None:
    publisher = UsagePublisher(redis_conn, redis_keys, maxlen=100_000)

    def run(t: int) -> None:
        for i in range(50):
            assert publisher.publish(event(sid=f"s{t}", seq=i))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    entries = redis_conn.xrange(redis_keys.usage_stream(0))
    assert len(entries) == 400
    events = [UsageEvent.from_fields(f) for _, f in entries]
    for t in range(8):
        mine = [ev.seq for ev in events if ev.session_id == f"s{t}"]
        assert mine == list(range(50))  # each thread's events in its order
