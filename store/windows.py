"""Reading a session's window: one indexed query, ordered by ``start_seq``.

The query joins the session row to its window items (``LEFT JOIN``, so an empty window still
answers with the revision). Both backends answer it from the session's primary key and the
window_items primary key ``(session_id, start_seq)``, which also gives the order. What it leaves
out:

- the system prompt on every row but the first item's (``start_seq = 0``: the window covers every
  ledger seq, so the first item starts at 0);
- the message and edits of items this process has decoded already (see :mod:`.cache`: items with
  a version at or below the last revision fully read here). The rest come back as JSON *text*
  (``CAST … AS TEXT``: psycopg would otherwise parse every ``json`` value it receives) and are
  parsed and decoded here.

A cached item evicted since is fetched by a second query in the same transaction, which reads the
same snapshot (deferred transaction under WAL on SQLite, REPEATABLE READ on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import sqlalchemy as sa
from sessionfold.core.errors import SessionNotFoundError, StoreError
from sessionfold.core.window import WindowItem
from sqlalchemy.engine import Connection

from .cache import ItemCache, ItemKey
from .codec import decode_item, decode_json
from .results import Window
from .schema import sessions, window_items

__all__ = ["read_window"]

_s, _w = sessions, window_items
# Text only for items newer than the revision this process holds in full (or of another
# incarnation of the session id).
_NEW = sa.or_(_w.c.version > sa.bindparam("known_revision"),
              _s.c.incarnation != sa.bindparam("known_incarnation"))
_WINDOW_QUERY = (
    sa.select(
        _s.c.revision,
        _s.c.incarnation,
        sa.case((sa.or_(_w.c.start_seq.is_(None), _w.c.start_seq == 0), _s.c.system),
                else_=sa.null()).label("system"),
        _w.c.start_seq, _w.c.end_seq, _w.c.kind, _w.c.version, _w.c.tokens,
        sa.case((_NEW, sa.cast(_w.c.message, sa.Text)), else_=sa.null()).label("message"),
        sa.case((_NEW, sa.cast(_w.c.edits, sa.Text)), else_=sa.null()).label("edits"),
    )
    .select_from(_s.outerjoin(_w, _w.c.session_id == _s.c.id))
    .where(_s.c.id == sa.bindparam("sid"))
    .order_by(_w.c.start_seq)
)
_REFETCH_QUERY = (
    sa.select(_w.c.start_seq, _w.c.version, sa.cast(_w.c.message, sa.Text),
              sa.cast(_w.c.edits, sa.Text))
    .where(_w.c.session_id == sa.bindparam("sid"),
           _w.c.start_seq.in_(sa.bindparam("starts", expanding=True)))
)
# Row positions in _WINDOW_QUERY (tuples index faster than named attributes).
_REV, _INC, _SYSTEM, _START, _END, _KIND, _VERSION, _TOKENS, _MESSAGE, _EDITS = range(10)


def read_window(conn: Connection, sid: str, cache: ItemCache) -> Window:
    known = cache.known(sid) or (-1, -1)
    rows: Sequence[Any] = conn.execute(
        _WINDOW_QUERY,
        {"sid": sid, "known_incarnation": known[0], "known_revision": known[1]},
    ).all()
    if not rows:
        raise SessionNotFoundError(f"no session {sid!r} in the store")
    first = rows[0]
    system = first[_SYSTEM]
    if system is None:  # only if the window lost its first item; read the prompt on its own
        system = conn.execute(sa.select(_s.c.system).where(_s.c.id == sid)).scalar_one()
    revision, incarnation = first[_REV], first[_INC]
    if first[_START] is None:
        return Window(session_id=sid, system=system, revision=revision, items=[])

    caching = cache.capacity > 0  # a fold worker's store keeps none (workers.runtime)
    keys: list[ItemKey] = ([(sid, incarnation, r[_START], r[_VERSION]) for r in rows]
                           if caching else [])
    items: list[WindowItem | None] = (cache.get_many(keys) if caching
                                      else [None] * len(rows))
    texts: dict[int, tuple[str, str]] = {
        i: (r[_MESSAGE], r[_EDITS]) for i, r in enumerate(rows)
        if items[i] is None and r[_MESSAGE] is not None
    }
    evicted = [i for i, item in enumerate(items) if item is None and i not in texts]
    if evicted:
        texts.update(_refetch(conn, sid, rows, evicted))
    fresh: list[tuple[ItemKey, WindowItem]] = []
    chars: list[int | None] = [None] * len(rows)
    for i, (message, edits) in texts.items():
        r = rows[i]
        # Most items carry no edits: their "[]" is not parsed.
        item = decode_item(r[_START], r[_END], r[_KIND], decode_json(message),
                           () if edits == "[]" else decode_json(edits), r[_VERSION],
                           r[_TOKENS])
        items[i] = item
        # The engine's JSON written compactly (store.engine): the length the fold measures.
        chars[i] = len(message)
        if caching:
            fresh.append((keys[i], item))
    if caching:
        cache.put_window(sid, incarnation, revision, fresh)
    return Window(session_id=sid, system=system, revision=revision,
                  items=cast(list[WindowItem], items), chars=chars)


def _refetch(conn: Connection, sid: str, rows: Sequence[Any],
             wanted: list[int]) -> dict[int, tuple[str, str]]:
    """The texts of cached items evicted since (same transaction, so the same snapshot)."""
    index = {rows[i][_START]: i for i in wanted}
    got: dict[int, tuple[str, str]] = {}
    for start, version, message, edits in conn.execute(
            _REFETCH_QUERY, {"sid": sid, "starts": list(index)}):
        i = index[start]
        if version != rows[i][_VERSION]:  # a snapshot cannot change
            raise StoreError(f"window item #{start} of {sid!r} changed inside one snapshot")
        got[i] = (message, edits)
    missing = [rows[i][_START] for i in wanted if i not in got]
    if missing:  # nor lose rows
        raise StoreError(f"window items {missing} of {sid!r} vanished inside one snapshot")
    return got
