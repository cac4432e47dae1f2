"""sessions.calls and sessions.fold_lag_calls: how long a session has lived, and how late its
folds land, both in model calls.

- ``calls``: the assistant messages the agent appended (recall exchanges not counted): one per
  model call. A priced fold is made only if it pays back before the session is expected to
  end, and a session's age is that expectation's prior (a session that has made n calls is
  expected to make about n more).
- ``fold_lag_calls``: a running mean of the calls a background fold's session made while the
  fold ran (between its claim and its commit): the planner folds that much earlier, so a slow
  summarizer's folds still land before the window reaches the budget. NULL until a background
  fold has landed.

The existing rows' ``calls`` are counted from their ledgers (an assistant message the agent
appended; a message discarded under ``retain="discard"`` is no longer there to count).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Native ADD COLUMN on both backends: batch mode would rebuild ``sessions`` on SQLite, and
    # dropping it deletes every child row by cascade (see 0005).
    op.add_column("sessions", sa.Column("calls", sa.BigInteger, nullable=False,
                                        server_default="0"))
    op.add_column("sessions", sa.Column("fold_lag_calls", sa.Float, nullable=True))
    sessions = sa.table("sessions", sa.column("id", sa.String), sa.column("calls", sa.BigInteger))
    ledger = sa.table("ledger", sa.column("session_id", sa.String),
                      sa.column("message", sa.JSON), sa.column("origin", sa.String))
    counted = (sa.select(sa.func.count())
               .where(ledger.c.session_id == sessions.c.id, ledger.c.origin == "agent",
                      ledger.c.message["role"].as_string() == "assistant")
               .scalar_subquery())
    op.execute(sessions.update().values(calls=counted))


def downgrade() -> None:
    # Native DROP COLUMN (SQLite 3.35+), never batch mode's table rebuild (see upgrade).
    op.execute("ALTER TABLE sessions DROP COLUMN fold_lag_calls")
    op.execute("ALTER TABLE sessions DROP COLUMN calls")
