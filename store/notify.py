"""Telling waiting readers that a session's window changed, and what it is now.

An app server long-polls the HTTP API for a session's window ("answer as soon as a fold lands").
The API must learn of the change without one database connection per waiter, so the writers
announce it:

- **PostgreSQL**: every transaction that changes a window (an append, a fold commit, a delete)
  calls :func:`notify_window_change`, which queues ``NOTIFY sessionfold_window`` inside that very
  transaction. PostgreSQL delivers it at COMMIT and drops it at ROLLBACK, so a listener never
  hears of a change that did not happen, nor misses one that did (while it is connected; a
  listener re-reads its sessions' states after every reconnect).
- **SQLite** has no NOTIFY: :func:`notify_window_change` does nothing, and a waiting reader polls
  :func:`window_states` (one batched query for every session it waits on).

The payload is a compact JSON object: ``{"s": session id, "i": incarnation, "r": revision,
"c": cause}`` with cause ``append``, ``fold`` or ``delete`` (a fold's revision is also the
session's new ``fold_revision``). It stays far below PostgreSQL's 8000-byte payload limit: a
session id has at most 255 characters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .schema import sessions

__all__ = ["CHANNEL", "Cause", "WindowChange", "WindowState", "notify_window_change",
           "parse_change", "window_states"]

#: The one channel every window change is announced on (listeners filter in process).
CHANNEL = "sessionfold_window"
Cause = Literal["append", "fold", "delete"]
#: Session ids per statement when reading states (SQLite caps the parameters of one statement).
_CHUNK = 500
_NOTIFY = sa.text("SELECT pg_notify(:channel, :payload)")


@dataclass(frozen=True, slots=True)
class WindowState:
    """Where a session's window stands: which session (``incarnation``, random per created
    session), how many changes it has seen (``revision``) and the revision its last fold made
    (``fold_revision``, 0 before the first)."""

    incarnation: int
    revision: int
    fold_revision: int


@dataclass(frozen=True, slots=True)
class WindowChange:
    """One announced change: the session and its state after it (None when deleted)."""

    session_id: str
    cause: Cause
    state: WindowState | None


def notify_window_change(conn: Connection, sid: str, incarnation: int, revision: int,
                         cause: Cause) -> None:
    """Announce, inside ``conn``'s transaction, that ``sid``'s window changed (see module doc).

    A no-op on SQLite, whose readers poll instead.
    """
    if conn.dialect.name != "postgresql":
        return
    payload = json.dumps({"s": sid, "i": incarnation, "r": revision, "c": cause},
                         separators=(",", ":"))
    conn.execute(_NOTIFY, {"channel": CHANNEL, "payload": payload})


def parse_change(payload: str) -> WindowChange | None:
    """The change a notification announces, or None for a payload this code did not write."""
    try:
        data: Any = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, Mapping):
        return None
    sid, cause = data.get("s"), data.get("c")
    incarnation, revision = data.get("i"), data.get("r")
    if not isinstance(sid, str) or cause not in ("append", "fold", "delete"):
        return None
    if cause == "delete":
        return WindowChange(sid, "delete", None)
    if type(incarnation) is not int or type(revision) is not int:
        return None
    # An append leaves fold_revision where it was; the listener keeps the one it knew.
    fold_revision = revision if cause == "fold" else -1
    return WindowChange(sid, cause, WindowState(incarnation, revision, fold_revision))


def window_states(conn: Connection, sids: Iterable[str]) -> dict[str, WindowState]:
    """The state of each session of ``sids`` that exists (absent ones are left out)."""
    wanted = list(dict.fromkeys(sids))
    found: dict[str, WindowState] = {}
    for start in range(0, len(wanted), _CHUNK):
        rows = conn.execute(
            sa.select(sessions.c.id, sessions.c.incarnation, sessions.c.revision,
                      sessions.c.fold_revision)
            .where(sessions.c.id.in_(wanted[start:start + _CHUNK])))
        for sid, incarnation, revision, fold_revision in rows:
            found[sid] = WindowState(incarnation, revision, fold_revision)
    return found
