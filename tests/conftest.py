"""Redis and store fixtures shared by the tests of every package (workers, client, cli...).

This folder is on ``sys.path`` while the tests run (pytest puts a root conftest's folder there),
so the shared helpers beside this file import by name: ``from pipeline_harness import ...``.

- ``redis_url``: the machine's Redis (``SF_TEST_REDIS_URL``, default db 15). Skips without a
  server on a laptop; fails under CI (``CI`` set), where the server must be there.
- ``redis_prefix`` / ``redis_keys``: a key prefix unique to the test; only keys under it are
  deleted afterwards (the server is shared: never flush it).
- ``redis_conn``: a client on ``redis_url``.
- ``private_redis``: a ``redis-server`` of the test's own on a spare port, for tests that stop,
  kill or restart Redis. ``.url``, ``.stop()``, ``.kill()``, ``.start()``, ``.restart()``.
- ``make_settings(**overrides)``: Settings pointing at ``redis_url``, the test's prefix, a data
  dir and a SQLite store under ``tmp_path``.
- ``sqlite_store``: a migrated SQLite SessionStore under ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings

DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/15"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The shared test Redis; skipped locally, failed under CI when it does not answer."""
    url = os.environ.get("SF_TEST_REDIS_URL", DEFAULT_TEST_REDIS_URL)
    client = redis_client(url, socket_timeout=2, socket_connect_timeout=2, retries=0)
    try:
        client.ping()
    except redis.RedisError as exc:
        _unavailable(f"no Redis at {url}: {exc}")
    finally:
        client.close()
    return url


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key under ``prefix`` (and nothing else)."""
    pattern = Keys(prefix).all_pattern()
    removed = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            removed += client.delete(*batch)
            batch.clear()
    if batch:
        removed += client.delete(*batch)
    return removed


@pytest.fixture
def redis_prefix(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    """``sftest:<test name>:<random>:``; its keys are deleted after the test."""
    name = request.node.name.replace("[", "-").replace("]", "")[:40]
    prefix = f"sftest:{name}:{uuid.uuid4().hex[:8]}:"
    yield prefix
    client = redis_client(redis_url)
    try:
        delete_prefix(client, prefix)
    finally:
        client.close()


@pytest.fixture
def redis_keys(redis_prefix: str) -> Keys:
    return Keys(redis_prefix)


@pytest.fixture
def redis_conn(redis_url: str) -> Iterator[redis.Redis]:
    client = redis_client(redis_url)
    yield client
    client.close()


# --- a private redis-server ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A ``redis-server`` process this test owns (no persistence), on a fixed port."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("redis-server")
        if binary is None:
            _unavailable("redis-server is not on PATH")
        assert binary is not None
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--maxmemory-policy",
             "noeviction"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5,
                             socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.RedisError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"redis-server did not start on port {self.port}: "
                            + (self.workdir / "redis.log").read_text()[-2000:]) from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop gracefully (everything in it is lost: no persistence)."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self._end(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _end(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A started ``redis-server`` on a spare port, stopped after the test."""
    server = RedisServer(tmp_path / "private-redis")
    server.start()
    yield server
    server.kill()


# --- settings and store ----------------------------------------------------------------------


@pytest.fixture
def make_settings(tmp_path: Path, redis_url: str, redis_prefix: str
                  ) -> Callable[..., Settings]:
    """Settings for this test: the test Redis and prefix, data under ``tmp_path``."""
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "database_url": f"sqlite:///{tmp_path / 'store.db'}",
            "key_prefix": redis_prefix,
            "data_dir": tmp_path / "data",
            "anthropic_api_key": None,
            "summarizer": "offline",
        }
        values.update(overrides)
        return Settings(**values)
    return make


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Any]:
    """A migrated SQLite SessionStore under ``tmp_path``."""
    from sessionfold.store.store import SessionStore

    store = SessionStore.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    yield store
    store.close()
