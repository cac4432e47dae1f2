"""Folds waiting on a provider's batch API: the session's batch mark, held under the fold's claim.

A batch fold is a fold visit in two halves, both under one claim (:mod:`.claims`):

1. the fold job claims the session, plans, and sends its summary request to the provider's
   batch API; :func:`hold_locked` then writes the session's *batch mark* (``sessions.batch``:
   the provider, the batch id, what the visit is made again with) and stretches the claim's
   lease to the batch's deadline. The claim must still be the job's (same job id, epoch and
   incarnation): a claim that moved on while the request was sent (an inline fold forced its
   own) makes the hold stale, and the caller cancels the batch.
2. once the answer is in, a collection resumes that claim (:func:`resume_locked`: the same
   job id, epoch and incarnation, the mark still set) and lands the visit through the commit
   every fold takes (:mod:`.fold_commit`, under compare-and-set); the commit, or the record
   of a visit that folded nothing, releases the claim and clears the mark in its transaction.

Why the claim stays held rather than released and taken again: a new claim raises the epoch,
and the collected fold would then fence itself off. Held, it keeps what every claim gives:
no other fold of the session runs meanwhile, a forced claim (the inline fallback) takes it
over and makes the batch's answer stale, and a claim past the deadline is a dead claim like
any other. Appends only add items after those the plan read, so they do not make the pending
fold stale (only a claim, or a changed item, does). A deleted session's mark goes with its
row; a session created again under the id is another incarnation, and its resume answers
SessionNotFoundError.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sessionfold.core.errors import SessionNotFoundError
from sqlalchemy.engine import Connection

from .claims import committed_fold_record, earlier_incarnation
from .results import BatchMark, Claim, SessionInfo
from .schema import sessions
from .sessions import lock_session, session_info, update_session

__all__ = ["LostClaim", "hold_locked", "pending_batches", "resume_locked"]


class LostClaim(Exception):
    """Internal: the claim a batch fold would hold is no longer the job's (``reason`` says
    why). Becomes StaleSpanError."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def hold_locked(conn: Connection, claim: Claim, mark: BatchMark, *, now: datetime) -> None:
    """Write ``mark`` and hold ``claim`` until its deadline (step 1 of the module doc).

    Raises :class:`LostClaim` if the claim is no longer the job's, SessionNotFoundError if the
    session is gone.
    """
    sid = claim.session_id
    row = lock_session(conn, sid)
    gone = earlier_incarnation(sid, claim.incarnation, row.incarnation)
    if gone is not None:
        raise LostClaim(gone)
    if row.claimed_by != claim.job_id or row.fold_epoch != claim.epoch:
        raise LostClaim(f"job {claim.job_id!r} no longer holds the claim of epoch "
                        f"{claim.epoch} (epoch {row.fold_epoch} now, held by "
                        f"{row.claimed_by!r})")
    update_session(conn, sid, {"batch": mark.to_json(), "batch_deadline": mark.deadline,
                               "claim_expires_at": mark.deadline, "updated_at": now})


def resume_locked(conn: Connection, sid: str, job_id: str, *, epoch: int,
                  incarnation: int) -> tuple[Claim, Mapping[str, Any]]:
    """The claim a batch fold holds, taken up again to land it (step 2 of the module doc),
    and the session row.

    ``claimed`` when ``job_id`` still holds the claim of ``epoch`` with the batch mark set;
    ``already-committed`` when the job's fold is already committed (an earlier collection);
    ``newer-claim`` when the claim moved on (a forced claim, one past the deadline). A
    session deleted and created again raises SessionNotFoundError, as a gone one does.
    """
    row = lock_session(conn, sid)
    gone = earlier_incarnation(sid, incarnation, row.incarnation,
                               what="the batch fold was planned")
    if gone is not None:
        raise SessionNotFoundError(f"job {job_id!r} collects nothing: {gone}")
    mapping = cast(Mapping[str, Any], row._mapping)

    def answer(status: str, detail: str = "") -> tuple[Claim, Mapping[str, Any]]:
        held = status == "claimed"
        return Claim(status=status, session_id=sid, job_id=job_id,  # type: ignore[arg-type]
                     epoch=row.fold_epoch, revision=row.revision, incarnation=row.incarnation,
                     holder=row.claimed_by, expires_at=row.claim_expires_at if held else None,
                     detail=detail, abandoned_folds=row.abandoned_folds), mapping

    if committed_fold_record(conn, sid, job_id) is not None:
        return answer("already-committed", f"job {job_id!r} already committed its fold")
    if row.claimed_by != job_id or row.fold_epoch != epoch or row.batch is None:
        return answer("newer-claim", f"the claim the batch fold held (job {job_id!r}, epoch "
                                     f"{epoch}) has moved on: epoch {row.fold_epoch}, held by "
                                     f"{row.claimed_by!r}")
    return answer("claimed")


def pending_batches(conn: Connection, *, limit: int) -> list[SessionInfo]:
    """Sessions with a fold waiting on a batch, soonest deadline first (one index range scan
    on ``ix_sessions_batch_deadline``)."""
    query = (sa.select(sessions).where(sessions.c.batch_deadline.is_not(None))
             .order_by(sessions.c.batch_deadline).limit(limit))
    return [session_info(row) for row in conn.execute(query)]
