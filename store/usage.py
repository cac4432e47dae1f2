"""Provider-reported usage: the session's measured size and its calibration.

A report names the highest ledger seq and the window revision its request was built from. It is
taken as the measured size unless it is stale:

- built on a revision older than the last fold (``fold_revision``): it measured a window that
  no longer exists, so it must not overwrite the size the fold left;
- older, as ``(revision, seq)``, than the report already stored: reports can arrive out of order
  (a batch from a slow scheduler), and the newest one wins.

An accepted report also calibrates the estimate (``a × estimate + b``): the estimate of the
request is the system prompt plus the window items up to ``seq`` as they are now (after the last
fold nothing older than the report can have changed, so this is the window the request carried,
up to the clipping of items appended since).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError, UsageUnmeasurableError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import Calibration, reported_prompt_tokens
from sqlalchemy.engine import Connection, Row

from .results import UsageReport, UsageResult
from .schema import sessions, window_items
from .sessions import current_tokens, lock_session

__all__ = ["latest_per_session", "record_usage_locked", "window_tokens_split"]

log = logging.getLogger(__name__)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def window_tokens_split(conn: Connection, sid: str, seq: int) -> tuple[int, int]:
    """Token estimate of the window items up to ``seq`` and after it, in one query."""
    upto = sa.func.coalesce(sa.func.sum(sa.case(
        (window_items.c.start_seq <= seq, window_items.c.tokens), else_=0)), 0)
    after = sa.func.coalesce(sa.func.sum(sa.case(
        (window_items.c.start_seq > seq, window_items.c.tokens), else_=0)), 0)
    row = conn.execute(sa.select(upto, after).where(window_items.c.session_id == sid)).one()
    return int(row[0]), int(row[1])


def _is_stale(row: Row[Any], seq: int, revision: int) -> bool:
    if revision < row.fold_revision:
        return True
    if row.measured_revision is None:
        return False
    return (revision, seq) < (row.measured_revision, row.measured_seq)


def record_usage_locked(conn: Connection, sid: str, usage: Any, *, seq: int, revision: int,
                        now: datetime) -> UsageResult:
    """Apply one report under the session lock (see the module doc)."""
    _check_int("seq", seq)
    _check_int("revision", revision)
    row = lock_session(conn, sid)
    if seq >= row.next_seq:
        raise InvalidInputError(
            f"usage report names seq {seq}, but session {sid!r} has ledger seqs "
            f"0–{row.next_seq - 1}" if row.next_seq else
            f"usage report names seq {seq}, but session {sid!r} has an empty ledger")
    if revision > row.revision:
        raise InvalidInputError(
            f"usage report names window revision {revision}, but session {sid!r} is at "
            f"revision {row.revision}")
    policy = FoldPolicy.from_json(row.policy)
    reported = reported_prompt_tokens(usage, measure=policy.measure)
    if reported is None or _is_stale(row, seq, revision):
        return UsageResult(accepted=False, current_tokens=row.current_tokens)

    upto, after = window_tokens_split(conn, sid, seq)
    calibration = Calibration.model_validate(row.calibration).observe(
        row.system_tokens + upto, reported)
    current = current_tokens(measured_tokens=reported, pending_tokens=after,
                             system_tokens=row.system_tokens, window_tokens=row.window_tokens,
                             calibration=calibration)
    conn.execute(sessions.update().where(sessions.c.id == sid).values(
        measured_tokens=reported, measured_seq=seq, measured_revision=revision,
        pending_tokens=after, calibration=calibration.to_json(), current_tokens=current,
        updated_at=now))
    return UsageResult(accepted=True, current_tokens=current)


def latest_per_session(reports: Sequence[UsageReport]) -> list[UsageReport]:
    """The newest report of each session, by (revision, seq), later entries winning ties.

    Sorted by session id: a batch locks its sessions in one order, so two batches never deadlock.
    """
    latest: dict[str, UsageReport] = {}
    for report in reports:
        if not isinstance(report, UsageReport):
            raise InvalidInputError(
                f"record_usage_batch takes UsageReport values, got {type(report).__name__}")
        held = latest.get(report.session_id)
        if held is None or (report.revision, report.seq) >= (held.revision, held.seq):
            latest[report.session_id] = report
    return [latest[sid] for sid in sorted(latest)]


def record_batch_locked(conn: Connection, reports: Sequence[UsageReport], *,
                        now: datetime) -> int:
    """Apply the latest report per session; returns how many were accepted.

    A report for a deleted session, or one that measured nothing (zero usage), is skipped with a
    log line rather than failing the batch: the other sessions' reports are still good.
    """
    accepted = 0
    for report in latest_per_session(reports):
        try:
            result = record_usage_locked(conn, report.session_id, report.usage,
                                         seq=report.seq, revision=report.revision, now=now)
        except (SessionNotFoundError, UsageUnmeasurableError, InvalidInputError) as exc:
            log.warning("usage report for session %r skipped: %s", report.session_id, exc)
            continue
        accepted += result.accepted
    return accepted
