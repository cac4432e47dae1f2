"""From a database URL to a configured SQLAlchemy engine.

Two backends:

- **SQLite** (the embedded default): WAL journal (readers never block the writer), a busy timeout
  (a second writer waits instead of failing), and write transactions opened with ``BEGIN
  IMMEDIATE``. A deferred transaction that reads and then writes can fail with ``SQLITE_BUSY``
  *despite* the busy timeout (SQLite cannot upgrade a read lock while another writer holds the
  reserved lock, so it gives up at once); taking the write lock up front avoids that. The stdlib
  driver's legacy transaction handling would emit its own ``BEGIN`` (deferred, and only before
  DML), so we switch it off and emit ``BEGIN`` ourselves, as SQLAlchemy's SQLite documentation
  recommends ("Using SQLAlchemy to emit BEGIN in lieu of SQLite's transaction control").
- **PostgreSQL** through psycopg 3 (``postgresql+psycopg://``). ``postgres://`` and
  ``postgresql://`` URLs are accepted and mapped to the psycopg driver, which is the
  ``postgres`` extra: without it the engine raises :class:`MissingExtraError`.

The store never reads the environment: the URL is an argument. Which URL a process uses is
decided from its settings at the entry point (``DATABASE_URL``, else the SQLite file
``sessionfold.db`` in the data dir: :attr:`sessionfold.runtime.settings.Settings.store_url`,
built with :func:`default_sqlite_url`). The file's path is made absolute, so that a worker that
forks or changes directory still opens the same file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError, MissingExtraError
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError

from .codec import decode_json

__all__ = [
    "DEFAULT_SQLITE_PATH",
    "WRITE_OPTION",
    "create_store_engine",
    "default_sqlite_url",
    "is_sqlite",
    "json_dumps",
    "normalize_url",
]

#: The data dir when none is given: relative to the working folder, made absolute when the URL
#: is built (the settings' default too, ``SESSIONFOLD_DATA_DIR`` unset).
DEFAULT_DATA_DIR = Path(".sessionfold")
#: The embedded store's file name inside the data dir.
SQLITE_FILE_NAME = "sessionfold.db"
DEFAULT_SQLITE_PATH = DEFAULT_DATA_DIR / SQLITE_FILE_NAME
#: Execution option marking a connection whose next transaction writes (``BEGIN IMMEDIATE``).
WRITE_OPTION = "sessionfold_write"
#: How long a SQLite writer waits for the write lock before giving up (milliseconds).
SQLITE_BUSY_TIMEOUT_MS = 30_000


def default_sqlite_url(data_dir: str | Path = DEFAULT_DATA_DIR) -> str:
    """The embedded store of ``data_dir``: ``<data dir>/sessionfold.db``, absolute.

    The settings pass their ``data_dir`` (``SESSIONFOLD_DATA_DIR``, else ``./.sessionfold``), so
    an agent, a worker and ``sessionfold migrate`` started with the same environment in the same
    folder open the same file. Without an argument: ``./.sessionfold`` in the working folder.
    """
    return f"sqlite:///{(Path.cwd() / Path(data_dir).expanduser() / SQLITE_FILE_NAME).resolve()}"


def normalize_url(url: str | URL) -> URL:
    """Parse ``url`` and pin the driver: psycopg 3 for PostgreSQL, pysqlite for SQLite.

    A relative SQLite path is made absolute (against the working folder) here, once, so that
    processes that fork or change directory later all open the same file.
    """
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError as exc:
        raise InvalidInputError(f"not a database URL: {_redact(str(url))} ({exc})") from None
    backend = parsed.get_backend_name()
    if backend in ("postgres", "postgresql"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            database = str(Path(database).expanduser().resolve())
        return parsed.set(drivername="sqlite+pysqlite", database=database)
    raise InvalidInputError(
        f"unsupported database {backend!r} in {_redact(str(url))}; sessionfold supports "
        "sqlite:///PATH and postgresql+psycopg://USER@HOST/DB"
    )


def is_sqlite(engine: Engine | Connection) -> bool:
    return engine.dialect.name == "sqlite"


def json_dumps(value: Any) -> str:
    # Compact separators: the ledger holds every message ever appended.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def create_store_engine(url: str | URL, *, echo: bool = False, pool_size: int = 8) -> Engine:
    """An engine for ``url`` with the backend's concurrency settings applied (see module doc).

    JSON columns decode with pydantic-core's parser (about twice as fast as ``json.loads`` on
    window-sized payloads: reading a window is the hot path of every app server), falling back
    to the standard library's for documents nested too deep for it (:func:`.codec.decode_json`).

    ``hide_parameters``: an error (and ``echo``) shows a statement's shape, never its values;
    they hold session ids and message content, and workers log store errors with tracebacks.
    """
    parsed = normalize_url(url)
    common: dict[str, Any] = {
        "echo": echo,
        "hide_parameters": True,
        "json_serializer": json_dumps,
        "json_deserializer": decode_json,
    }
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            parsed,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
            pool_size=pool_size,
            max_overflow=pool_size,
            **common,
        )
        _install_sqlite_transactions(engine)
        return engine
    try:
        return sa.create_engine(
            parsed,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_pre_ping=True,
            **common,
        )
    except ModuleNotFoundError as exc:  # the dialect imports its driver here
        missing = MissingExtraError.of_missing(exc, "a PostgreSQL store")
        if missing is None:
            raise
        raise missing from None


def _switch_to_wal(dbapi_connection: Any, cursor: Any) -> None:
    """``PRAGMA journal_mode=WAL``, retried while another process holds the lock it needs.

    Switching a new file to WAL takes an exclusive lock, and SQLite answers "database is
    locked" at once there rather than wait for the busy timeout when another connection holds
    a shared lock (eight processes starting on one new file at the same moment hit it about
    one time in ten). The switch is made once per file; every later one finds WAL set.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except dbapi_connection.OperationalError as exc:  # (the driver's, via DB-API)
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _install_sqlite_transactions(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Stop the driver from emitting its own (deferred, DML-only) BEGIN; _on_begin does it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            _switch_to_wal(dbapi_connection, cursor)
            # NORMAL is durable across application crashes in WAL mode (only an OS crash or power
            # loss can drop the last commits), and much cheaper than FULL per commit.
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front (see module doc); readers stay deferred so that,
        # under WAL, they read a snapshot without waiting for writers.
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"
