"""Session rows: check ids and prompts, create, look up, lock, change policy, pause, list,
find over trigger, delete.

A session row carries everything a writer decides on (next seq, revision, fold fence, sizes), so
every write transaction starts by locking it (:func:`lock_session`): appends, usage reports,
claims and fold commits of one session queue on that row lock, and nothing else is shared.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sessionfold.core.economics import opening_trigger_tokens
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError, StoreError
from sessionfold.core.messages import find_lone_surrogate
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import Calibration, TokenCounter
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Row

from .db import Database
from .results import BatchMark, SessionInfo
from .schema import (
    append_keys,
    compaction_records,
    dead_letters,
    folds,
    ledger,
    ledger_chunks,
    refusal_latches,
    sessions,
    tool_use_ids,
    window_items,
)

__all__ = [
    "check_session_id",
    "check_system",
    "create_session",
    "current_tokens",
    "delete_session",
    "insert_session",
    "is_session_id",
    "last_folds",
    "list_sessions",
    "load_session",
    "lock_session",
    "over_trigger",
    "paused_over_budget",
    "session_info",
    "set_paused",
    "set_policy",
]

MAX_ID_LEN = 255
#: C0 controls and DEL: no session id holds one (a scheduler checks every id it reads).
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_session_id(sid: object) -> str:
    """A session id is a non-empty string of at most 255 characters without control chars,
    in valid Unicode (a lone surrogate, which UTF-8 cannot encode, reaches no database)."""
    if not isinstance(sid, str):
        raise InvalidInputError(f"a session id must be a string, got {type(sid).__name__}")
    if not sid or len(sid) > MAX_ID_LEN:
        raise InvalidInputError(f"a session id must be 1 to {MAX_ID_LEN} characters, "
                                f"got {len(sid)}")
    if _CONTROL.search(sid) is not None:
        raise InvalidInputError(f"a session id must not contain control characters: {sid!r}")
    if find_lone_surrogate(sid) is not None:
        raise InvalidInputError(f"a session id must be valid Unicode, without a lone surrogate: "
                                f"{sid!r}")
    return sid


def check_policy(policy: object) -> FoldPolicy:
    if not isinstance(policy, FoldPolicy):
        raise InvalidInputError(f"policy must be a FoldPolicy, got {type(policy).__name__}")
    return policy


def check_system(system: object) -> str:
    """A system prompt is text both backends store as given.

    NUL is refused rather than escaped: PostgreSQL text cannot hold it (SQLite can), and a
    prompt is written by the agent's developer, not captured from a tool, so a NUL in it is a
    bug upstream; refusing keeps the backends alike without an encoding every reader of the
    column would have to know. (Messages keep NUL: they are JSON, which escapes it.)
    """
    if not isinstance(system, str):
        raise InvalidInputError(f"system must be a string, got {type(system).__name__}")
    if "\x00" in system:
        raise InvalidInputError(f"system must not contain NUL (\\x00, at character "
                                f"{system.index(chr(0))}); PostgreSQL text cannot hold it")
    at = find_lone_surrogate(system)
    if at is not None:
        raise InvalidInputError(f"system holds a lone surrogate at character {at}; text must be "
                                "valid Unicode (UTF-8 cannot encode it)")
    return system


def is_session_id(sid: object) -> bool:
    """Whether ``sid`` is an id a session could have (:func:`check_session_id` passes it)."""
    try:
        check_session_id(sid)
    except InvalidInputError:
        return False
    return True


def current_tokens(*, measured_tokens: int | None, pending_tokens: int, system_tokens: int,
                   window_tokens: int, calibration: Calibration) -> int:
    """The size the trigger compares (see :attr:`SessionInfo.current_tokens`).

    After a report: what the provider counted, plus what was appended since scaled by the
    calibrated slope (the offset ``b`` is already inside the report). Never measured: the
    calibrated estimate of the whole request.
    """
    if measured_tokens is not None:
        return measured_current_tokens(measured_tokens, pending_tokens, calibration.a,
                                       calibration.samples)
    return calibration.predict(system_tokens + window_tokens)


def measured_current_tokens(measured_tokens: int, pending_tokens: int, slope: float,
                            samples: int) -> int:
    """:func:`current_tokens` after a report, from the calibration's slope and sample count."""
    return measured_tokens + round((slope if samples else 1.0) * pending_tokens)


