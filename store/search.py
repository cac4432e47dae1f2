"""The ledger's full-text index: written with each append, searched by recall, rebuilt in batches.

What is indexed: every ledger message of origin ``'agent'``, cut into chunks of its searchable
text (:func:`sessionfold.core.searchtext.message_chunks`: at most 8 K source characters each,
with their identifier-aware index words). One ``ledger_chunks`` row per chunk; PostgreSQL
indexes ``index_text`` as a stored generated ``tsvector`` with a GIN index, SQLite as an FTS5
table whose external content is ``ledger_chunks``, kept in step by triggers (see
``store/schema.py`` and migration 0005). A chunk is small enough for PostgreSQL's tsvector
limits (1 MB, 16,383 positions) and doubles as the excerpt a search answers with.

When it is written:

- **Append**: the chunks are derived before the write transaction opens (the 868 K-character
  tool output of the shared transcripts takes a few hundred ms to derive), and inserted by the
  transaction that writes the ledger rows, so a reader sees a message and its index rows
  together or neither. Recall exchanges (``origin='recall'``) are not indexed: they repeat the
  ledger.
- **Discard** (``retain="discard"``): the fold commit that blanks ledger rows deletes their
  chunks (on SQLite the delete trigger hands FTS5 its ``delete`` command).
- **Delete session**: the rows go with the session.
- **Reindex** (:func:`reindex`): ledgers written before the index existed. It reads unindexed
  rows a batch at a time, derives their chunks outside any transaction, and writes each group
  in a short transaction under the session's lock that indexes only the rows still without
  chunks and not discarded: safe beside live appends, folds and other reindexers, resumable,
  and idempotent. The unique (session_id, seq, offset) constraint is the backstop: no chunk can
  be indexed twice whatever races.

Searching runs the query's tiers in order (:meth:`SearchQuery.tiers`), each ranked (FTS5
``bm25``, PostgreSQL ``ts_rank_cd``; ties: newest seq first), appending the chunks not found by
an earlier tier until the limit is reached; the fallback tiers (any word) run only when the
strict ones found nothing. Only the session's own rows are read. On SQLite, FTS5 holds one index
for all sessions: a query reads its words' postings across every session and keeps this
session's rows (the embedded store holds few sessions; fleets run PostgreSQL, where the planner
chooses between the session's rows and the GIN index).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError
from sessionfold.core.messages import Message
from sessionfold.core.searchtext import SearchChunk, SearchQuery, message_chunks, parse_query
from sqlalchemy.engine import Connection

from .codec import decode_message
from .db import Database
from .results import SearchHit
from .schema import ledger, ledger_chunks, sessions
from .sessions import load_session, lock_session, update_session

__all__ = [
    "MAX_LIMIT",
    "MAX_REINDEX_BATCH",
    "chunk_rows",
    "derive_chunks",
    "drop_chunks",
    "insert_chunks",
    "pending_sessions",
    "reindex",
    "search",
]

#: Most hits one search returns (each is up to 8 K characters of text).
MAX_LIMIT = 1000
#: Most ledger rows one reindex batch reads.
MAX_REINDEX_BATCH = 10_000
#: Most chunk rows one reindex write transaction inserts: bounds how long it holds SQLite's
#: write lock (an FTS5 insert tokenizes its text), whatever the batch size.
_CHUNKS_PER_WRITE = 512
#: Sessions read per page when the reindex looks for pending ones.
_SESSIONS_PER_PAGE = 500

_SQLITE_TIER = sa.text(
    # CROSS JOIN keeps the FTS5 table the outer loop: the MATCH runs once, not once per chunk
    # of the session.
    'SELECT c.seq, c."offset", c.text, -bm25(ledger_chunks_fts) AS rank '
    "FROM ledger_chunks_fts CROSS JOIN ledger_chunks AS c "
    "WHERE ledger_chunks_fts MATCH :query AND c.id = ledger_chunks_fts.rowid "
    "AND c.session_id = :sid "
    'ORDER BY rank DESC, c.seq DESC, c."offset" LIMIT :limit')
_POSTGRES_TIER = sa.text(
    'SELECT c.seq, c."offset", c.text, ts_rank_cd(c.tsv, q) AS rank '
    "FROM ledger_chunks AS c, to_tsquery('simple', :query) AS q "
    "WHERE c.session_id = :sid AND c.tsv @@ q "
    'ORDER BY rank DESC, c.seq DESC, c."offset" LIMIT :limit')


# --- writing -------------------------------------------------------------------------------------

def derive_chunks(messages: Sequence[Message]) -> list[list[SearchChunk]]:
    """The chunks of each message, numbered by its index in ``messages`` (the caller adds the
    first seq once it is known, under the lock). No database access: run it before the write
    transaction opens."""
    return [message_chunks(message, index) for index, message in enumerate(messages)]


def _excerpt(text: str) -> str:
    # PostgreSQL text cannot hold NUL (tool output can: the ledger's JSON escapes it). One
    # character for one keeps every offset true; both backends store the same text.
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def chunk_rows(sid: str, first_seq: int,
               derived: Sequence[Sequence[SearchChunk]]) -> list[dict[str, Any]]:
    """``ledger_chunks`` rows of messages ``first_seq, first_seq + 1, ...``."""
    return [{"session_id": sid, "seq": first_seq + chunk.seq, "offset": chunk.offset,
             "text": _excerpt(chunk.text), "index_text": chunk.index_text}
            for chunks in derived for chunk in chunks]


def insert_chunks(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        conn.execute(ledger_chunks.insert(), list(rows))


def drop_chunks(conn: Connection, sid: str, start_seq: int, end_seq: int) -> None:
    """Take ledger seqs ``start_seq..end_seq`` (inclusive) out of the index (a discard)."""
    conn.execute(ledger_chunks.delete().where(
        ledger_chunks.c.session_id == sid, ledger_chunks.c.seq >= start_seq,
        ledger_chunks.c.seq <= end_seq))


# --- searching -----------------------------------------------------------------------------------

def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInputError(f"a search limit is an integer from 1 to {MAX_LIMIT}, "
                                f"got {limit!r}")
    return limit


def parse(query: object) -> SearchQuery:
    """The parsed query; InvalidInputError with a message to show as it is."""
    if not isinstance(query, str):
        raise InvalidInputError(f"a search query is text, got {type(query).__name__}")
    return parse_query(query)


def search(conn: Connection, sid: str, query: SearchQuery, limit: int) -> list[SearchHit]:
    """The session's best chunks for ``query`` (see the module doc); SessionNotFoundError for
    an unknown session."""
    statement = _SQLITE_TIER if conn.dialect.name == "sqlite" else _POSTGRES_TIER
    hits: list[SearchHit] = []
    seen: set[tuple[int, int]] = set()
    strict_found = False
    for tier in query.tiers():
        if tier.fallback and strict_found:
            break
        expression = tier.fts5 if conn.dialect.name == "sqlite" else tier.tsquery
        for row in conn.execute(statement, {"query": expression, "sid": sid, "limit": limit}):
            # A later tier's matches include the earlier tiers': its top `limit` hold at most
            # len(hits) seen chunks, so the new ones still fill the limit when enough exist.
            if (row.seq, row.offset) not in seen:
                seen.add((row.seq, row.offset))
                hits.append(SearchHit(seq=row.seq, offset=row.offset, excerpt=row.text,
                                      rank=float(row.rank), tier=tier.match))
        strict_found = strict_found or (bool(hits) and not tier.fallback)
        if len(hits) >= limit:
            break
    if not hits:
        load_session(conn, sid)  # SessionNotFoundError when there is no such session
    return hits[:limit]


# --- reindexing ----------------------------------------------------------------------------------

def _unindexed() -> sa.ColumnElement[bool]:
    """Ledger rows the index should hold but does not: the agent's, not discarded, no chunk."""
    has_chunks = sa.exists().where(ledger_chunks.c.session_id == ledger.c.session_id,
                                   ledger_chunks.c.seq == ledger.c.seq)
    return sa.and_(ledger.c.origin == "agent", ledger.c.discarded_at.is_(None),
                   ledger.c.message.is_not(None), ~has_chunks)


