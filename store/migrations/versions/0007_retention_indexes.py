"""Retention indexes: what the store's prune (``sessionfold prune``) looks its rows up by.

- ``ix_append_keys_created``: append keys older than the retention age, oldest first.
- ``ix_records_visits``: a partial index over the no-op visits' records (``outcome <>
  'folded'``) by (session_id, id, created_at): per session, how many and how old, and the
  newest N, without reading the records or stepping over the folds' ones.
- ``ix_dead_letters_session``: ``delete_session`` removes the session's dead letters too.

No row changes. Each index is created ``IF NOT EXISTS``: on a large PostgreSQL store, where
building an index in the migration's transaction holds off writes to its table until it is
built, create them first with ``CREATE INDEX CONCURRENTLY`` under the same names and
definitions (docs/internals.md, "Retention"); the migration then finds them there.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_NOT_FOLDED = sa.text("outcome <> 'folded'")


def upgrade() -> None:
    op.create_index("ix_append_keys_created", "append_keys", ["created_at"], if_not_exists=True)
    op.create_index("ix_records_visits", "compaction_records", ["session_id", "id", "created_at"],
                    sqlite_where=_NOT_FOLDED, postgresql_where=_NOT_FOLDED, if_not_exists=True)
    op.create_index("ix_dead_letters_session", "dead_letters", ["session_id"],
                    if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_dead_letters_session", table_name="dead_letters")
    op.drop_index("ix_records_visits", table_name="compaction_records")
    op.drop_index("ix_append_keys_created", table_name="append_keys")
