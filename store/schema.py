"""The tables of the session store (SQLAlchemy Core), mirrored by the Alembic migrations.

::

    sessions          one row per session: policy, system prompt, window revision, fold fence
                      (fold_epoch + claim), measured usage, calibration, current_tokens
    ledger            (session_id, seq) → message: append-only (retain="discard" blanks content)
    window_items      (session_id, start_seq) → item of the window, with a version for the CAS
    folds             one row per folded span, unique on (session_id, start_seq, end_seq)
    compaction_records  one row per over-budget visit, whatever its outcome
    append_keys       (session_id, key) → the seqs a keyed append wrote (idempotent retries,
                      for as long as the retention rule keeps the key: see pruning.py)
    tool_use_ids      (session_id, id digest) → the seq whose tool_use took that id (unique ids)
    refusal_latches   (session_id, fingerprint): spans refused before, not to be paid for again
    dead_letters      fold jobs given up on, with their payload (deleted with their session)
    ledger_chunks     (session_id, seq, offset) → a chunk of a ledger message's searchable text
                      and its derived index words: the full-text index recall searches
    api_keys          the HTTP API's bearer keys: key id → tenant, admin, SHA-256 digest, revoked

``SCHEMA_REVISION`` is the Alembic head this code runs against; the store refuses any other.
The version table is ``sessionfold_schema_version`` (not Alembic's default name), so a database
shared with another Alembic-managed application keeps both histories apart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError
from sqlalchemy.engine import Dialect

__all__ = [
    "SCHEMA_REVISION",
    "VERSION_TABLE",
    "UTCDateTime",
    "api_keys",
    "append_keys",
    "compaction_records",
    "dead_letters",
    "folds",
    "is_declared",
    "ledger",
    "ledger_chunks",
    "metadata",
    "refusal_latches",
    "sessions",
    "tool_use_ids",
    "window_items",
]

SCHEMA_REVISION = "0009"
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
            raise InvalidInputError(
                "naive datetime given to the session store; use UTC-aware values")
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
    # The ledger may hold rows the search index has not seen (`sessionfold reindex` indexes
    # them). The server default, True, is for rows written around this code: every session
    # that existed before the index (migration 0005), or one loaded in bulk; the store writes
    # False for a session it creates (appends index their rows as they write them).
    sa.Column("search_pending", sa.Boolean, nullable=False, server_default=sa.text("true"),
              default=False),
    # The agent's model calls so far (its assistant messages, recall exchanges not counted):
    # the age the fold planner's horizon starts from.
    sa.Column("calls", sa.BigInteger, nullable=False, server_default="0"),
    # A running mean of the calls made while a background fold ran (claim to commit); NULL
    # until one has landed. The planner folds that much earlier.
    sa.Column("fold_lag_calls", sa.Float, nullable=True),
    # A fold waiting on a provider's batch API (the runtime's document: provider, batch id, the
    # claim it holds, what its visit is made again with); NULL when none waits. Cleared with
    # the claim: by the fold's commit or recorded visit, or by a claim that takes it over.
    sa.Column("batch", JSONDoc, nullable=True),
    # When that fold stops waiting for its batch; the sweep finds pending folds by it.
    sa.Column("batch_deadline", UTCDateTime, nullable=True),
)
sa.Index("ix_sessions_batch_deadline", sessions.c.batch_deadline)
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
    # 'agent' (the agent's own conversation) or 'recall' (an exchange the client made with the
    # ledger for the agent: never indexed, first to go in a fold).
    sa.Column("origin", sa.String(16), nullable=False, server_default="agent"),
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
# Retention (migration 0007): the records the count rule may prune are the no-op visits'; a
# partial index over them alone answers "how many, how old" per session from the index, and
# finds the newest N without stepping over the folds' records.
_NOT_FOLDED = sa.text("outcome <> 'folded'")
sa.Index("ix_records_visits", compaction_records.c.session_id, compaction_records.c.id,
         compaction_records.c.created_at, sqlite_where=_NOT_FOLDED, postgresql_where=_NOT_FOLDED)

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
# Retention (migration 0007): keys older than the rule's age are deleted oldest first.
sa.Index("ix_append_keys_created", append_keys.c.created_at)

# Every tool_use id a session's ledger holds, so an append can refuse one used before (the
# Messages API refuses a request that repeats an id) with one indexed lookup, never a scan of the
# ledger. Keyed by a digest of the id: ids are free text of any length, a digest fits the key.
tool_use_ids = sa.Table(
    "tool_use_ids",
    metadata,
    sa.Column("session_id", SessionId, sa.ForeignKey("sessions.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("id_digest", sa.String(32), primary_key=True),
    sa.Column("seq", sa.BigInteger, nullable=False),
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
    # No foreign key: a job may be given up on after its session was deleted (the store's
    # delete_session removes the session's letters, retention the ones written after it).
    sa.Column("session_id", SessionId, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("payload", JSONDoc, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
)
sa.Index("ix_dead_letters_created", dead_letters.c.created_at)
# delete_session removes a session's letters with it (migration 0007).
sa.Index("ix_dead_letters_session", dead_letters.c.session_id)

# The search index (migration 0005). Declared here as far as Core says it on both backends; the
# rest is backend DDL in the migration, named in DECLARED_ELSEWHERE:
#   PostgreSQL  tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', index_text)) STORED,
#               GIN index ix_ledger_chunks_tsv on it;
#   SQLite      ledger_chunks_fts: FTS5 (unicode61) over index_text, external content
#               ledger_chunks (content_rowid id), and its shadow tables; triggers
#               ledger_chunks_ai/_ad/_au keep it in step with every insert and delete (the
#               delete command gets the values the row was indexed with).
# Rows are never updated. ``text`` is the chunk's source text (NUL shown as U+FFFD: PostgreSQL
# text cannot hold it), the excerpt a search answers with.
ledger_chunks = sa.Table(
    "ledger_chunks",
    metadata,
    # SQLite: INTEGER PRIMARY KEY is the rowid, which FTS5's external content needs.
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
              autoincrement=True),
    sa.Column("session_id", SessionId, sa.ForeignKey("sessions.id", ondelete="CASCADE"),
              nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
    # Where ``text`` starts in the message's searchable text (recall pages a huge one by it).
    sa.Column("offset", sa.Integer, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("index_text", sa.Text, nullable=False),
    # One row per chunk position: an append racing a reindex can never index a chunk twice.
    sa.UniqueConstraint("session_id", "seq", "offset", name="uq_ledger_chunks_position"),
)

# The HTTP API's keys (sessionfold.service.auth makes and checks them). Only a digest of the
# secret is kept; a revoked key's row stays, so a key id is never reused.
api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("key_id", sa.String(32), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False),
    sa.Column("admin", sa.Boolean, nullable=False),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("revoked_at", UTCDateTime, nullable=True),
)
sa.Index("ix_api_keys_tenant", api_keys.c.tenant)

#: Schema objects the migrations create with backend DDL that the tables above do not declare.
DECLARED_ELSEWHERE = frozenset({
    "tsv", "ix_ledger_chunks_tsv",
    "ledger_chunks_fts", "ledger_chunks_fts_data", "ledger_chunks_fts_idx",
    "ledger_chunks_fts_docsize", "ledger_chunks_fts_config",
})


def is_declared(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic's ``include_name`` hook: False for the objects in :data:`DECLARED_ELSEWHERE`, so
    comparing the database with :data:`metadata` (autogenerate, the schema test) neither
    reports them missing here nor proposes to drop them."""
    return name not in DECLARED_ELSEWHERE
