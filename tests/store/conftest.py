"""Fixtures of the store tests: every ``store`` test runs on SQLite and on PostgreSQL.

- ``store``: a migrated :class:`SessionStore`, parametrized over a SQLite file under ``tmp_path``
  and the machine's PostgreSQL (``SF_TEST_POSTGRES_URL``, default the local server's ``postgres``
  database). PostgreSQL tests run in one database made for this test run, ``sf_test_<random>``,
  dropped at the end; its tables are emptied before each test. Without a server they skip,
  unless ``CI`` is set: then they fail.
- ``store_url``: the URL the ``store`` fixture opened (for a second store or the CLI).
- ``fresh_url``: an empty, unmigrated database of the same backend (schema tests).
- ``clock``: a settable clock (``clock.advance(seconds)``) the store stamps rows with.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sessionfold.store import SessionStore
from sessionfold.store.engine import create_store_engine
from sessionfold.store.schema import metadata
from store_helpers import Clock

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it)")
    pytest.skip(reason)


class PostgresServer:
    """Makes and drops uniquely named databases on the test server."""

    def __init__(self, admin_url: str) -> None:
        self.admin = create_store_engine(admin_url, pool_size=1).execution_options(
            isolation_level="AUTOCOMMIT")
        self.made: list[str] = []

    def create(self) -> str:
        name = f"sf_test_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        return self.admin.url.set(database=name).render_as_string(hide_password=False)

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in self.made:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin.dispose()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    url = os.environ.get("SF_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL)
    try:
        server = PostgresServer(url)
        with server.admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as exc:
        _unavailable(f"no PostgreSQL at {url}: {str(exc.orig).strip().splitlines()[0]}")
    try:
        yield server
    finally:
        server.drop_all()


@pytest.fixture(scope="session")
def postgres_store_url(postgres: PostgresServer) -> str:
    """One migrated database for the whole run (tables emptied per test)."""
    url = postgres.create()
    store = SessionStore.from_url(url)
    try:
        store.migrate()
    finally:
        store.close()
    return url


@pytest.fixture
def clock() -> Clock:
    return Clock()


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        store = SessionStore.from_url(url)
        store.migrate()
        store.close()
        return url
    url = str(request.getfixturevalue("postgres_store_url"))
    engine = create_store_engine(url, pool_size=1)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in metadata.sorted_tables)
        conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
    engine.dispose()
    return url


@pytest.fixture
def store(store_url: str, clock: Clock) -> Iterator[SessionStore]:
    s = SessionStore.from_url(store_url, clock=clock)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def fresh_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """An empty database with no schema at all."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create()