def pending_sessions(conn: Connection) -> int:
    """How many sessions may hold ledger rows the index has not seen (a cheap count of one
    column of ``sessions``: what ``sessionfold migrate`` checks to suggest a reindex)."""
    count = conn.execute(sa.select(sa.func.count()).select_from(sessions).where(
        sessions.c.search_pending == sa.true(), sessions.c.next_seq > 0)).scalar_one()
    return int(count)


def _pending_page(conn: Connection, after: str | None) -> list[str]:
    query = (sa.select(sessions.c.id).where(sessions.c.search_pending == sa.true())
             .order_by(sessions.c.id).limit(_SESSIONS_PER_PAGE))
    if after is not None:
        query = query.where(sessions.c.id > after)
    return list(conn.execute(query).scalars())


def _unindexed_rows(conn: Connection, sid: str, after: int,
                    batch: int) -> list[tuple[int, Message]]:
    rows = conn.execute(
        sa.select(ledger.c.seq, ledger.c.message)
        .where(ledger.c.session_id == sid, ledger.c.seq > after, _unindexed())
        .order_by(ledger.c.seq).limit(batch)).all()
    return [(r.seq, decode_message(r.message)) for r in rows]


def _groups(derived: Sequence[tuple[int, list[SearchChunk]]]
            ) -> Iterator[list[tuple[int, list[SearchChunk]]]]:
    """Consecutive runs of rows holding at most _CHUNKS_PER_WRITE chunks in all (a message
    with more goes alone)."""
    group: list[tuple[int, list[SearchChunk]]] = []
    size = 0
    for seq, chunks in derived:
        if group and size + len(chunks) > _CHUNKS_PER_WRITE:
            yield group
            group, size = [], 0
        group.append((seq, chunks))
        size += len(chunks)
    if group:
        yield group


