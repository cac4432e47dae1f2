"""Provider-reported usage: the session's measured size and its calibration.

A report names the highest ledger seq and the window revision its request was built from. It is
taken as the measured size unless it is stale:

- built on a revision older than the last fold (``fold_revision``): it measured a window that
  no longer exists, so it must not overwrite the size the fold left;
- older, as ``(revision, seq)``, than the report already stored: reports can arrive out of order
  (a batch from a slow scheduler), and the newest one wins
  (:func:`~sessionfold.core.tokens.supersedes`).

An accepted report also calibrates the estimate (``a × estimate + b``): the estimate of the
request is the system prompt plus the window items up to ``seq`` as they are now (after the last
fold nothing older than the report can have changed, so this is the window the request carried,
up to the clipping of items appended since).

Batches (the scheduler writes one per stream read) take three round trips whatever their size:
one ``SELECT … FOR NO KEY UPDATE`` of the sessions' rows in id order (two batches lock in the same
order, so they cannot deadlock), one aggregate of the window tokens after each report's seq,
and one ``executemany`` of the updates (the driver's own, with the values bound as SQLAlchemy would
bind them: its per-row parameter processing was most of the statement's cost). The rows' gates
(:class:`~.results.SessionGate`) come back from the same ``SELECT``, so a scheduler decides on
what it just wrote without reading it again. A single report is a batch of one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError, SessionfoldError, SessionNotFoundError
from sessionfold.core.tokens import (
    Calibration,
    measured_prompt_tokens,
    reported_prompt_tokens,
    supersedes,
)
from sqlalchemy.engine import Connection, Dialect, Row

from .engine import json_dumps
from .results import SessionGate, UsageReport, UsageResult
from .schema import sessions, window_items
from .sessions import measured_current_tokens

__all__ = ["apply_reports", "latest_per_session", "tokens_after"]

log = logging.getLogger(__name__)

#: Below SQLite's default limit of 32,766 bound parameters per statement.
_PAIRS_PER_QUERY = 5000

_s = sessions
# The policy's ``measure`` alone, read in the database: parsing each row's whole policy was a
# fifth of a batch's cost.
_LOCK_COLUMNS = (_s.c.id, _s.c.policy["measure"].as_string().label("measure"), _s.c.next_seq,
                 _s.c.revision, _s.c.fold_revision, _s.c.measured_seq, _s.c.measured_revision,
                 _s.c.system_tokens, _s.c.window_tokens, _s.c.calibration, _s.c.current_tokens,
                 # the gate's (a scheduler's batch write hands them back: no second read)
                 _s.c.incarnation, _s.c.created_at, _s.c.paused, _s.c.trigger_tokens)
_UPDATE = (
    _s.update().where(_s.c.id == sa.bindparam("b_id")).values(
        measured_tokens=sa.bindparam("b_measured"), measured_seq=sa.bindparam("b_seq"),
        measured_revision=sa.bindparam("b_revision"), pending_tokens=sa.bindparam("b_pending"),
        calibration=sa.bindparam("b_calibration", type_=sa.JSON()),
        current_tokens=sa.bindparam("b_current"), updated_at=sa.bindparam("b_now"))
)


@functools.lru_cache(maxsize=16)
def _update_sql(dialect: Dialect
                ) -> tuple[str, tuple[str, ...] | None, Callable[[Any], Any] | None]:
    """``_UPDATE`` as the driver takes it (compiled once per engine's dialect): its SQL, the
    parameter names in order for a positional paramstyle (None for a named one), and the
    timestamp's bind processor."""
    compiled = _UPDATE.compile(dialect=dialect)
    order = tuple(compiled.positiontup) if compiled.positiontup else None
    return str(compiled), order, _s.c.updated_at.type.bind_processor(dialect)


def _write_updates(conn: Connection, updates: list[dict[str, Any]], now: datetime) -> None:
    """``_UPDATE`` for each of ``updates`` (its ``b_*`` values but ``b_now``, the calibration
    already JSON text), stamped ``now``, as one ``executemany`` of the driver: SQLAlchemy's
    per-row parameter processing was most of the statement's cost. The values are what
    SQLAlchemy would bind: integers, the id and the JSON text as they are, the timestamp
    through its column type."""
    sql, order, stamp = _update_sql(conn.dialect)
    when = now if stamp is None else stamp(now)
    params: list[Any] = (
        [{**update, "b_now": when} for update in updates] if order is None else
        [tuple(when if name == "b_now" else update[name] for name in order)
         for update in updates])
    conn.exec_driver_sql(sql, params)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative integer, got {value!r}")
    return value


_TOKENS_AFTER = (
    sa.select(sa.func.coalesce(sa.func.sum(window_items.c.tokens), 0))
    .where(window_items.c.session_id == sa.bindparam("sid"),
           window_items.c.start_seq > sa.bindparam("seq")))


def tokens_after(conn: Connection, sid: str, seq: int) -> int:
    """Token estimate of the window items after ``seq`` (what was appended since a report)."""
    total = conn.execute(_TOKENS_AFTER, {"sid": sid, "seq": seq}).scalar_one()
    return int(total)


def _tokens_after_many(conn: Connection, wanted: Mapping[str, int]) -> dict[str, int]:
    """:func:`tokens_after` for many sessions in one query (one index range each)."""
    # Plain driver SQL: building a thousand SQLAlchemy comparisons costs far more than the
    # query. The (session, seq) pairs join window_items' primary key: one range each.
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    found: dict[str, int] = {}
    items = list(wanted.items())
    for start in range(0, len(items), _PAIRS_PER_QUERY):
        chunk = items[start:start + _PAIRS_PER_QUERY]
        values = ", ".join(f"({mark}, {mark})" for _ in chunk)
        params = tuple(x for pair in chunk for x in pair)
        rows = conn.exec_driver_sql(
            f"WITH wanted(sid, seq) AS (VALUES {values}) "
            "SELECT w.session_id, SUM(w.tokens) FROM wanted "
            "JOIN window_items w ON w.session_id = wanted.sid AND w.start_seq > wanted.seq "
            "GROUP BY w.session_id", params)
        found.update((sid, int(total or 0)) for sid, total in rows)
    return {sid: found.get(sid, 0) for sid in wanted}


def _refusal(row: Row[Any], report: UsageReport) -> str | None:
    """Why a report cannot be about this session at all (a caller error), or None."""
    if report.seq >= row.next_seq:
        held = f"ledger seqs 0–{row.next_seq - 1}" if row.next_seq else "an empty ledger"
        return f"usage report names seq {report.seq}, but session {row.id!r} has {held}"
    if report.revision > row.revision:
        return (f"usage report names window revision {report.revision}, but session "
                f"{row.id!r} is at revision {row.revision}")
    return None


def _is_stale(row: Row[Any], seq: int, revision: int) -> bool:
    if revision < row.fold_revision:
        return True
    held = None if row.measured_revision is None else (row.measured_revision, row.measured_seq)
    return not supersedes((revision, seq), held)


@dataclass(frozen=True, slots=True)
class _Taken:
    report: UsageReport
    reported: int
    row: Row[Any]


def apply_reports(conn: Connection, reports: Sequence[UsageReport], *, now: datetime,
                  strict: bool, gates: dict[str, SessionGate] | None = None
                  ) -> dict[str, UsageResult]:
    """Apply at most one report per session (see the module doc); results by session id.

    ``strict`` (a single report): a report naming an unknown session, an impossible seq or
    revision, or zero usage raises. Otherwise (a batch) such a report is skipped with a log line
    so the batch's other sessions still count.

    ``gates``: filled with the :class:`SessionGate` of every session the reports name that
    exists, as this transaction leaves it (its new size when its report was taken).
    """
    ordered = sorted(reports, key=lambda r: r.session_id)
    rows: dict[str, Any] = {row.id: row for row in conn.execute(
        sa.select(*_LOCK_COLUMNS).where(_s.c.id.in_([r.session_id for r in ordered]))
        .order_by(_s.c.id).with_for_update(key_share=True))}
    results: dict[str, UsageResult] = {}
    taken: list[_Taken] = []
    for report in ordered:
        try:
            row = rows.get(report.session_id)
            if row is None:
                raise SessionNotFoundError(f"no session {report.session_id!r} in the store")
            problem = _refusal(row, report)
            if problem:
                raise InvalidInputError(problem)
            measure = row.measure or "reported"
            reported = (reported_prompt_tokens(report.usage, measure=measure)
                        if report.prompt_tokens is None
                        else measured_prompt_tokens(report.prompt_tokens, measure=measure))
        except SessionfoldError as exc:
            if strict:
                raise
            log.warning("usage report for session %r skipped: %s", report.session_id, exc)
            continue
        if reported is None or _is_stale(row, report.seq, report.revision):
            results[report.session_id] = UsageResult(False, row.current_tokens)
        else:
            taken.append(_Taken(report, reported, row))

    # Items after the report's seq: none when it names the tail (no query needed then).
    after = _tokens_after_many(conn, {t.row.id: t.report.seq for t in taken
                                      if t.report.seq < t.row.next_seq - 1})
    updates: list[dict[str, Any]] = []
    for t in taken:
        pending = after.get(t.row.id, 0)
        estimate = t.row.system_tokens + t.row.window_tokens - pending
        calibration = Calibration.observe_json(t.row.calibration, estimate, t.reported)
        current = measured_current_tokens(t.reported, pending, calibration["a"],
                                          int(calibration["samples"]))
        updates.append({"b_id": t.row.id, "b_measured": t.reported, "b_seq": t.report.seq,
                        "b_revision": t.report.revision, "b_pending": pending,
                        "b_calibration": json_dumps(calibration), "b_current": current})
        results[t.row.id] = UsageResult(True, current)
    if updates:
        _write_updates(conn, updates, now)
    if gates is not None:
        for row in rows.values():
            result = results.get(row.id)
            gates[row.id] = SessionGate(
                row.id, row.incarnation, row.created_at, row.paused,
                row.current_tokens if result is None else result.current_tokens,
                row.trigger_tokens)
    return results


def check_report(sid: str, usage: Any, seq: object, revision: object,
                 model: str | None) -> UsageReport:
    return UsageReport(session_id=sid, usage=usage, seq=_check_int("seq", seq),
                       revision=_check_int("revision", revision), model=model)


def latest_per_session(reports: Sequence[UsageReport]) -> list[UsageReport]:
    """The newest report of each session, by (revision, seq), later entries winning ties."""
    latest: dict[str, UsageReport] = {}
    for report in reports:
        if not isinstance(report, UsageReport):
            raise InvalidInputError(
                f"record_usage_batch takes UsageReport values, got {type(report).__name__}")
        held = latest.get(report.session_id)
        if supersedes((report.revision, report.seq),
                      None if held is None else (held.revision, held.seq)):
            latest[report.session_id] = report
    return list(latest.values())
