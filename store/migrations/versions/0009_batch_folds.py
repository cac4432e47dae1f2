"""sessions.batch and sessions.batch_deadline: a fold waiting on a provider's batch API.

- ``batch``: the pending fold (the provider and its batch id, the claim it holds, the inputs its
  visit is made again with once the answer is in), as the runtime wrote it; NULL when no fold
  waits. While it is set the scheduler plans no other fold of the session, and the claim's lease
  runs to the batch's deadline, so no worker takes the claim over as abandoned.
- ``batch_deadline``: when the fold stops waiting (the batch is cancelled and the summarizer
  called at once); indexed, so the scheduler's sweep finds the pending folds without reading
  every session.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Frozen here rather than imported from schema.py: a migration must not change when the code does.
UTCDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Native ADD COLUMN on both backends: batch mode would rebuild ``sessions`` on SQLite, and
    # dropping it deletes every child row by cascade (see 0005).
    op.add_column("sessions", sa.Column("batch", sa.JSON, nullable=True))
    op.add_column("sessions", sa.Column("batch_deadline", UTCDateTime, nullable=True))
    op.create_index("ix_sessions_batch_deadline", "sessions", ["batch_deadline"])


def downgrade() -> None:
    op.drop_index("ix_sessions_batch_deadline", table_name="sessions")
    # Native DROP COLUMN (SQLite 3.35+), never batch mode's table rebuild (see upgrade).
    op.execute("ALTER TABLE sessions DROP COLUMN batch_deadline")
    op.execute("ALTER TABLE sessions DROP COLUMN batch")
