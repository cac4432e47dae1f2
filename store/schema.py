"""The tables of the session store (SQLAlchemy Core), mirrored by the Alembic migrations.

::

    sessions          one row per session: policy, system prompt, window revision, fold fence
                      (fold_epoch + claim), measured usage, calibration, current_tokens
    ledger            (session_id, seq) → message: append-only (retain="discard" blanks content)
    window_items      (session_id, start_seq) → item of the window, with a version for the CAS
    folds             one row per folded span, unique on (session_id, start_seq, end_seq)
    compaction_records  one row per over-budget visit, whatever its outcome
    append_keys       (session_id, key) → the seqs a keyed append wrote (idempotent retries)
    refusal_latches   (session_id, fingerprint): spans refused before, not to be paid for again
    dead_letters      fold jobs given up on, with their payload

``SCHEMA_REVISION`` is the Alembic head this code runs against; the store refuses any other.
The version table is ``sessionfold_schema_version`` (not Alembic's default name), so a database
shared with another Alembic-managed application keeps both histories apart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

__all__ = [
    "SCHEMA_REVISION",
    "VERSION_TABLE",
    "UTCDateTime",
    "append_keys",
    "compaction_records",
    "dead_letters",
    "folds",
    "ledger",
    "metadata",
    "refusal_latches",
    "sessions",
    "window_items",
]

SCHEMA_REVISION = "0003"
VERSION_TABLE = "sessionfold_schema_version"


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    SQLite has no timezone type: it stores the naive UTC value and we attach UTC on the way out.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the session store; use UTC-aware values")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# JSON, not JSONB, on PostgreSQL: json keeps the text as written (key order, and "\u0000" in tool
# output, which jsonb rejects), and we never query inside messages.
JSONDoc = sa.JSON()
SessionId = sa.String(255)

metadata = sa.MetaData()

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", SessionId, primary_key=True),
    sa.Column("policy", JSONDoc, nullable=False),
    sa.Column("system", sa.Text, nullable=False),
    sa.Column("system_tokens", sa.Integer, nullable=False),
    # Bumps on every window change (append or fold); app servers cache windows by it.
    sa.Column("revision", sa.BigInteger, nullable=False),
    # Revision the last fold produced: usage reports built on older windows are ignored.
    sa.Column("fold_revision", sa.BigInteger, nullable=False),
    # The fence: raised by every claim; a commit must carry the epoch it claimed.
    sa.Column("fold_epoch", sa.BigInteger, nullable=False),
    sa.Column("claimed_by", sa.String(255), nullable=True),
    sa.Column("claim_expires_at", UTCDateTime, nullable=True),
    sa.Column("paused", sa.Boolean, nullable=False),
    sa.Column("next_seq", sa.BigInteger, nullable=False),
    # tool_use ids of the last ledger message, so an append can check tool pairing against it
    # without reading that message (it may be a 400 k-token tool output).
    sa.Column("tail_tool_use_ids", JSONDoc, nullable=False),
    sa.Column("window_tokens", sa.BigInteger, nullable=False),
    sa.Column("measured_tokens", sa.BigInteger, nullable=True),
    sa.Column("measured_seq", sa.BigInteger, nullable=True),
    sa.Column("measured_revision", sa.BigInteger, nullable=True),
    # Estimate of the window items after measured_seq (appended since the last report).
    sa.Column("pending_tokens", sa.BigInteger, nullable=False),
    sa.Column("calibration", JSONDoc, nullable=False),
    sa.Column("current_tokens", sa.BigInteger, nullable=False),
    sa.Column("trigger_tokens", sa.BigInteger, nullable=False),
    sa.Column("last_visit_outcome", sa.String(32), nullable=True),
    sa.Column("last_visit_tokens", sa.BigInteger, nullable=True),
    sa.Column("last_visit_at", UTCDateTime, nullable=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    # Random per created session: with (start_seq, version) it names a window item uniquely
    # across a delete and re-create of the same id (versions restart), for readers' caches.
    sa.Column("incarnation", sa.BigInteger, nullable=False, server_default="0"),
    # Claims taken over from a holder that never finished (its worker died mid-fold), in a row;
    # a finished visit, a commit or a resume sets it back to 0 (see claims.py).
    sa.Column("abandoned_folds", sa.Integer, nullable=False, server_default="0"),
)
# The scheduler's sweep: "current_tokens > trigger_tokens and not paused", most over first. An
# index on the difference makes it one index range scan on both backends.
sa.Index(
    "ix_sessions_over_budget",
    sessions.c.paused,
    (sessions.c.current_tokens - sessions.c.trigger_tokens),
)

ledger = sa.Table(
    "ledger",
    metadata,
    sa.Column("session_id", SessionId, sa.ForeignKey("sessions.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True),
    # NULL once discarded under retain="discard" (discarded_at says when).
    sa.Column("message", JSONDoc, nullable=True),
    sa.Column("tokens", sa.Integer, nullable=False),
    sa.Column("appended_at", UTCDateTime, nullable=False),
    sa.Column("discarded_at", UTCDateTime, nullable=True),
)

window_items = sa.Table(
    "window_items",
    metadata,
    sa.Column("session_id", SessionId, sa.ForeignKey("sessions.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("start_seq", sa.BigInteger, primary_key=True),
    sa.Column("end_seq", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    # The revision that wrote this row: a re-created item at the same start_seq never reuses a
    # version, so the fold commit's compare-and-set cannot be fooled (no ABA).
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("tokens", sa.Integer, nullable=False),
    # Small columns first, the message last: a read that skips messages it has cached (and the
    # fold commit's version check) never has to step over a message's bytes to reach them.
    sa.Column("edits", JSONDoc, nullable=False),
    sa.Column("message", JSONDoc, nullable=False),
)

folds = sa.Table(
    "folds",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
              autoincrement=True),
    sa.Column("session_id", SessionId, sa.ForeignKey("sessions.id", ondelete="CASCADE"),
              nullable=False),
    sa.Column("start_seq", sa.BigInteger, nullable=False),
    sa.Column("end_seq", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("message_count", sa.Integer, nullable=False),
    sa.Column("fingerprint", sa.String(128), nullable=False),
    sa.Column("model", sa.String(255), nullable=False),
    sa.Column("usage", JSONDoc, nullable=False),
    sa.Column("retained", sa.Boolean, nullable=False),
    sa.Column("lost_identifiers", JSONDoc, nullable=False),
    sa.Column("chars_before", sa.BigInteger, nullable=False),
    sa.Column("chars_after", sa.BigInteger, nullable=False),
    sa.Column("job_id", sa.String(255), nullable=True),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("discarded_at", UTCDateTime, nullable=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.UniqueConstraint("session_id", "start_seq", "end_seq", name="uq_folds_session_span"),
)
sa.Index("ix_folds_session_job", folds.c.session_id, folds.c.job_id)

compaction_records = sa.Table(
    "compaction_records",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
              autoincrement=True),
    sa.Column("session_id", SessionId, sa.ForeignKey("sessions.id", ondelete="CASCADE"),
              nullable=False),
    sa.Column("job_id", sa.String(255), nullable=True),
    sa.Column("epoch", sa.BigInteger, nullable=True),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("trigger", sa.String(16), nullable=False),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("record", JSONDoc, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
)
sa.Index("ix_records_session", compaction_records.c.session_id, compaction_records.c.id)
sa.Index("ix_records_session_job", compaction_records.c.session_id, compaction_records.c.job_id)

append_keys = sa.Table(
    "append_keys",
    metadata,
    sa.Column("session_id", SessionId, sa.ForeignKey("sessions.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("first_seq", sa.BigInteger, nullable=False),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
    sa.Column("revision", sa.BigInteger, nullable=False),
    # Digest of the appended messages: the same key with other messages is an error.
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
)

refusal_latches = sa.Table(
    "refusal_latches",
    metadata,
    sa.Column("session_id", SessionId, sa.ForeignKey("sessions.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("fingerprint", sa.String(128), primary_key=True),
    sa.Column("reason", sa.String(64), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
)

dead_letters = sa.Table(
    "dead_letters",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
              autoincrement=True),
    sa.Column("job_id", sa.String(255), nullable=False),
    # No foreign key: a dead letter outlives the session it was about.
    sa.Column("session_id", SessionId, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("payload", JSONDoc, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
)
sa.Index("ix_dead_letters_created", dead_letters.c.created_at)