def _not_found(sid: str) -> SessionNotFoundError:
    return SessionNotFoundError(f"no session {sid!r} in the store")


# Built once: a fold reads the session row several times, and building the statement cost
# more than running it (SQLAlchemy still caches the compiled form either way).
_SELECT_SESSION = sa.select(sessions).where(sessions.c.id == sa.bindparam("sid"))
_LOCK_SESSION = _SELECT_SESSION.with_for_update(key_share=True)
_UPDATE_SESSION = sessions.update().where(sessions.c.id == sa.bindparam("sid"))


def update_session(conn: Connection, sid: str, values: Mapping[str, Any]) -> None:
    """Set columns of the session row (``values``: column name to Python value, no SQL
    expressions), through one statement built once: the SET clause comes from the keys."""
    conn.execute(_UPDATE_SESSION, {"sid": sid, **values})


def load_session(conn: Connection, sid: str) -> Row[Any]:
    row = conn.execute(_SELECT_SESSION, {"sid": sid}).first()
    if row is None:
        raise _not_found(sid)
    return row


#: Ids per ``IN (…)`` list of :func:`load_gates` (below SQLite's bound-parameter limit).
_IDS_PER_QUERY = 5000
_SELECT_GATES = sa.select(
    sessions.c.id, sessions.c.incarnation, sessions.c.created_at, sessions.c.paused,
    sessions.c.current_tokens, sessions.c.trigger_tokens,
).where(sessions.c.id.in_(sa.bindparam("ids", expanding=True)))


def load_gates(conn: Connection, sids: Sequence[str]) -> list[Row[Any]]:
    """The columns of a :class:`~.results.SessionGate` of those of ``sids`` that exist, in one
    query per 5,000 ids."""
    rows: list[Any] = []
    for start in range(0, len(sids), _IDS_PER_QUERY):
        rows += conn.execute(_SELECT_GATES,
                             {"ids": list(sids[start:start + _IDS_PER_QUERY])}).all()
    return rows


def lock_session(conn: Connection, sid: str) -> Row[Any]:
    """The session row, locked for this transaction (SessionNotFoundError if absent).

    FOR NO KEY UPDATE rather than FOR UPDATE: inserts into the child tables take KEY SHARE locks
    on this row for their foreign keys, and must not queue behind a lock that never changes the
    key. (SQLite ignores the clause: ``BEGIN IMMEDIATE`` already holds the database write lock.)
    """
    row = conn.execute(_LOCK_SESSION, {"sid": sid}).first()
    if row is None:
        raise _not_found(sid)
    return row


