"""Migrations create exactly the schema the code declares; the store refuses any other schema."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sessionfold.core.errors import SchemaError
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SCHEMA_REVISION, SessionStore
from sessionfold.store.engine import normalize_url
from sessionfold.store.migrate import head_revision, upgrade
from sessionfold.store.schema import VERSION_TABLE, is_declared, metadata


def test_the_code_runs_against_the_newest_migration() -> None:
    assert head_revision() == SCHEMA_REVISION


def _index_names(store: SessionStore) -> set[str]:
    query = ("SELECT name FROM sqlite_master WHERE type = 'index'"
             if store.engine.dialect.name == "sqlite" else "SELECT indexname FROM pg_indexes")
    with store.engine.connect() as conn:
        return set(conn.exec_driver_sql(query).scalars())


@pytest.mark.filterwarnings("ignore:.*expression-based index")
def test_migrate_creates_the_declared_schema_and_is_idempotent(fresh_url: str) -> None:
    store = SessionStore.from_url(fresh_url)
    try:
        assert store.migrate() == SCHEMA_REVISION
        assert store.migrate() == SCHEMA_REVISION  # a second run changes nothing
        assert store.check_schema() == SCHEMA_REVISION
        with store.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE,
                                                             "include_name": is_declared})
            diffs = [d for d in compare_metadata(context, metadata)
                     if not (isinstance(d, tuple) and d[0] in ("add_index", "remove_index")
                             and d[1].name == "ix_sessions_over_budget")]
        # The expression index cannot be compared by Alembic; its presence is checked below.
        assert diffs == []
        assert "ix_sessions_over_budget" in _index_names(store)
        store.create_session("s", FoldPolicy(budget_tokens=4000))
        assert store.get_session("s").revision == 0
    finally:
        store.close()


def test_an_unmigrated_database_is_refused_with_what_to_do(fresh_url: str) -> None:
    store = SessionStore.from_url(fresh_url)
    try:
        with pytest.raises(SchemaError, match="run `sessionfold migrate`"):
            store.check_schema()
        with pytest.raises(SchemaError, match="no sessionfold schema"):
            store.create_session("s", FoldPolicy(budget_tokens=4000))
        with pytest.raises(SchemaError):
            store.read_window("s")
    finally:
        store.close()


def _set_version(url: str, version: str) -> None:
    engine = sa.create_engine(normalize_url(url))
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = :v"), {"v": version})
    engine.dispose()


def test_a_newer_schema_is_refused_and_names_the_way_out(fresh_url: str) -> None:
    SessionStore.from_url(fresh_url).migrate()
    _set_version(fresh_url, "9999")
    store = SessionStore.from_url(fresh_url)
    try:
        with pytest.raises(SchemaError, match="newer than this sessionfold"):
            store.list_sessions()
    finally:
        store.close()


def test_a_schema_without_a_version_row_is_refused(fresh_url: str) -> None:
    SessionStore.from_url(fresh_url).migrate()
    engine = sa.create_engine(normalize_url(fresh_url))
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {VERSION_TABLE}"))
    engine.dispose()
    store = SessionStore.from_url(fresh_url)
    try:
        with pytest.raises(SchemaError, match="sessionfold migrate"):
            store.list_sessions()
    finally:
        store.close()


def test_an_older_schema_is_refused_until_migrated_and_keeps_its_data(fresh_url: str) -> None:
    store = SessionStore.from_url(fresh_url)
    try:
        assert upgrade(store.engine, "0001") == "0001"
        now = datetime.now(UTC)
        with store.engine.begin() as conn:  # a session written by the 0001 code
            conn.execute(sa.text(
                "INSERT INTO sessions (id, policy, system, system_tokens, revision, "
                "fold_revision, fold_epoch, paused, next_seq, tail_tool_use_ids, window_tokens, "
                "pending_tokens, calibration, current_tokens, trigger_tokens, created_at, "
                "updated_at) VALUES ('old', :policy, 'sys', 5, 0, 0, 0, :f, 0, '[]', 0, 0, '{}', "
                "5, 3400, :now, :now)"),
                {"policy": '{"budget_tokens": 4000}', "f": False, "now": now})
        with pytest.raises(SchemaError, match=rf"revision 0001, this sessionfold needs "
                                              rf"{SCHEMA_REVISION}; run `sessionfold migrate`"):
            store.get_session("old")
        assert store.migrate() == SCHEMA_REVISION
        assert store.get_session("old").system == "sys"
        assert store.get_session("old").abandoned_folds == 0  # 0003's column, defaulted
        with store.engine.connect() as conn:
            incarnation = conn.execute(sa.text(
                "SELECT incarnation FROM sessions WHERE id = 'old'")).scalar_one()
        assert incarnation > 0
    finally:
        store.close()