def _index_locked(conn: Connection, sid: str,
                  group: Sequence[tuple[int, list[SearchChunk]]]) -> int:
    """Index the rows of ``group`` that still need it; how many were indexed.

    Under the session's lock, the rows are looked up again: one that an append or another
    reindex indexed meanwhile, or that a fold discarded, is left alone. (On SQLite the write
    transaction is the lock itself.)
    """
    lock_session(conn, sid)
    wanted = [seq for seq, _ in group]
    still = set(conn.execute(sa.select(ledger.c.seq).where(
        ledger.c.session_id == sid, ledger.c.seq.in_(wanted), _unindexed())).scalars())
    rows = [{"session_id": sid, "seq": seq, "offset": chunk.offset,
             "text": _excerpt(chunk.text), "index_text": chunk.index_text}
            for seq, chunks in group if seq in still for chunk in chunks]
    insert_chunks(conn, rows)
    return len(still)


def _reindex_session(db: Database, sid: str, batch: int) -> int:
    indexed = 0
    after = -1
    while True:
        with db.read() as conn:
            found = _unindexed_rows(conn, sid, after, batch)
        if not found:
            break
        # Derived between transactions: no lock is held while the words are computed.
        derived = [(seq, chunks) for seq, message in found
                   if (chunks := message_chunks(message, seq))]
        for group in _groups(derived):
            with db.write() as conn:
                indexed += _index_locked(conn, sid, group)
        after = found[-1][0]
        if len(found) < batch:
            break
    with db.write() as conn:
        # Every row up to the tail was seen; later rows were indexed by their appends.
        lock_session(conn, sid)
        update_session(conn, sid, {"search_pending": False})
    return indexed


def check_batch(batch: object) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) \
            or not 1 <= batch <= MAX_REINDEX_BATCH:
        raise InvalidInputError(f"a reindex batch is an integer from 1 to {MAX_REINDEX_BATCH}, "
                                f"got {batch!r}")
    return batch


def reindex(db: Database, sid: str | None, batch: int) -> int:
    """Index the ledger rows the index lacks (see the module doc): of session ``sid``, whatever
    its ``search_pending`` flag says, or of every session flagged pending. Returns how many
    ledger rows were added to the index (a row without searchable words adds none)."""
    if sid is not None:
        with db.read() as conn:
            load_session(conn, sid)
        return _reindex_session(db, sid, batch)
    indexed = 0
    after: str | None = None
    while True:
        with db.read() as conn:
            page = _pending_page(conn, after)
        for found in page:
            try:
                indexed += _reindex_session(db, found, batch)
            except SessionNotFoundError:
                continue  # deleted meanwhile: nothing left to index
        if len(page) < _SESSIONS_PER_PAGE:
            return indexed
        after = page[-1]
