"""Claiming a session for a fold: the store-side fence that makes duplicate jobs harmless.

A fold job claims its session *before* it pays for a summary. The claim is one short transaction
under the session row lock, so of any number of concurrent deliveries of a job exactly one sees
the session unclaimed; it raises ``fold_epoch`` (the fence its commit must still match) and
holds a lease. The rest stop:

- ``already-committed``: a fold by this job id is already committed (a redelivery after the job
  finished);
- ``newer-claim``: a live lease is held, by any job, this one included (a duplicate delivery is
  running right now); or the session was claimed after this job was enqueued
  (``fold_epoch > enqueued_epoch``) by another job.

A job whose own earlier attempt died keeps ``claimed_by`` pointing at it after the lease expired:
its redelivery may claim again (a new epoch: the dead attempt, should it wake up, is stale).

A job that released its claim (a visit recorded after a transient summarizer error) and retries
under the same id passes the epoch it claimed as ``enqueued_epoch``: it claims again unless
someone else claimed in between.

**Incarnations.** A session id deleted and created again names a new session, whose epochs
and item versions start over: an epoch alone cannot tell a claim of the old session from one
of the new. Every claim answers with the session's ``incarnation`` (random per created session);
a commit, and a visit's record that releases the claim, must name it with the epoch and job id
(see :mod:`.fold_commit`), and a retried job passes it to its next claim, which raises
SessionNotFoundError if the id names another session by then.

**Whose clock.** Lease ends are set and compared on the database's clock, never a worker's
own: a worker whose clock runs ahead would take over a live lease (the healthy fold then goes
stale), one whose clock runs behind would hold a dead one too long. The store's ``clock``, when
a test injects one, replaces it.

``force=True`` (the inline overflow fallback) always claims: it raises the epoch under any live
lease, so an in-flight background fold of the same session fails its commit as stale.

**Batch folds** (:mod:`.batches`): a fold waiting on a provider's batch API keeps its claim, its
lease running to the batch's deadline, so a claim without ``force`` finds it live
(``newer-claim``) and never takes it over as abandoned before then. A claim that does take it
(forced, or past the deadline) clears the session's batch mark: the batch's answer commits
nothing.

**Abandoned claims.** A claim whose lease expired while ``claimed_by`` is still set was never
finished: its worker died mid-fold (or the store was unreachable when it tried to write). Every
claim that takes such a claim over counts it in ``sessions.abandoned_folds``; a committed fold,
or a visit recorded by the claim's holder, sets the count back to 0, and so does resuming the
session (``set_paused(sid, False)``). The count is per session, not per broker job: a fold that
kills its worker every time is enqueued again under a new job id after each lease, and only the
store sees that these are the same failure. With ``max_abandoned=N`` a claim that finds (or, by
its takeover, makes) the count ``>= N`` refuses with status ``abandoned`` and claims nothing; it
still ends the dead claim (counted once) and raises the epoch, so the dead holder, should it
wake up, commits nothing. The caller gives the session up (the workers dead-letter and pause
it). ``force=True`` counts a takeover but is never refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, cast

import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError
from sqlalchemy.engine import Connection

from .db import LeaseClock
from .results import Claim
from .schema import compaction_records
from .sessions import lock_session, update_session

__all__ = [
    "DEFAULT_LEASE_S",
    "NO_BATCH",
    "check_incarnation",
    "check_job_id",
    "claim_locked",
    "claim_session",
    "committed_fold_record",
    "earlier_incarnation",
]

#: The session row's batch mark, cleared (see :mod:`.batches`): whoever takes or releases the
#: claim a batch fold waits under ends its wait.
NO_BATCH: Mapping[str, Any] = {"batch": None, "batch_deadline": None}

#: Longer than a fold job may run (the workers' task time limit), shorter than a broker's
#: visibility timeout, so a killed job's session is free again before its message is redelivered.
DEFAULT_LEASE_S = 300.0


def check_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not job_id or len(job_id) > 255:
        raise InvalidInputError(f"a job id must be a string of 1 to 255 characters, "
                                f"got {job_id!r:.80}")
    return job_id


_COMMITTED_FOLD = (
    sa.select(compaction_records.c.id)
    .where(compaction_records.c.session_id == sa.bindparam("sid"),
           compaction_records.c.job_id == sa.bindparam("job_id"),
           compaction_records.c.outcome == "folded")
    .order_by(compaction_records.c.id)
    .limit(1))


def committed_fold_record(conn: Connection, sid: str, job_id: str) -> int | None:
    """The id of the record of a fold this job committed, if it did."""
    record: int | None = conn.execute(_COMMITTED_FOLD, {"sid": sid, "job_id": job_id}).scalar()
    return record


def check_max_abandoned(max_abandoned: object) -> int | None:
    if max_abandoned is not None and (isinstance(max_abandoned, bool)
                                      or not isinstance(max_abandoned, int) or max_abandoned < 1):
        raise InvalidInputError(f"max_abandoned must be a positive integer or None, "
                                f"got {max_abandoned!r}")
    return max_abandoned


def check_incarnation(incarnation: object) -> int | None:
    if incarnation is not None and (isinstance(incarnation, bool)
                                    or not isinstance(incarnation, int)):
        raise InvalidInputError(f"incarnation must be an integer, got {incarnation!r}")
    return incarnation


def earlier_incarnation(sid: str, planned: int | None, current: int, *,
                        what: str = "the fold was planned") -> str | None:
    """Why work meant for incarnation ``planned`` may not land in the session ``sid`` names now
    (None when it may: the same incarnation, or none named)."""
    if planned is None or planned == current:
        return None
    return (f"{what} on an earlier session {sid!r} (incarnation {planned}), which was "
            f"deleted; the id now names a new session (incarnation {current})")


def claim_locked(conn: Connection, sid: str, job_id: str, *, enqueued_epoch: int | None,
                 lease_s: float, force: bool, clock: LeaseClock,
                 max_abandoned: int | None = None, incarnation: int | None = None) -> Claim:
    """Claim ``sid`` for ``job_id`` under the session lock (see the module doc and
    :func:`claim_session`, which also gives the session row as the claim left it)."""
    return claim_session(conn, sid, job_id, enqueued_epoch=enqueued_epoch, lease_s=lease_s,
                         force=force, clock=clock, max_abandoned=max_abandoned,
                         incarnation=incarnation)[0]


def claim_session(conn: Connection, sid: str, job_id: str, *, enqueued_epoch: int | None,
                  lease_s: float, force: bool, clock: LeaseClock,
                  max_abandoned: int | None = None,
                  incarnation: int | None = None) -> tuple[Claim, Mapping[str, Any]]:
    """Claim ``sid`` for ``job_id`` under the session lock (see the module doc), and the
    session row as this transaction now holds it (column → value, the claim's own update
    applied): a fold plans on it without reading the row a second time.

    ``clock`` gives the lease time (the database's clock: see the module doc), read once the
    row lock is held, so a claim that queued behind another writer does not start its lease
    in the past. ``incarnation``: the session incarnation the job was enqueued for (a retry
    passes the one it claimed before); SessionNotFoundError if the id names another one now.
    """
    if enqueued_epoch is not None and (isinstance(enqueued_epoch, bool)
                                       or not isinstance(enqueued_epoch, int)):
        raise InvalidInputError(f"enqueued_epoch must be an integer, got {enqueued_epoch!r}")
    if not isinstance(lease_s, int | float) or not math.isfinite(lease_s) or lease_s <= 0:
        raise InvalidInputError(f"lease_s must be a positive number of seconds, got {lease_s!r}")
    max_abandoned = check_max_abandoned(max_abandoned)
    incarnation = check_incarnation(incarnation)
    row = lock_session(conn, sid)
    gone = earlier_incarnation(sid, incarnation, row.incarnation, what="this job was enqueued")
    if gone is not None:
        # The session this job was about no longer exists: the same answer as for any deleted
        # session, and nothing claimed in the new one.
        raise SessionNotFoundError(f"job {job_id!r} claims nothing: {gone}")
    now = clock(conn)
    live = row.claimed_by is not None and row.claim_expires_at is not None \
        and row.claim_expires_at > now
    # A claim still set past its lease: its holder never finished (see the module doc).
    dead = row.claimed_by is not None and not live
    abandoned = row.abandoned_folds + (1 if dead else 0)

    def refuse(status: str, detail: str) -> tuple[Claim, Mapping[str, Any]]:
        return Claim(status=status, session_id=sid, job_id=job_id,  # type: ignore[arg-type]
                     epoch=row.fold_epoch, revision=row.revision, incarnation=row.incarnation,
                     holder=row.claimed_by if live else None,
                     expires_at=row.claim_expires_at if live else None, detail=detail,
                     abandoned_folds=row.abandoned_folds), cast(Mapping[str, Any], row._mapping)

    if not force:
        if committed_fold_record(conn, sid, job_id) is not None:
            return refuse("already-committed", f"job {job_id!r} already committed its fold")
        if live:
            return refuse("newer-claim", f"job {row.claimed_by!r} holds the session until "
                          f"{row.claim_expires_at.isoformat(timespec='seconds')}")
        own_retry = row.claimed_by == job_id  # our own earlier attempt died; its lease expired
        if enqueued_epoch is not None and row.fold_epoch > enqueued_epoch and not own_retry:
            return refuse("newer-claim", f"the session was claimed (epoch {row.fold_epoch}) "
                          f"after this job was enqueued (epoch {enqueued_epoch})")
        if max_abandoned is not None and abandoned >= max_abandoned:
            # End the dead claim here (counted once, its holder fenced off by the new epoch),
            # and claim nothing: the caller gives the session up.
            epoch = row.fold_epoch + 1
            ended = {"fold_epoch": epoch, "claimed_by": None, "claim_expires_at": None,
                     "abandoned_folds": abandoned, "updated_at": now, **NO_BATCH}
            update_session(conn, sid, ended)
            return Claim(status="abandoned", session_id=sid, job_id=job_id, epoch=epoch,
                         revision=row.revision, incarnation=row.incarnation,
                         abandoned_folds=abandoned,
                         detail=f"the fold of this session was abandoned {abandoned} times in "
                                f"a row (worker lost; max {max_abandoned})"), \
                {**row._mapping, **ended}
    epoch = row.fold_epoch + 1
    expires = now + timedelta(seconds=float(lease_s))
    # A fold that waited on a batch under the claim taken here waits no more: its collection
    # finds the claim gone and commits nothing (the new epoch fences it off as well).
    claimed = {"fold_epoch": epoch, "claimed_by": job_id, "claim_expires_at": expires,
               "abandoned_folds": abandoned, "updated_at": now, **NO_BATCH}
    update_session(conn, sid, claimed)
    return Claim(status="claimed", session_id=sid, job_id=job_id, epoch=epoch,
                 revision=row.revision, incarnation=row.incarnation, holder=job_id,
                 expires_at=expires,
                 abandoned_folds=abandoned), {**row._mapping, **claimed}
