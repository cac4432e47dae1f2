"""Applying the migrations, and refusing to run on a schema this code was not written for.

Alembic runs in-process with a :class:`~alembic.config.Config` whose ``script_location`` points
into the installed package (``sessionfold.store:migrations``), so ``sessionfold migrate`` works from
a plain ``pip install`` without an ``alembic.ini``.
"""

from __future__ import annotations

from functools import lru_cache

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sessionfold.core.errors import SchemaError
from sqlalchemy.engine import Connection, Engine

from .engine import WRITE_OPTION, is_sqlite
from .schema import SCHEMA_REVISION, VERSION_TABLE

__all__ = ["alembic_config", "check_schema", "current_revision", "head_revision", "upgrade"]

SCRIPT_LOCATION = "sessionfold.store:migrations"
#: PostgreSQL advisory lock key of sessionfold's migrations (a fixed 63-bit number, so another
#: application's advisory locks in the same database are unlikely to collide with it).
MIGRATION_LOCK_KEY = 0x5E55_10F0_1D00_0001


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for the packaged migrations, optionally bound to ``connection``."""
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    head = _script().get_current_head()
    assert head is not None, "the packaged migrations have no head revision"
    return head


def current_revision(connection: Connection) -> str | None:
    """The schema revision recorded in the database, or None when it has none."""
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    rows = connection.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").all()
    if len(rows) != 1:
        return None
    return str(rows[0][0])


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Apply every pending migration in one transaction; return the revision reached.

    Any number of processes may call this at once (every agent process migrates the embedded
    SQLite file on start): the transaction takes the migration lock before it reads the schema
    version, so the first one migrates and the others, once it committed, find nothing to do.
    """
    with engine.connect() as conn:
        _begin_locked(conn)
        # Alembic runs inside the transaction begun here (it begins none of its own).
        command.upgrade(alembic_config(conn), revision)
        conn.commit()
        reached = current_revision(conn)
        conn.rollback()
    assert reached is not None
    return reached


def _begin_locked(conn: Connection) -> None:
    """Begin the migration's transaction holding the database's migration lock.

    SQLite: ``BEGIN IMMEDIATE``, the write lock taken up front. A deferred transaction reads the
    version table, then fails at its first write with ``database is locked`` when another
    process got there first: SQLite cannot upgrade a read lock while another writer holds
    the reserved lock, so the busy timeout never applies. Taken up front, the lock is waited
    for (busy timeout). PostgreSQL: a transaction-scoped advisory lock, released by the
    commit; without it concurrent ``CREATE TABLE`` statements collide in the catalog.
    """
    if is_sqlite(conn):
        conn.execution_options(**{WRITE_OPTION: True})
        conn.begin()
        return
    conn.begin()
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})


def check_schema(connection: Connection) -> str:
    """Raise SchemaError unless the database is at exactly the revision this code needs."""
    found = current_revision(connection)
    if found == SCHEMA_REVISION:
        return found
    url = connection.engine.url.render_as_string(hide_password=True)
    if found is None:
        raise SchemaError(
            f"the database at {url} has no sessionfold schema (no {VERSION_TABLE} table); "
            "run `sessionfold migrate` to create it"
        )
    known = {rev.revision for rev in _script().walk_revisions()}
    if found in known:
        raise SchemaError(
            f"the database at {url} has schema revision {found}, this sessionfold needs "
            f"{SCHEMA_REVISION}; run `sessionfold migrate` to upgrade it"
        )
    raise SchemaError(
        f"the database at {url} has schema revision {found}, newer than this sessionfold knows "
        f"(it needs {SCHEMA_REVISION}); upgrade sessionfold, or point DATABASE_URL elsewhere"
    )
