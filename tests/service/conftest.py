"""Fixtures of the HTTP API tests: a live API (uvicorn on a spare port) on SQLite or PostgreSQL.

- ``backend`` / ``store_url``: a migrated store, parametrized over a SQLite file and a database
  of its own on the machine's PostgreSQL (``SF_TEST_POSTGRES_URL``; skipped without a server on a
  laptop, failed under CI).
- ``api``: a running API (:class:`LiveApi`) on that store and the test Redis; ``api.key(tenant)``
  makes a key, ``api.http(key)`` an HTTP client that sends it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI
from sessionfold.client import Client, connect
from sessionfold.runtime.settings import Settings
from sessionfold.service import create_app
from sessionfold.service.auth import create_key
from sessionfold.service.protocol import server_options
from sessionfold.store import SessionStore
from sessionfold.store.engine import create_store_engine

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[sa.Engine]:
    url = os.environ.get("SF_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL)
    engine = create_store_engine(url, pool_size=1).execution_options(
        isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as exc:
        engine.dispose()
        _unavailable(f"no PostgreSQL at {url}: {str(exc.orig).strip().splitlines()[0]}")
    yield engine
    engine.dispose()


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated store of the test's own (a new PostgreSQL database, dropped afterwards)."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        made = None
    else:
        admin: sa.Engine = request.getfixturevalue("postgres_admin")
        made = f"sf_api_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{made}"')
        url = admin.url.set(database=made).render_as_string(hide_password=False)
    store = SessionStore.from_url(url)
    store.migrate()
    store.close()
    yield url
    if made is not None:
        admin = request.getfixturevalue("postgres_admin")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{made}" WITH (FORCE)')


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@dataclass
class LiveApi:
    """An API served by uvicorn on a thread of the test process."""

    url: str
    client: Client
    settings: Settings
    state: Any = None
    _clients: list[httpx2.Client] = field(default_factory=list)

    @property
    def store(self) -> SessionStore:
        return self.client.store

    def key(self, tenant: str, *, admin: bool = False) -> str:
        return create_key(self.store, tenant, admin=admin).key

    def http(self, key: str | None = None, **options: Any) -> httpx2.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = httpx2.Client(base_url=self.url, headers=headers, timeout=60.0, **options)
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()


@pytest.fixture
def api_settings(make_settings: Callable[..., Settings], store_url: str) -> Settings:
    return make_settings(database_url=store_url, metrics_port=0, api_key_cache_s=0.0,
                         api_poll_interval_s=0.05, api_max_wait_s=30.0)


@contextlib.contextmanager
def serving(app: FastAPI, settings: Settings) -> Iterator[str]:
    """``app`` served by uvicorn on a thread, with the protocol and limits `sessionfold serve`
    runs with, until the block ends; yields its base URL once it has started."""
    sock = _bound_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", backlog=2048,
                            **server_options(settings))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="sessionfold-test-api", daemon=True)
    thread.start()
    started = threading.Event()
    for _ in range(600):  # the lifespan connects the watcher; wait for the server to answer
        if server.started:
            started.set()
            break
        threading.Event().wait(0.05)
    if not started.is_set():
        pytest.fail("the API did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture
def api(api_settings: Settings) -> Iterator[LiveApi]:
    client = connect(api_settings)
    app = create_app(api_settings, client=client)
    try:
        with serving(app, api_settings) as url:
            live = LiveApi(url, client, api_settings, state=app.state.sessionfold)
            try:
                yield live
            finally:
                live.close()
    finally:
        client.close()
