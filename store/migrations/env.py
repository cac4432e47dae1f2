"""Alembic environment of the session store.

``sessionfold migrate`` (:func:`sessionfold.store.migrate.upgrade`) runs Alembic in-process and
hands over an open connection through ``config.attributes["connection"]``, so migrations run on
the same engine (and, on SQLite, the same ``BEGIN`` handling) as the store. Run by hand without
one, it connects to ``DATABASE_URL`` (or the default SQLite file).
"""

from __future__ import annotations

from alembic import context
from sessionfold.store.engine import create_store_engine, database_url
from sessionfold.store.schema import VERSION_TABLE, metadata
from sqlalchemy.engine import Connection


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
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
    engine = create_store_engine(context.config.get_main_option("sqlalchemy.url")
                                 or database_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("sessionfold migrations run online only: use `sessionfold migrate`")
run_migrations_online()
