"""Giving a fold job or a whole session up: the dead letter, the refusal that says why, and the
pause, written in one transaction.

The workers give up in two cases: a job delivered more often than ``max_attempts`` (its worker
was lost each time; the job is given up, the session stays eligible), and a session whose folds
were abandoned ``max_attempts`` times in a row (it is paused as well, so no summarizer is paid
for it until an operator resumes it). Written as separate transactions, a reader (an operator,
the scheduler's sweep, a test) could see a paused session, or a dead letter, without the reason;
one transaction under the session row lock shows all of it or none.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, get_args

from sessionfold.core.errors import InvalidInputError, SessionNotFoundError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import CompactionRecord, Trigger
from sqlalchemy.engine import Connection

from .claims import check_incarnation, check_job_id, earlier_incarnation
from .db import Database
from .dead_letters import insert_dead_letter
from .fold_commit import record_visit_locked
from .results import GaveUp
from .sessions import check_session_id, lock_session, update_session

__all__ = ["give_up_job", "give_up_locked"]


def give_up_job(db: Database, sid: str, job_id: str, reason: str, attempts: int,
                payload: Mapping[str, Any], *, trigger: Trigger, pause: bool,
                epoch: int | None, incarnation: int | None) -> GaveUp:
    """:meth:`SessionStore.give_up <.store.SessionStore.give_up>`: the arguments checked, then
    :func:`give_up_locked` in one transaction."""
    sid = check_session_id(sid)
    job_id = check_job_id(job_id)
    if not isinstance(pause, bool):
        raise InvalidInputError(f"pause must be True or False, got {pause!r}")
    if trigger not in get_args(Trigger):
        raise InvalidInputError(f"trigger must be one of {', '.join(get_args(Trigger))}, "
                                f"got {trigger!r}")
    if epoch is not None and check_incarnation(incarnation) is None:
        raise InvalidInputError("a claim to release is named by its epoch and incarnation")
    with db.write() as conn:
        return give_up_locked(conn, sid, job_id, reason, attempts, payload, trigger=trigger,
                              pause=pause, epoch=epoch, incarnation=incarnation, now=db.now())


def give_up_locked(conn: Connection, sid: str, job_id: str, reason: str, attempts: int,
                   payload: Mapping[str, Any], *, trigger: Trigger, pause: bool,
                   epoch: int | None, incarnation: int | None, now: datetime) -> GaveUp:
    """Dead-letter ``job_id``, record the refusal (outcome ``refused``, detail ``dead-lettered:
    REASON``) and, with ``pause``, pause the session; release the claim if the job holds it
    (``epoch`` with ``incarnation`` name it).

    SessionNotFoundError, and nothing written, if the session is gone or the id names a session
    created after the claim (the job was about one that no longer exists).
    """
    row = lock_session(conn, sid)
    gone = earlier_incarnation(sid, incarnation, row.incarnation, what="the job ran")
    if gone is not None:
        raise SessionNotFoundError(f"job {job_id!r} gives up nothing: {gone}")
    letter = insert_dead_letter(conn, job_id, sid, reason, attempts, payload, now=now)
    record = CompactionRecord.gave_up(
        trigger=trigger, policy=FoldPolicy.from_json(row.policy),
        current_tokens=row.current_tokens, measured=row.measured_tokens is not None,
        reason=reason)
    record_id, _, _ = record_visit_locked(conn, sid, record, job_id=job_id, epoch=epoch,
                                       incarnation=incarnation, now=now)
    if pause:
        update_session(conn, sid, {"paused": True, "updated_at": now})
    return GaveUp(dead_letter_id=letter, record_id=record_id, record=record, paused=pause)
