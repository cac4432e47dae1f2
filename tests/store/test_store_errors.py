"""Database errors leave the store as StoreError that never carry the statement's values.

Workers log store errors with their traceback, and the chained SQLAlchemy error would otherwise
print the statement's parameters (session ids, message content) and the server's DETAIL line
(PostgreSQL's "Failing row contains (...)" repeats the row).
"""

from __future__ import annotations

import logging
import traceback

import pytest
from sessionfold.core.errors import StoreError
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from store_helpers import user

SECRET_SID = "sid-4f1c-private"
SECRET_TEXT = "the customer's card is 4111-1111-1111-1111"


def _refuse_ledger_inserts(store: SessionStore) -> None:
    """Make the database itself reject every ledger insert (a failure no validation catches)."""
    with store.engine.begin() as conn:
        if store.engine.dialect.name == "sqlite":
            conn.exec_driver_sql("CREATE TRIGGER test_refuse BEFORE INSERT ON ledger "
                                 "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
        else:
            conn.exec_driver_sql("ALTER TABLE ledger ADD CONSTRAINT test_refuse "
                                 "CHECK (seq < 0) NOT VALID")


def test_a_failing_insert_logs_the_statement_shape_but_no_parameter_values(
        fresh_url: str, caplog: pytest.LogCaptureFixture) -> None:
    store = SessionStore.from_url(fresh_url)
    try:
        store.migrate()
        store.create_session(SECRET_SID, FoldPolicy(budget_tokens=4000))
        _refuse_ledger_inserts(store)
        with pytest.raises(StoreError, match="rolled back") as info:
            store.append(SECRET_SID, [user(SECRET_TEXT)])
        with caplog.at_level(logging.ERROR):
            logging.getLogger("sessionfold.test").error("append failed", exc_info=info.value)
    finally:
        store.close()
    logged = caplog.text
    shown = "".join(traceback.format_exception(info.value))
    assert "INSERT INTO ledger" in shown  # the shape of the statement is kept ...
    for text in (logged, shown, str(info.value)):
        assert SECRET_SID not in text  # ... its values are not, nor the server's echo of them
        assert "4111-1111" not in text
