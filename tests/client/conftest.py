"""Fixtures shared by the client tests.

- ``database_url``: a fresh database of each backend, a SQLite file under ``tmp_path`` and a
  PostgreSQL database made for the test on ``SF_TEST_POSTGRES_URL``'s server (dropped after);
  without a server the PostgreSQL case skips, unless ``CI`` is set: then it fails.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sessionfold.store.engine import create_store_engine

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A fresh database of each backend (PostgreSQL: one made for this test, dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    admin_url = os.environ.get("SF_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL)
    admin = create_store_engine(admin_url, pool_size=1).execution_options(
        isolation_level="AUTOCOMMIT")
    name = f"sf_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as exc:
        admin.dispose()
        if os.environ.get("CI"):
            pytest.fail(f"no PostgreSQL at {admin_url}: {exc}")
        pytest.skip(f"no PostgreSQL at {admin_url}")
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