def session_info(row: Row[Any] | Mapping[str, Any]) -> SessionInfo:
    m = row._mapping if isinstance(row, Row) else row
    return SessionInfo(
        id=m["id"],
        policy=FoldPolicy.from_json(m["policy"]),
        system=m["system"],
        revision=m["revision"],
        fold_revision=m["fold_revision"],
        fold_epoch=m["fold_epoch"],
        claimed_by=m["claimed_by"],
        claim_expires_at=m["claim_expires_at"],
        paused=bool(m["paused"]),
        ledger_len=m["next_seq"],
        window_tokens=m["window_tokens"],
        system_tokens=m["system_tokens"],
        measured_tokens=m["measured_tokens"],
        measured_seq=m["measured_seq"],
        measured_revision=m["measured_revision"],
        calibration=Calibration.model_validate(m["calibration"]),
        current_tokens=m["current_tokens"],
        trigger_tokens=m["trigger_tokens"],
        last_visit_outcome=m["last_visit_outcome"],
        last_visit_tokens=m["last_visit_tokens"],
        last_visit_at=m["last_visit_at"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        incarnation=m["incarnation"],
        abandoned_folds=m["abandoned_folds"],
        calls=m["calls"],
        fold_lag_calls=m["fold_lag_calls"],
        batch=BatchMark.from_json(m["batch"]) if m["batch"] is not None else None,
    )


def insert_session(conn: Connection, sid: str, policy: FoldPolicy, system: str, *,
                   now: datetime, counter: TokenCounter) -> None:
    system_tokens = counter.system(system)
    calibration = Calibration()
    conn.execute(sessions.insert().values(
        id=sid, policy=policy.to_json(), system=system, system_tokens=system_tokens,
        revision=0, fold_revision=0, fold_epoch=0, claimed_by=None, claim_expires_at=None,
        paused=False, next_seq=0, tail_tool_use_ids=[], window_tokens=0,
        measured_tokens=None, measured_seq=None, measured_revision=None, pending_tokens=0,
        calibration=calibration.to_json(),
        current_tokens=current_tokens(measured_tokens=None, pending_tokens=0,
                                      system_tokens=system_tokens, window_tokens=0,
                                      calibration=calibration),
        trigger_tokens=opening_trigger_tokens(policy), last_visit_outcome=None,
        last_visit_tokens=None,
        last_visit_at=None, created_at=now, updated_at=now,
        incarnation=secrets.randbits(62), abandoned_folds=0, calls=0, fold_lag_calls=None,
    ))


def create_session(db: Database, sid: str, policy: FoldPolicy, system: str, *,
                   exist_ok: bool, counter: TokenCounter) -> SessionInfo:
    """Create the session (arguments already checked) and return it; with ``exist_ok`` an
    existing session of that id is returned instead of refused."""
    try:
        return _create_session(db, sid, policy, system, exist_ok=exist_ok, counter=counter)
    except StoreError as exc:
        if not isinstance(exc.__cause__, sa_exc.IntegrityError):
            raise
        # PostgreSQL: a concurrent create of the same id won the insert. Look again.
        return _create_session(db, sid, policy, system, exist_ok=exist_ok, counter=counter)


def _create_session(db: Database, sid: str, policy: FoldPolicy, system: str, *,
                    exist_ok: bool, counter: TokenCounter) -> SessionInfo:
    with db.write() as conn:
        try:
            existing = load_session(conn, sid)
        except SessionNotFoundError:
            insert_session(conn, sid, policy, system, now=db.now(), counter=counter)
            return session_info(load_session(conn, sid))
        if not exist_ok:
            raise InvalidInputError(f"session {sid!r} already exists")
        return session_info(existing)


def set_policy(conn: Connection, sid: str, policy: FoldPolicy, *, now: datetime) -> None:
    lock_session(conn, sid)
    update_session(conn, sid, {"policy": policy.to_json(),
                               "trigger_tokens": opening_trigger_tokens(policy),
                               "updated_at": now})


def set_paused(conn: Connection, sid: str, paused: bool, *,
               clock: Callable[[Connection], datetime]) -> None:
    """Pause or resume. Resuming also forgets abandoned claims: the operator asks for a new try
    (a session given up on for killing its workers gets ``max_abandoned`` fresh attempts). A
    claim left behind past its lease is ended too (and fenced by a new epoch), so it is not
    counted as the first of the fresh attempts. ``clock`` is the lease clock (the database's,
    see :mod:`.claims`)."""
    row = lock_session(conn, sid)
    now = clock(conn)
    values: dict[str, Any] = {"paused": paused, "updated_at": now}
    if not paused:
        values["abandoned_folds"] = 0
        if row.claimed_by is not None and (row.claim_expires_at is None
                                           or row.claim_expires_at <= now):
            values.update(claimed_by=None, claim_expires_at=None,
                          fold_epoch=row.fold_epoch + 1, batch=None, batch_deadline=None)
    update_session(conn, sid, values)


def delete_session(conn: Connection, sid: str) -> bool:
    """Delete a session with everything it holds, its dead letters included; False if there
    was none. No row of any table names the session afterwards (the store test enumerates the
    schema's tables to hold every future table to this).

    The children are deleted explicitly (not only by ON DELETE CASCADE) so that a SQLite file
    opened without ``PRAGMA foreign_keys`` by another tool cannot leave orphans behind. Dead
    letters have no foreign key (a job may give up after the delete: retention prunes those).
    """
    exists = conn.execute(
        sa.select(sessions.c.id).where(sessions.c.id == sid).with_for_update(key_share=True)
    ).first()
    if exists is None:
        return False
    # ledger_chunks: on SQLite its delete trigger takes each row out of the FTS5 index.
    for table in (window_items, ledger, ledger_chunks, folds, compaction_records, append_keys,
                  refusal_latches, tool_use_ids, dead_letters):
        conn.execute(table.delete().where(table.c.session_id == sid))
    conn.execute(sessions.delete().where(sessions.c.id == sid))
    return True


def list_sessions(conn: Connection, *, limit: int, after: str | None,
                  prefix: str | None = None) -> list[SessionInfo]:
    query = sa.select(sessions).order_by(sessions.c.id).limit(limit)
    if after is not None:
        query = query.where(sessions.c.id > after)
    if prefix:
        # autoescape: a "%" or "_" in the prefix is matched literally, not as a wildcard.
        query = query.where(sessions.c.id.startswith(prefix, autoescape=True))
    return [session_info(row) for row in conn.execute(query)]


def last_folds(conn: Connection, sids: Sequence[str]) -> dict[str, datetime]:
    """When each of ``sids`` last had a fold committed, by id (a session never folded is
    missing), in one query per 5,000 ids.

    A committed fold is a ``folded`` record, written in the fold's own transaction; retention
    never prunes those, so the newest one is the session's last fold for its whole life.
    """
    r = compaction_records
    query = (sa.select(r.c.session_id, sa.func.max(r.c.created_at))
             .where(r.c.session_id.in_(sa.bindparam("ids", expanding=True)),
                    r.c.outcome == "folded")
             .group_by(r.c.session_id))
    found: dict[str, datetime] = {}
    for start in range(0, len(sids), _IDS_PER_QUERY):
        rows = conn.execute(query, {"ids": list(sids[start:start + _IDS_PER_QUERY])})
        found.update((sid, at) for sid, at in rows)
    return found


def over_trigger(conn: Connection, *, limit: int) -> list[SessionInfo]:
    """Sessions whose current size passes their trigger, not paused, most over first.

    :func:`~.results.past_trigger`, the rule every other check asks, is said in SQL on the stored
    ``trigger_tokens`` column (the policy's trigger, or lower where the cost model set the next
    visit earlier), because the
    WHERE and ORDER BY use the very expression ``ix_sessions_over_budget`` indexes: both backends
    answer with one index range scan, however many sessions are under their trigger.
    """
    over = sessions.c.current_tokens - sessions.c.trigger_tokens
    query = (sa.select(sessions)
             .where(sessions.c.paused == sa.false(), over > 0)
             .order_by(over.desc())
             .limit(limit))
    return [session_info(row) for row in conn.execute(query)]


def paused_over_budget(conn: Connection, *, limit: int) -> list[SessionInfo]:
    """Paused sessions whose current size passes their whole budget, most over first.

    A paused session is never folded in the background, so it grows with every turn its agent
    sends; these are the ones already costing more than their budget on every call. Past the
    budget implies past the trigger, so the WHERE narrows on the expression
    ``ix_sessions_over_budget`` indexes (paused, current - trigger) and the budget, kept in the
    policy document, is compared on the few rows found.
    """
    over = sessions.c.current_tokens - sessions.c.trigger_tokens
    query = (sa.select(sessions)
             .where(sessions.c.paused == sa.true(), over > 0)
             .order_by(over.desc()))
    found: list[SessionInfo] = []
    for row in conn.execute(query):
        info = session_info(row)
        if info.policy.over_budget(info.current_tokens):
            found.append(info)
            if len(found) == limit:
                break
    return found
