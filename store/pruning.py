"""Pruning by the retention rules: what the store forgets, and when, so that nothing grows
without bound on live sessions.

Three tables grow with every live session's traffic, whatever its window does; :func:`prune`
(``SessionStore.prune``, run by ``sessionfold prune`` and by the scheduler's sweep) keeps each
to a rule (:class:`RetentionRules`)::

    append_keys          by age: a key older than ``append_keys_s`` is deleted. A keyed append
                         retried after that is not recognised as a retry: it is appended again
                         (its tool_use ids, still in tool_use_ids, are refused as reused).
    compaction_records   by count and age, per session: a no-op visit's record (outcome
                         nothing-to-fold, refused or stale) is deleted once it is beyond the
                         session's newest ``visit_records`` no-op records AND older than
                         ``visit_records_s``. Never a ``folded`` record (what a fold changed, and
                         what "already-committed" finds by job id), never a record a span names
                         (a row of ``folds`` with the same job id and revision). The newest
                         record, the one ``sessions.last_visit_*`` describes, is always kept.
    dead_letters         by age: older than ``dead_letters_s``; and at once when the session it
                         names no longer exists (a worker that gave up after the delete).

A refusal whose record is pruned stays latched: ``refusal_latches`` keeps the span's
fingerprint and reason, so the summarizer is still not paid twice for it.

Bounded batches: every statement deletes at most ``batch`` rows in a transaction of its own
(on SQLite a short ``BEGIN IMMEDIATE``, never one long write lock), oldest first, so a pass can
stop anywhere (``max_batches``) and the next one carries on. No session row is locked: the rows
deleted are never updated, and what a concurrent fold or append writes is newer than anything
a rule selects. Running two prunes at once is harmless (the second finds less to delete).
The same SQL runs on both backends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError
from sqlalchemy.engine import Connection

from .db import Database
from .results import PruneReport
from .schema import append_keys, compaction_records, dead_letters, folds, sessions
from .sessions import check_session_id

__all__ = ["MAX_PRUNE_BATCH", "RetentionRules", "check_batch", "check_max_batches", "parse_resume",
           "prune"]

#: The largest ``batch`` a prune takes (rows deleted per transaction).
MAX_PRUNE_BATCH = 10_000
#: Sessions read per page while looking for ones with records to prune (bound parameters of
#: one statement: SQLite caps them).
_PAGE = 500

_DAY = 24 * 3600.0
#: The steps of a pass, in order (a ``resume`` cursor names one: ``"STEP:"``, and for the
#: visit records ``"records:SESSION"``, the last session done).
_STEPS = ("append_keys", "dead_letters", "orphans", "records")
#: A rule, as the SELECT of the keys of the rows it deletes.
_Victims = sa.Select[tuple[int]] | sa.Select[tuple[str, str]]


def _positive_seconds(name: str, value: object, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        allowed = "a finite number of seconds >= 0" if zero else "a positive number of seconds"
        raise InvalidInputError(f"retention {name} must be {allowed}, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class RetentionRules:
    """How long the store keeps what grows on live sessions (see the module doc)::

        RetentionRules()                                     # the defaults
        RetentionRules(append_keys_s=3600, visit_records=20) # keys for an hour, 20 visits

    ``append_keys_s``: how long an append key deduplicates retries (default 1 day).
    ``visit_records``: no-op visit records always kept per session, newest first (default 100).
    ``visit_records_s``: older no-op records are kept this long too (default 1 day; 0: only the
    count keeps them). ``dead_letters_s``: how long a dead letter is kept (default 30 days).
    InvalidInputError for a value outside those ranges.
    """

    append_keys_s: float = _DAY
    visit_records: int = 100
    visit_records_s: float = _DAY
    dead_letters_s: float = 30 * _DAY

    def __post_init__(self) -> None:
        _positive_seconds("append_keys_s", self.append_keys_s)
        _positive_seconds("visit_records_s", self.visit_records_s, zero=True)
        _positive_seconds("dead_letters_s", self.dead_letters_s)
        if isinstance(self.visit_records, bool) or not isinstance(self.visit_records, int) \
                or self.visit_records < 1:
            raise InvalidInputError(f"retention visit_records must be a whole number >= 1 (the "
                                    f"newest record is always kept), got {self.visit_records!r}")


def check_batch(batch: object) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_PRUNE_BATCH:
        raise InvalidInputError(f"a prune batch is a whole number from 1 to {MAX_PRUNE_BATCH}, "
                                f"got {batch!r}")
    return batch


class _Budget:
    """Transactions a pass may still open (None: no limit)."""

    def __init__(self, max_batches: int | None) -> None:
        self.limit = max_batches
        self.spent = 0

    def take(self) -> bool:
        if self.limit is not None and self.spent >= self.limit:
            return False
        self.spent += 1
        return True


@dataclass
class _Counts:
    append_keys: int = 0
    visit_records: int = 0
    dead_letters: int = 0


def check_max_batches(max_batches: object) -> int | None:
    # Two at least: a pass over the visit records reads a page of sessions, then deletes.
    if max_batches is not None and (isinstance(max_batches, bool)
                                    or not isinstance(max_batches, int) or max_batches < 2):
        raise InvalidInputError(f"max_batches must be an integer >= 2 (a page of sessions read, "
                                f"then a delete) or None, got {max_batches!r}")
    return max_batches


def parse_resume(resume: object) -> tuple[int, str]:
    """The step and session a ``resume`` cursor names (None: the start of a pass)."""
    if resume is None:
        return 0, ""
    if isinstance(resume, str):
        step, sep, after = resume.partition(":")
        if sep and step in _STEPS and (not after or step == _STEPS[-1]):
            return _STEPS.index(step), check_session_id(after) if after else ""
    raise InvalidInputError(f"resume must be the cursor a PruneReport gave, got {resume!r:.80}")


def prune(db: Database, rules: RetentionRules, *, now: datetime, batch: int, dry_run: bool,
          max_batches: int | None, resume: str | None) -> PruneReport:
    """Apply ``rules`` as of ``now`` (see the module doc); ``dry_run`` counts, deletes nothing.

    The steps run in order: the age rules (append keys, old dead letters, orphaned ones), then
    the visit records, session by session in id order. At most ``max_batches`` transactions
    (None: until done): an unfinished pass answers ``complete=False`` and a ``resume`` cursor
    to pass back, naming the step it stopped in (an age rule simply goes on, oldest first) and
    in the visit records the last session done. Every call with a cursor makes progress.
    """
    start, after = parse_resume(resume)
    budget = _Budget(max_batches)
    counts = _Counts()
    records_cut = now - timedelta(seconds=rules.visit_records_s)

    def report(step: int | None, cursor: str = "") -> PruneReport:
        return PruneReport(append_keys=counts.append_keys, visit_records=counts.visit_records,
                           dead_letters=counts.dead_letters, batches=budget.spent,
                           dry_run=dry_run, complete=step is None,
                           resume=None if step is None else f"{_STEPS[step]}:{cursor}")

    letters_cut = now - timedelta(seconds=rules.dead_letters_s)
    by_age: list[tuple[sa.Table, _Victims, str]] = [
        (append_keys, _old_append_keys(now - timedelta(seconds=rules.append_keys_s)),
         "append_keys"),
        (dead_letters, _old_dead_letters(letters_cut), "dead_letters"),
        (dead_letters, _orphan_dead_letters(letters_cut), "dead_letters"),
    ]
    for step in range(start, len(by_age)):
        table, victims, field = by_age[step]
        if not _drain(db, table, victims, field, counts, budget, batch, dry_run):
            return report(step)
    records = len(by_age)
    # ``after``: the last session done ("" sorts before every id, and no id is empty).
    while True:
        if not budget.take():
            return report(records, after)
        with db.read() as conn:
            page = list(conn.execute(
                sa.select(sessions.c.id).where(sessions.c.id > after)
                .order_by(sessions.c.id).limit(_PAGE)).scalars())
            due = set(_sessions_with_prunable_records(conn, page, rules, records_cut))
        for i, sid in enumerate(page):
            if sid in due and not _drain(db, compaction_records,
                                         _prunable_records(sid, rules, records_cut),
                                         "visit_records", counts, budget, batch, dry_run):
                return report(records, page[i - 1] if i else after)
        if len(page) < _PAGE:
            return report(None)
        after = page[-1]


def _drain(db: Database, table: sa.Table, victims: _Victims, field: str, counts: _Counts,
           budget: _Budget, batch: int, dry_run: bool) -> bool:
    """Delete the rows of ``table`` that ``victims`` names by key, ``batch`` rows per
    transaction, until none is left (dry run: count them, in one read). False when the budget
    ran out first."""
    if dry_run:
        if not budget.take():
            return False
        with db.read() as conn:
            found = conn.execute(sa.select(sa.func.count()).select_from(
                victims.subquery())).scalar_one()
        setattr(counts, field, getattr(counts, field) + int(found))
        return True
    while True:
        if not budget.take():
            return False
        with db.write() as conn:
            deleted = _delete(conn, table, victims.limit(batch))
        setattr(counts, field, getattr(counts, field) + deleted)
        if deleted < batch:
            return True


def _delete(conn: Connection, table: sa.Table, victims: _Victims) -> int:
    """Delete the rows of ``table`` whose key (the columns ``victims`` selects) it selects."""
    # SKIP LOCKED (PostgreSQL; SQLite's one writer needs none): rows another transaction is
    # deleting (delete_session) are left to it, so the two never wait on each other's rows in
    # opposite orders (a deadlock); what is skipped is found by the next pass.
    victims = victims.with_for_update(skip_locked=True)
    key = [table.c[c.name] for c in victims.selected_columns]
    where = key[0].in_(victims) if len(key) == 1 else sa.tuple_(*key).in_(victims)
    return int(conn.execute(table.delete().where(where)).rowcount)


# --- the rules, as SELECTs of the keys to delete, oldest first ------------------------------
# Each selects from an alias of its table: the DELETE wraps it as "key IN (SELECT … LIMIT n)",
# and a subquery over the same table name would be correlated to the DELETE's target.

def _old_append_keys(cut: datetime) -> sa.Select[tuple[str, str]]:
    k = append_keys.alias("k")
    return (sa.select(k.c.session_id, k.c.key).where(k.c.created_at < cut)
            .order_by(k.c.created_at))


def _old_dead_letters(cut: datetime) -> sa.Select[tuple[int]]:
    d = dead_letters.alias("d")
    return sa.select(d.c.id).where(d.c.created_at < cut).order_by(d.c.created_at, d.c.id)


def _orphan_dead_letters(cut: datetime) -> sa.Select[tuple[int]]:
    # Not the ones the age rule takes: a dry run counts each letter once.
    d = dead_letters.alias("d")
    alive = sa.exists().where(sessions.c.id == d.c.session_id)
    return sa.select(d.c.id).where(~alive, d.c.created_at >= cut).order_by(d.c.id)


def _no_op(table: sa.FromClause) -> sa.ColumnElement[bool]:
    # Said as NOT folded, in the very words of the partial index ix_records_visits: a literal,
    # not a bound parameter, or SQLite's planner cannot match the index's WHERE.
    return table.c.outcome != sa.literal_column("'folded'")


def _sessions_with_prunable_records(conn: Connection, page: list[str], rules: RetentionRules,
                                    cut: datetime) -> list[str]:
    """The sessions of ``page`` that may have records to prune: more no-op records than are
    kept, the oldest of them older than the cut (a cheap filter over the partial index; the
    delete itself applies the exact rule)."""
    if not page:
        return []
    r = compaction_records.alias("r")
    query = (sa.select(r.c.session_id)
             .where(r.c.session_id.in_(page), _no_op(r))
             .group_by(r.c.session_id)
             .having(sa.and_(sa.func.count() > rules.visit_records,
                             sa.func.min(r.c.created_at) < cut)))
    return list(conn.execute(query).scalars())


def _prunable_records(sid: str, rules: RetentionRules, cut: datetime) -> sa.Select[tuple[int]]:
    """The no-op records of ``sid`` beyond its newest ``visit_records`` ones, older than
    ``cut``, that no span names."""
    r = compaction_records.alias("r")
    newer = compaction_records.alias("newer")
    # The id of the oldest no-op record kept by count; NULL (nothing pruned) with fewer.
    oldest_kept = (sa.select(newer.c.id)
                   .where(newer.c.session_id == sid, _no_op(newer))
                   .order_by(newer.c.id.desc())
                   .offset(rules.visit_records - 1).limit(1)
                   .scalar_subquery())
    named = sa.exists().where(folds.c.session_id == r.c.session_id,
                              folds.c.job_id == r.c.job_id, folds.c.revision == r.c.revision)
    return (sa.select(r.c.id)
            .where(r.c.session_id == sid, _no_op(r), r.c.id < oldest_kept,
                   r.c.created_at < cut, ~named)
            .order_by(r.c.id))
