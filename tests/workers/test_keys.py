"""Key names: one prefix for everything, glob-safe patterns, ids kept verbatim."""

from __future__ import annotations

import pytest
import redis
from sessionfold.workers.keys import DEFAULT_PREFIX, Keys
from sessionfold.workers.settings import Settings


def test_every_key_lives_under_the_prefix() -> None:
    keys = Keys("acme:")
    names = [keys.usage_stream(), keys.measured("s1"), keys.fold_lock("s1"),
             keys.fold_attempts("job-1"), keys.summarizer_slots(), keys.summarizer_spend("s1"),
             keys.celery_prefix()]
    assert all(name.startswith("acme:") for name in names)
    assert len(set(names)) == len(names)


def test_defaults_and_settings() -> None:
    assert Keys().usage_stream() == DEFAULT_PREFIX + "usage"
    settings = Settings(key_prefix="t9:", usage_stream="events")
    assert Keys.from_settings(settings).usage_stream() == "t9:events"


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
