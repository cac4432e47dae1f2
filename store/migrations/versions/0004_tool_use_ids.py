"""tool_use_ids: every tool_use id a session's ledger holds, to refuse one used again.

The Messages API refuses a request in which two tool_use blocks share an id, so an append that
repeats an id of its session would make every later window unsendable. Checking against the
ledger itself would mean scanning every message on every append; this table answers with one
indexed lookup. Ids are keyed by a digest (``tool_use_id_digest`` in ``store/codec.py``: the
first 16 bytes of BLAKE2b over the UTF-8 id, in hex), which fits a key whatever the id's length.

The upgrade fills the table from the ledgers already stored. A ledger that already repeats an id
keeps its first seq for it (nothing is refused or rewritten here); a message the pre-0004 code
stored that no reader can decode (nested past the decoder) is skipped.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-14
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_BATCH = 1000


def upgrade() -> None:
    table = op.create_table(
        "tool_use_ids",
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("id_digest", sa.String(32), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
    )
    assert table is not None
    bind = op.get_bind()
    rows: list[dict[str, Any]] = []
    for row in _tool_use_rows(bind):
        rows.append(row)
        if len(rows) == _BATCH:
            bind.execute(table.insert(), rows)
            rows = []
    if rows:
        bind.execute(table.insert(), rows)


def downgrade() -> None:
    op.drop_table("tool_use_ids")


def _digest(tool_use_id: str) -> str:
    return hashlib.blake2b(tool_use_id.encode("utf-8"), digest_size=16).hexdigest()


def _tool_use_rows(bind: sa.Connection) -> Iterator[dict[str, Any]]:
    """One row per (session, id) of the stored ledgers, at the id's first seq."""
    ledger = sa.table("ledger", sa.column("session_id"), sa.column("seq"),
                      sa.column("message"))
    text = sa.cast(ledger.c.message, sa.Text)
    query = (sa.select(ledger.c.session_id, ledger.c.seq, text)
             .where(ledger.c.message.is_not(None), text.like('%"tool_use"%'))
             .order_by(ledger.c.session_id, ledger.c.seq))
    session: str | None = None
    seen: set[str] = set()
    # Fetched whole: only assistant messages with tool calls match, and the inserts that follow
    # go through the same connection.
    for sid, seq, raw in bind.execute(query).all():
        if sid != session:
            session, seen = sid, set()
        for tool_use_id in _ids(raw):
            digest = _digest(tool_use_id)
            if digest not in seen:
                seen.add(digest)
                yield {"session_id": sid, "id_digest": digest, "seq": seq}


def _ids(raw: str) -> list[str]:
    try:
        message = json.loads(raw)
    except (RecursionError, ValueError):
        return []
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [b["id"] for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)]
