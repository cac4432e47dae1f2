"""The transactions of one fold visit, behind :class:`~.store.SessionStore`'s fold methods.

A visit crosses into the store twice: :func:`begin_fold` claims the session and reads what
planning needs in one transaction, and :func:`commit_fold` or :func:`record_visit` writes what
the visit came to (a lost race writes its ``stale`` record in a second one). A fold that waits
on a provider's batch API keeps its claim (:func:`hold_for_batch`) and takes it up again to land
(:func:`resume_batch`). Each function checks its arguments and opens its own transactions on
the store's :class:`~.db.Database`; the SQL run inside them is :mod:`.claims`,
:mod:`.fold_commit` and :mod:`.batches`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sessionfold.core.compact import FoldResult
from sessionfold.core.errors import InvalidInputError, StaleSpanError
from sessionfold.core.tokens import TokenCounter
from sessionfold.core.window import CompactionRecord
from sqlalchemy.engine import Connection

from . import batches, claims, fold_commit, sessions, windows
from .cache import ItemCache
from .db import Database
from .results import BatchMark, Claim, CommitResult, FoldContext

__all__ = ["begin_fold", "commit_fold", "hold_for_batch", "record_visit", "resume_batch"]


def _stale(sid: str, job_id: str | None, reason: str, what: str) -> StaleSpanError:
    by = f" by job {job_id!r}" if job_id else ""
    return StaleSpanError(f"{what} of session {sid!r}{by} is stale: {reason}; nothing of it was "
                          "written but its stale record")


def _planning(conn: Connection, sid: str, claim: Claim, row: Mapping[str, Any],
              item_cache: ItemCache) -> FoldContext:
    """What planning needs under a held ``claim``, read in the claim's transaction: the window,
    the session (``row``, the row the claim locked, as it left it) and the refusal latches."""
    window = windows.read_window(conn, sid, item_cache)
    info = sessions.session_info(row)
    latched = frozenset(fold_commit.latched(conn, sid, known=True))
    return FoldContext(claim, window=window, session=info, latched=latched)


def begin_fold(db: Database, item_cache: ItemCache, sid: str, job_id: str, *,
               enqueued_epoch: int | None, lease_s: float, force: bool,
               max_abandoned: int | None, incarnation: int | None) -> FoldContext:
    """:meth:`SessionStore.begin_fold <.store.SessionStore.begin_fold>`."""
    sid = sessions.check_session_id(sid)
    job_id = claims.check_job_id(job_id)
    with db.write() as conn:
        claim, row = claims.claim_session(
            conn, sid, job_id, enqueued_epoch=enqueued_epoch, lease_s=lease_s, force=force,
            clock=db.lease_now, max_abandoned=max_abandoned, incarnation=incarnation)
        if not claim.claimed:
            return FoldContext(claim)
        return _planning(conn, sid, claim, row, item_cache)


def commit_fold(db: Database, counter: TokenCounter, sid: str, result: FoldResult, *,
                epoch: int, job_id: str, incarnation: int) -> CommitResult:
    """:meth:`SessionStore.commit_fold <.store.SessionStore.commit_fold>`."""
    sid = sessions.check_session_id(sid)
    job_id = claims.check_job_id(job_id)
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise InvalidInputError(f"epoch must be an integer, got {epoch!r}")
    if claims.check_incarnation(incarnation) is None:
        raise InvalidInputError("commit_fold needs the incarnation of the claim")
    prepared = fold_commit.prepare_fold(result, counter)
    if prepared.edit.empty:
        record_id, revision = record_visit(db, sid, prepared.record, job_id=job_id,
                                           epoch=epoch, incarnation=incarnation)
        return CommitResult(session_id=sid, revision=revision, spans=[], record_id=record_id)
    try:
        with db.write() as conn:
            committed = fold_commit.commit_locked(
                conn, sid, prepared, epoch=epoch, job_id=job_id, incarnation=incarnation,
                now=db.now())
    except fold_commit.Stale as lost:
        with db.write() as conn:
            fold_commit.record_visit_locked(
                conn, sid, prepared.record.as_stale(lost.reason), job_id=job_id,
                epoch=epoch, incarnation=incarnation, now=db.now(), latch=False)
        raise _stale(sid, job_id, lost.reason, "fold") from None
    return CommitResult(session_id=sid, revision=committed.revision, spans=committed.spans,
                        record_id=committed.record_id, duplicate=committed.duplicate,
                        lag_calls=committed.lag_calls)


def record_visit(db: Database, sid: str, record: CompactionRecord, *, job_id: str | None,
                 epoch: int | None, incarnation: int | None) -> tuple[int, int]:
    """:meth:`SessionStore.record_visit <.store.SessionStore.record_visit>`, answering (record
    id, the session's revision)."""
    sid = sessions.check_session_id(sid)
    if job_id is not None:
        job_id = claims.check_job_id(job_id)
    if (epoch is None) != (claims.check_incarnation(incarnation) is None):
        raise InvalidInputError("epoch and incarnation name the claim together: give both "
                                "or neither")
    with db.write() as conn:
        record_id, revision, gone = fold_commit.record_visit_locked(
            conn, sid, record, job_id=job_id, epoch=epoch, incarnation=incarnation,
            now=db.now())
    if gone is not None:
        raise _stale(sid, job_id, gone, "visit")
    return record_id, revision


def hold_for_batch(db: Database, claim: Claim, mark: BatchMark) -> None:
    """:meth:`SessionStore.hold_for_batch <.store.SessionStore.hold_for_batch>`."""
    if not isinstance(claim, Claim) or not claim.claimed:
        raise InvalidInputError("hold_for_batch takes the held claim of begin_fold")
    if not isinstance(mark, BatchMark) or mark.job_id != claim.job_id \
            or mark.epoch != claim.epoch:
        raise InvalidInputError("the batch mark must name the claim it is held under")
    try:
        with db.write() as conn:
            batches.hold_locked(conn, claim, mark, now=db.now())
    except batches.LostClaim as lost:
        raise _stale(claim.session_id, claim.job_id, lost.reason, "batch fold") from None


def resume_batch(db: Database, item_cache: ItemCache, sid: str, job_id: str, *, epoch: int,
                 incarnation: int) -> FoldContext:
    """:meth:`SessionStore.resume_batch <.store.SessionStore.resume_batch>`."""
    sid = sessions.check_session_id(sid)
    job_id = claims.check_job_id(job_id)
    if claims.check_incarnation(incarnation) is None or isinstance(epoch, bool) \
            or not isinstance(epoch, int):
        raise InvalidInputError("resume_batch needs the epoch and incarnation of the claim")
    with db.write() as conn:
        claim, row = batches.resume_locked(conn, sid, job_id, epoch=epoch,
                                           incarnation=incarnation)
        if not claim.claimed:
            return FoldContext(claim)
        return _planning(conn, sid, claim, row, item_cache)
