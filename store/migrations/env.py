"""Alembic environment of the session store.

``sessionfold migrate`` (:func:`sessionfold.store.migrate.upgrade`) runs Alembic in-process and
hands over an open connection through ``config.attributes["connection"]``, so migrations run on
the same engine (and, on SQLite, the same ``BEGIN`` handling) as the store. Run by hand without
one, it connects to the config's ``sqlalchemy.url``; the store reads no environment, so without
that it stops and says to run ``sessionfold migrate`` (which reads ``DATABASE_URL``).
"""

from __future__ import annotations

from alembic import context
from sessionfold.store.engine import create_store_engine
from sessionfold.store.schema import VERSION_TABLE, is_declared, metadata
from sqlalchemy.engine import Connection


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        # The search index's backend DDL (FTS5 tables, the tsvector column) is not in metadata.
        include_name=is_declared,
        # SQLite cannot ALTER most things in place: Alembic's batch mode rebuilds the table.
        render_as_batch=connection.dialect.name == "sqlite",
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database to migrate: set sqlalchemy.url, or run "
                         "`sessionfold migrate` (DATABASE_URL, else the embedded SQLite file)")
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("sessionfold migrations run online only: use `sessionfold migrate`")
run_migrations_online()
