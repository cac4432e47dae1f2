"""Reading a session's window: one indexed query, ordered by ``start_seq``.

The query joins the session row to its window items (``LEFT JOIN``, so an empty window still
answers with the revision). The system prompt is selected only on the first item's row
(``start_seq = 0``: the window covers every ledger seq, so the first item starts at 0), rather
than repeated on each of a few hundred rows. Both backends answer it from the session's primary
key and the window_items primary key ``(session_id, start_seq)``, which also gives the order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sessionfold.core.errors import SessionNotFoundError
from sqlalchemy.engine import Connection

from .codec import decode_item
from .results import Window
from .schema import sessions, window_items

__all__ = ["read_window"]

_s, _w = sessions, window_items
_WINDOW_QUERY = (
    sa.select(
        _s.c.revision,
        sa.case((sa.or_(_w.c.start_seq.is_(None), _w.c.start_seq == 0), _s.c.system),
                else_=sa.null()).label("system"),
        _w.c.start_seq, _w.c.end_seq, _w.c.kind, _w.c.message, _w.c.edits, _w.c.version,
        _w.c.tokens,
    )
    .select_from(_s.outerjoin(_w, _w.c.session_id == _s.c.id))
    .where(_s.c.id == sa.bindparam("sid"))
    .order_by(_w.c.start_seq)
)


def read_window(conn: Connection, sid: str) -> Window:
    rows: Sequence[Any] = conn.execute(_WINDOW_QUERY, {"sid": sid}).all()
    if not rows:
        raise SessionNotFoundError(f"no session {sid!r} in the store")
    first = rows[0]
    system = first.system
    if system is None:  # pragma: no cover - only if the window lost its first item
        system = conn.execute(sa.select(_s.c.system).where(_s.c.id == sid)).scalar_one()
    if first.start_seq is None:
        return Window(session_id=sid, system=system, revision=first.revision, items=[])
    items = [decode_item(r.start_seq, r.end_seq, r.kind, r.message, r.edits, r.version, r.tokens)
             for r in rows]
    return Window(session_id=sid, system=system, revision=first.revision, items=items)
