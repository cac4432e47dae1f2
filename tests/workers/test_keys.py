"""Key names: one prefix for everything, glob-safe patterns, ids kept verbatim, and one Redis
Cluster hash slot per partition whatever the session id holds."""

from __future__ import annotations

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot
from sessionfold.runtime.keys import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Keys
from sessionfold.runtime.settings import Settings
from sessionfold.store.partitions import partition_of, session_hash


def test_every_key_lives_under_the_prefix() -> None:
    keys = Keys("acme:")
    names = [keys.usage_stream(0), keys.measured("s1"), keys.fold_lock("s1"),
             keys.fold_attempts("job-1"), keys.summarizer_slots(),
             keys.summarizer_spend("s1", 7), keys.celery_prefix()]
    assert all(name.startswith("acme:") for name in names)
    assert len(set(names)) == len(names)


def test_defaults_and_settings() -> None:
    assert Keys().usage_stream(3) == DEFAULT_PREFIX + "usage:{p3}"
    assert Keys().partitions == DEFAULT_PARTITIONS
    settings = Settings(key_prefix="t9:", usage_stream="events", partitions=4)
    keys = Keys.from_settings(settings)
    assert keys.usage_streams() == [f"t9:events:{{p{p}}}" for p in range(4)]


def test_a_sessions_partition_is_a_stable_hash_of_its_id() -> None:
    # Pinned: agents, schedulers and the store of every release must agree on it.
    assert session_hash("agent-7") == 636009088
    assert partition_of("agent-7", 16) == 636009088 % 16
    assert Keys(partitions=16).partition_of("agent-7") == partition_of("agent-7", 16)
    counts = [0] * 16
    for i in range(16_000):
        counts[partition_of(f"session-{i}", 16)] += 1
    assert min(counts) > 800 and max(counts) < 1200  # spread evenly


@given(st.text(min_size=1, max_size=40))
def test_every_key_of_a_session_is_in_its_partitions_slot_whatever_the_id_holds(sid: str) -> None:
    keys = Keys("sf:", partitions=8)
    partition = keys.partition_of(sid)
    slot = key_slot(keys.usage_stream(partition).encode())
    for key in (keys.measured(sid), keys.fold_lock(sid), keys.summarizer_spend(sid, 1),
                keys.partition_lease(partition)):
        assert key_slot(key.encode("utf-8", "surrogatepass")) == slot


def test_a_session_id_with_its_own_hash_tag_cannot_choose_its_slot() -> None:
    keys = Keys("sf:", partitions=8)
    sid = "{p0}evil"
    own = keys.tag(keys.partition_of(sid))
    assert keys.measured(sid).startswith(f"sf:measured:{own}:")
    assert key_slot(keys.measured(sid).encode()) == key_slot(own.encode())


def test_partitions_have_slots_of_their_own() -> None:
    keys = Keys("sf:", partitions=16)
    assert len({key_slot(s.encode()) for s in keys.usage_streams()}) == 16


@pytest.mark.parametrize("prefix", ["a{b}:", "x}:", "{:"])
def test_a_prefix_with_braces_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="must not contain"):
        Keys(prefix)


@pytest.mark.parametrize("count", [0, -1, True, 2.0])
def test_a_partition_count_below_one_is_refused(count: object) -> None:
    with pytest.raises(ValueError, match="partition count"):
        Keys(partitions=count)  # type: ignore[arg-type]


def test_lock_keys_round_trip_their_session_even_with_colons() -> None:
    keys = Keys("p:")
    sid = "tenant:agent/7 ünïcode"
    assert keys.session_of_lock(keys.fold_lock(sid)) == sid
    assert keys.session_of_lock(keys.fold_lock(sid).encode()) == sid
    with pytest.raises(ValueError, match="not a fold lock key"):
        keys.session_of_lock(keys.measured(sid))


@pytest.mark.redis
def test_patterns_treat_the_prefix_literally(redis_conn: redis.Redis, redis_prefix: str) -> None:
    keys = Keys(redis_prefix + "we[i]rd*:")
    lookalike = Keys(redis_prefix + "weird-:")  # would match if [i] and * were glob syntax
    for k in (keys, lookalike):
        redis_conn.set(k.fold_lock("s1"), "t")
        redis_conn.set(k.measured("s1"), "x")
    found = sorted(redis_conn.scan_iter(match=keys.fold_lock_pattern(), count=1000))
    assert found == [keys.fold_lock("s1").encode()]
    everything = set(redis_conn.scan_iter(match=keys.all_pattern(), count=1000))
    assert everything == {keys.fold_lock("s1").encode(), keys.measured("s1").encode()}


@pytest.mark.parametrize("bad", ["", None, 5])
def test_ids_must_be_non_empty_strings(bad: object) -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        Keys().measured(bad)  # type: ignore[arg-type]


def test_empty_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="prefix"):
        Keys("")


def test_a_new_session_of_the_same_id_has_its_own_spend_key() -> None:
    keys = Keys("p:")
    assert keys.summarizer_spend("tenant:a", 1) != keys.summarizer_spend("tenant:a", 2)
    assert keys.summarizer_spend("a:1", 2) != keys.summarizer_spend("a", 1)  # no aliasing
    with pytest.raises(ValueError, match="incarnation"):
        keys.summarizer_spend("a", "1")  # type: ignore[arg-type]
