"""Short transactions on the store's engine, with database errors mapped where they enter.

Every public store operation is one short transaction opened here:

- :meth:`Database.write` opens a write transaction. On SQLite it starts with ``BEGIN IMMEDIATE``
  (the database-wide write lock, taken up front, see :mod:`.engine`); on PostgreSQL the caller
  locks the session row it changes (``SELECT … FOR NO KEY UPDATE``) before reading anything it
  decides on, so two writers of one session queue instead of interleaving.
- :meth:`Database.read` opens a read transaction: a consistent snapshot on SQLite (deferred
  ``BEGIN`` under WAL); on PostgreSQL ``snapshot=True`` asks for REPEATABLE READ when one read
  spans several statements.

SQLAlchemy errors become :class:`~sessionfold.core.errors.StoreError` (the transaction was
rolled back, nothing of it was written). The schema is checked once per process and engine, on
first use: the store refuses to run on an unmigrated or newer schema.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from sessionfold.core.errors import SessionfoldError, StoreError
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from .engine import WRITE_OPTION
from .migrate import check_schema

__all__ = ["Clock", "Database", "utc_now"]

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class Database:
    """The engine plus the clock the store stamps rows with (injectable for lease tests)."""

    def __init__(self, engine: Engine, *, clock: Clock = utc_now) -> None:
        self.engine = engine
        self.clock = clock
        self.sqlite = engine.dialect.name == "sqlite"
        self._checked = False
        self._check_lock = threading.Lock()

    def now(self) -> datetime:
        return self.clock()

    def ensure_schema(self) -> None:
        if self._checked:
            return
        with self._check_lock, self.mapped_errors(), self.engine.connect() as conn:
            check_schema(conn)
            self._checked = True

    def forget_schema(self) -> None:
        """Check the schema again on next use (after a migration)."""
        self._checked = False

    @contextmanager
    def mapped_errors(self) -> Iterator[None]:
        """Translate SQLAlchemy/driver errors into StoreError; sessionfold's own pass through."""
        try:
            yield
        except SessionfoldError:
            raise
        except sa_exc.SQLAlchemyError as exc:
            raise StoreError(_describe(exc)) from exc

    @contextmanager
    def write(self) -> Iterator[Connection]:
        self.ensure_schema()
        with self.mapped_errors(), self.engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                yield conn

    @contextmanager
    def read(self, *, snapshot: bool = False) -> Iterator[Connection]:
        self.ensure_schema()
        with self.mapped_errors(), self.engine.connect() as conn:
            if snapshot and not self.sqlite:
                conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn


def _describe(exc: sa_exc.SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None)
    detail = str(orig) if orig is not None else str(exc)
    detail = detail.strip().splitlines()[0] if detail.strip() else type(exc).__name__
    kind = "connection lost" if isinstance(exc, sa_exc.DBAPIError) and \
        exc.connection_invalidated else type(orig or exc).__name__
    return f"session store: {kind}: {detail}; the transaction was rolled back"
