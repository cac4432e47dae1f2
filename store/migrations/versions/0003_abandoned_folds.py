"""sessions.abandoned_folds: claims taken over from a holder that never finished.

A fold whose worker dies mid-visit leaves its claim behind until the lease expires; the next
claim takes it over. Counting those takeovers per session (not per broker job, whose id changes
every time the scheduler enqueues again) lets a claim refuse a session whose fold keeps killing
its worker, so it can be dead-lettered instead of retried for ever.

Revision ID: 0003
Revises: 0002
Create Date: 2025-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("abandoned_folds", sa.Integer, nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("abandoned_folds")
