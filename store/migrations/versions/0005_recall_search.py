"""The ledger's full-text search index (recall), ledger.origin, sessions.search_pending.

- ``ledger_chunks``: one row per chunk of a ledger message's searchable text (at most 8 K source
  characters, ``sessionfold.core.searchtext``), with ``index_text``, the identifier-aware words
  derived from it. Unique on (session_id, seq, offset), so a chunk is never indexed twice.
  PostgreSQL adds ``tsv``, a stored generated ``to_tsvector('simple', index_text)``, and a GIN
  index on it. SQLite adds ``ledger_chunks_fts``, an FTS5 table over ``index_text`` with
  ``ledger_chunks`` as its external content, kept in step by three triggers: a row inserted is
  indexed, a row deleted (a discard, a deleted session, ON DELETE CASCADE included) leaves the
  index through FTS5's ``delete`` command with the very values it was indexed with (taken from
  the row being deleted, so they always agree), and an update does both.
- ``ledger.origin``: ``'agent'`` (every existing row, by its server default) or ``'recall'``
  (an exchange the client made with the ledger on the agent's behalf; never indexed).
- ``sessions.search_pending``: the session's ledger may hold rows the index has not seen. True
  for every existing session (the server default): their ledgers were written before the index.
  The store writes False for a session it creates (appends index their rows as they write them).

No row is indexed here: every ``connect()`` applies migrations to the embedded SQLite file, and
deriving the words of a large ledger takes minutes. ``sessionfold reindex`` does it afterwards,
in short batches beside live appends (``sessionfold migrate`` says when it is needed).

The GIN index is created here, not ``CONCURRENTLY``: the table is new and empty in this very
transaction, so building the index reads no row and blocks no writer (nobody else can see the
table before the commit); the backfill then inserts into an indexed table, which GIN absorbs
through its pending list. ``CONCURRENTLY`` matters only for building an index over rows that
already exist, which never happens to this table.

Adding the two columns rewrites nothing on PostgreSQL (a constant default is kept in the
catalog) and is a plain ``ALTER TABLE ... ADD COLUMN`` on SQLite (never a table rebuild).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_SQLITE_FTS = (
    "CREATE VIRTUAL TABLE ledger_chunks_fts USING fts5(index_text, content='ledger_chunks', "
    "content_rowid='id', tokenize='unicode61')",
    "CREATE TRIGGER ledger_chunks_ai AFTER INSERT ON ledger_chunks BEGIN "
    "INSERT INTO ledger_chunks_fts (rowid, index_text) VALUES (new.id, new.index_text); END",
    "CREATE TRIGGER ledger_chunks_ad AFTER DELETE ON ledger_chunks BEGIN "
    "INSERT INTO ledger_chunks_fts (ledger_chunks_fts, rowid, index_text) "
    "VALUES ('delete', old.id, old.index_text); END",
    "CREATE TRIGGER ledger_chunks_au AFTER UPDATE ON ledger_chunks BEGIN "
    "INSERT INTO ledger_chunks_fts (ledger_chunks_fts, rowid, index_text) "
    "VALUES ('delete', old.id, old.index_text); "
    "INSERT INTO ledger_chunks_fts (rowid, index_text) VALUES (new.id, new.index_text); END",
)


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    # Plain ADD COLUMN, never batch mode: batch mode rebuilds a SQLite table for a default it
    # cannot render as a literal, which drops the expression index of ``sessions`` and, with
    # foreign keys on, deletes every child row of the dropped table by cascade.
    op.add_column("ledger", sa.Column("origin", sa.String(16), nullable=False,
                                      server_default="agent"))
    op.add_column("sessions", sa.Column("search_pending", sa.Boolean, nullable=False,
                                        server_default=sa.text("true")))
    columns: list[sa.Column[object]] = [
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("offset", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("index_text", sa.Text, nullable=False),
    ]
    if not sqlite:
        columns.append(sa.Column("tsv", postgresql.TSVECTOR,
                                 sa.Computed("to_tsvector('simple', index_text)", persisted=True),
                                 nullable=False))
    op.create_table("ledger_chunks", *columns,
                    sa.UniqueConstraint("session_id", "seq", "offset",
                                        name="uq_ledger_chunks_position"))
    if sqlite:
        for statement in _SQLITE_FTS:
            op.execute(statement)
    else:
        op.create_index("ix_ledger_chunks_tsv", "ledger_chunks", ["tsv"],
                        postgresql_using="gin")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in ("ledger_chunks_au", "ledger_chunks_ad", "ledger_chunks_ai"):
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute("DROP TABLE IF EXISTS ledger_chunks_fts")
    op.drop_table("ledger_chunks")
    # Native DROP COLUMN (SQLite 3.35+), never batch mode's table rebuild: rebuilding
    # ``sessions`` drops it, and with foreign keys on that deletes every child row by cascade.
    op.execute("ALTER TABLE sessions DROP COLUMN search_pending")
    op.execute("ALTER TABLE ledger DROP COLUMN origin")
