"""The session store: sessions, ledger, window items, folds, records, keys, latches, dead letters.

Revision ID: 0001
Revises:
Create Date: 2025-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.String(255)
_SERIAL = sa.BigInteger().with_variant(sa.Integer, "sqlite")
# Frozen here rather than imported from schema.py: a migration must not change when the code does.
UTCDateTime = sa.DateTime(timezone=True)


def _session_fk() -> sa.ForeignKey:
    return sa.ForeignKey("sessions.id", ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("policy", sa.JSON, nullable=False),
        sa.Column("system", sa.Text, nullable=False),
        sa.Column("system_tokens", sa.Integer, nullable=False),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("fold_revision", sa.BigInteger, nullable=False),
        sa.Column("fold_epoch", sa.BigInteger, nullable=False),
        sa.Column("claimed_by", sa.String(255), nullable=True),
        sa.Column("claim_expires_at", UTCDateTime, nullable=True),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("next_seq", sa.BigInteger, nullable=False),
        sa.Column("tail_tool_use_ids", sa.JSON, nullable=False),
        sa.Column("window_tokens", sa.BigInteger, nullable=False),
        sa.Column("measured_tokens", sa.BigInteger, nullable=True),
        sa.Column("measured_seq", sa.BigInteger, nullable=True),
        sa.Column("measured_revision", sa.BigInteger, nullable=True),
        sa.Column("pending_tokens", sa.BigInteger, nullable=False),
        sa.Column("calibration", sa.JSON, nullable=False),
        sa.Column("current_tokens", sa.BigInteger, nullable=False),
        sa.Column("trigger_tokens", sa.BigInteger, nullable=False),
        sa.Column("last_visit_outcome", sa.String(32), nullable=True),
        sa.Column("last_visit_tokens", sa.BigInteger, nullable=True),
        sa.Column("last_visit_at", UTCDateTime, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )
    op.create_index(
        "ix_sessions_over_budget", "sessions",
        ["paused", sa.text("(current_tokens - trigger_tokens)")],
    )

    op.create_table(
        "ledger",
        sa.Column("session_id", _ID, _session_fk(), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("message", sa.JSON, nullable=True),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("appended_at", UTCDateTime, nullable=False),
        sa.Column("discarded_at", UTCDateTime, nullable=True),
    )

    op.create_table(
        "window_items",
        sa.Column("session_id", _ID, _session_fk(), primary_key=True),
        sa.Column("start_seq", sa.BigInteger, primary_key=True),
        sa.Column("end_seq", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("edits", sa.JSON, nullable=False),
        sa.Column("message", sa.JSON, nullable=False),
    )

    op.create_table(
        "folds",
        sa.Column("id", _SERIAL, primary_key=True, autoincrement=True),
        sa.Column("session_id", _ID, _session_fk(), nullable=False),
        sa.Column("start_seq", sa.BigInteger, nullable=False),
        sa.Column("end_seq", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("message_count", sa.Integer, nullable=False),
        sa.Column("fingerprint", sa.String(128), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("usage", sa.JSON, nullable=False),
        sa.Column("retained", sa.Boolean, nullable=False),
        sa.Column("lost_identifiers", sa.JSON, nullable=False),
        sa.Column("chars_before", sa.BigInteger, nullable=False),
        sa.Column("chars_after", sa.BigInteger, nullable=False),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("discarded_at", UTCDateTime, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.UniqueConstraint("session_id", "start_seq", "end_seq", name="uq_folds_session_span"),
    )
    op.create_index("ix_folds_session_job", "folds", ["session_id", "job_id"])

    op.create_table(
        "compaction_records",
        sa.Column("id", _SERIAL, primary_key=True, autoincrement=True),
        sa.Column("session_id", _ID, _session_fk(), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("epoch", sa.BigInteger, nullable=True),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("record", sa.JSON, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_records_session", "compaction_records", ["session_id", "id"])
    op.create_index("ix_records_session_job", "compaction_records", ["session_id", "job_id"])

    op.create_table(
        "append_keys",
        sa.Column("session_id", _ID, _session_fk(), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("first_seq", sa.BigInteger, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )

    op.create_table(
        "refusal_latches",
        sa.Column("session_id", _ID, _session_fk(), primary_key=True),
        sa.Column("fingerprint", sa.String(128), primary_key=True),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )

    op.create_table(
        "dead_letters",
        sa.Column("id", _SERIAL, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("session_id", _ID, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_dead_letters_created", "dead_letters", ["created_at"])


def downgrade() -> None:
    for table in ("dead_letters", "refusal_latches", "append_keys", "compaction_records",
                  "folds", "window_items", "ledger", "sessions"):
        op.drop_table(table)
