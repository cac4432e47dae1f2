"""sessions.incarnation: a random number per created session.

Window item versions are session revisions, which restart at 0 when a session id is deleted and
created again. Readers that cache decoded items by ``(session, start_seq, version)`` key them by
the incarnation too, so a re-created session never hits the cache of its predecessor.

Revision ID: 0002
Revises: 0001
Create Date: 2025-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("incarnation", sa.BigInteger, nullable=False,
                                   server_default="0"))
    # Existing sessions each get their own random incarnation (62 bits, positive).
    if op.get_bind().dialect.name == "sqlite":
        op.execute("UPDATE sessions SET incarnation = abs(random() >> 2)")
    else:
        op.execute("UPDATE sessions SET incarnation = "
                   "floor(random() * 4611686018427387903)::bigint")


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("incarnation")
