"""Short transactions on the store's engine, with database errors mapped where they enter.

Every public store operation is one short transaction opened here:

- :meth:`Database.write` opens a write transaction. On SQLite it starts with ``BEGIN IMMEDIATE``
  (the database-wide write lock, taken up front, see :mod:`.engine`); on PostgreSQL the caller
  locks the session row it changes (``SELECT … FOR NO KEY UPDATE``) before reading anything it
  decides on, so two writers of one session queue instead of interleaving.
- :meth:`Database.read` opens a read transaction: a consistent snapshot on SQLite (deferred
  ``BEGIN`` under WAL); on PostgreSQL ``snapshot=True`` asks for REPEATABLE READ when one read
  spans several statements.

Two clocks: rows are stamped (``created_at``, ``appended_at`` …) with this host's clock, which
costs no round trip; leases are set and compared on the database's clock
(:meth:`Database.lease_now`), the one clock every worker shares, so a host whose clock runs
ahead cannot take over a live lease nor end one early. A test injects one clock for both.

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

__all__ = ["Clock", "Database", "LeaseClock", "database_now", "utc_now"]

Clock = Callable[[], datetime]
#: The time leases are set and compared with, read inside the caller's transaction.
LeaseClock = Callable[[Connection], datetime]

# SQLite's own clock (the host's: an SQLite file is shared by processes of one host only), UTC,
# to the millisecond.
_SQLITE_NOW = "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"
# clock_timestamp(), not now(): now() is when the transaction began, maybe before it waited for
# the session's row lock.
_POSTGRES_NOW = "SELECT clock_timestamp()"


def utc_now() -> datetime:
    """This host's clock, UTC."""
    return datetime.now(UTC)


def database_now(conn: Connection) -> datetime:
    """The database's clock, UTC and timezone-aware (one short statement)."""
    if conn.dialect.name == "sqlite":
        text = conn.exec_driver_sql(_SQLITE_NOW).scalar_one()
        return datetime.fromisoformat(str(text)).replace(tzinfo=UTC)
    value: datetime = conn.exec_driver_sql(_POSTGRES_NOW).scalar_one()
    return value.astimezone(UTC)


class Database:
    """The engine plus the store's clocks (see the module doc).

    ``clock``: inject one clock for stamps and leases alike (tests that move time); None, the
    default, stamps with this host's clock and takes lease times from the database's.
    """

    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock = clock
        self.sqlite = engine.dialect.name == "sqlite"
        self._checked = False
        self._check_lock = threading.Lock()

    def now(self) -> datetime:
        """The time rows are stamped with (no round trip)."""
        return self.clock() if self.clock is not None else utc_now()

    def lease_now(self, conn: Connection) -> datetime:
        """The time leases are set and compared with, read inside ``conn``'s transaction."""
        return self.clock() if self.clock is not None else database_now(conn)

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
            _drop_row_values(exc)
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


def _drop_row_values(exc: sa_exc.SQLAlchemyError) -> None:
    """Cut the driver's message to its first line before it is chained into a StoreError.

    The engine hides the statement's parameters (``hide_parameters``), but PostgreSQL's DETAIL
    line repeats them ("Failing row contains (...)", "Key (session_id, seq)=(...)"), and the
    chained error is printed with every logged traceback. The driver's structured diagnostics
    (``orig.diag``) stay for code that needs them.
    """
    # SQLAlchemy copied the driver's message into its own when it wrapped it: cut both.
    for error in (exc, getattr(exc, "orig", None)):
        if isinstance(error, BaseException) and len(error.args) == 1 \
                and isinstance(error.args[0], str):
            error.args = (error.args[0].strip().split("\n", 1)[0],)


def _describe(exc: sa_exc.SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None)
    detail = str(orig) if orig is not None else str(exc)
    detail = detail.strip().splitlines()[0] if detail.strip() else type(exc).__name__
    kind = "connection lost" if isinstance(exc, sa_exc.DBAPIError) and \
        exc.connection_invalidated else type(orig or exc).__name__
    return f"session store: {kind}: {detail}; the transaction was rolled back"
