"""A connection killed in the middle of a fold commit leaves no half-written fold."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sessionfold.core.errors import StoreError
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from sessionfold.store.engine import create_store_engine
from store_helpers import check_window, plan, row_counts, turn, user

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_store(postgres_store_url: str) -> Any:
    engine = create_store_engine(postgres_store_url, pool_size=1)
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE sessions, ledger, window_items, folds, compaction_records,"
                             " append_keys, refusal_latches, dead_letters CASCADE")
    engine.dispose()
    store = SessionStore.from_url(postgres_store_url)
    yield store
    store.close()


def _terminate_before(store: SessionStore, admin: sa.Engine, marker: str) -> list[int]:
    """Kill this store's own backend (from another connection) just before the statement that
    contains ``marker`` runs: the transaction is then in the middle of its work."""
    killed: list[int] = []

    @sa.event.listens_for(store.engine, "before_cursor_execute")
    def _kill(conn: sa.Connection, cursor: Any, statement: str, *args: Any) -> None:
        if marker not in statement or killed:
            return
        pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        with admin.connect() as other:
            assert other.execute(sa.text("SELECT pg_terminate_backend(:pid)"),
                                 {"pid": pid}).scalar_one()
            # Wait until the server has really closed it (termination is asynchronous).
            for _ in range(200):
                alive = other.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": pid}).scalar_one()
                if not alive:
                    break
                other.execute(sa.text("SELECT pg_sleep(0.01)"))
        killed.append(pid)

    return killed


@pytest.mark.parametrize("marker", [
    "INSERT INTO folds",          # after the window items were swapped
    "UPDATE sessions SET revision",  # the last statement: everything else already done
])
def test_a_backend_killed_mid_commit_leaves_no_half_written_fold(
        pg_store: SessionStore, postgres_store_url: str, marker: str) -> None:
    store = pg_store
    store.create_session("a", FoldPolicy(budget_tokens=2000, keep_recent_turns=2))
    store.append("a", [user("task"), *[m for i in range(20) for m in turn(str(i))]])
    claim = store.claim("a", "job-1")
    result = plan(store, "a")
    assert result.spans
    before_rows = row_counts(store)
    before_window = store.read_window("a")
    before_info = store.get_session("a")

    admin = create_store_engine(postgres_store_url, pool_size=1)
    try:
        killed = _terminate_before(store, admin, marker)
        with pytest.raises(StoreError, match="rolled back"):
            store.commit_fold("a", result, epoch=claim.epoch,
                              incarnation=claim.incarnation, job_id="job-1")
        assert killed, "the commit never reached the statement the test kills it at"
    finally:
        admin.dispose()

    assert row_counts(store) == before_rows
    assert store.read_window("a") == before_window
    assert store.get_session("a") == before_info  # still claimed by job-1, same revision
    assert store.spans("a") == [] and store.records("a") == []
    # The job retries (same claim): the fold commits whole.
    done = store.commit_fold("a", result, epoch=claim.epoch,
                             incarnation=claim.incarnation, job_id="job-1")
    assert not done.duplicate and len(store.spans("a")) == len(result.spans)
    check_window(store, "a")
