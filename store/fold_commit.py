"""Committing a fold, recording a visit, and reading spans, records and latches back.

A fold commit is one short transaction under the session row lock:

1. the session's incarnation must be the one the job claimed: an id deleted and created again
   names a new session whose epochs and item versions start over, so without this check a fold
   planned on the deleted session could pass steps 3 and 4 and replace the new one's items;
2. the same job committing again (a redelivery after its commit) is a no-op success;
3. the fence: the session's ``fold_epoch`` must still be the epoch this job claimed, and the job
   must still hold that claim (a newer claim, for example the inline fallback's, or the job's
   own recorded visit, which released it, makes this fold stale);
4. compare-and-set on every item the plan changes (replaced, masked, thinned): each
   ``(session_id, start_seq)`` row must still exist with the version the plan read. Appends only
   add items after the last one, so they never touch a planned item: a fold and concurrent
   appends commute, and only a competing fold (or claim) makes a plan stale;
5. delete the replaced items (one ``DELETE … RETURNING`` that is also step 4's read: a row
   it returns at another version, or a planned row it does not return, is the lost race), insert
   the new ones (with a fresh version: this commit's revision), write the spans (unique on
   session + seq range), the record and the refusal latches; under ``retain="discard"``
   blank the folded ledger rows and take them out of the search index;
6. bump the revision, fence usage reports older than it, take ``record.tokens_after`` as the
   measured size, clear the claim (and the batch mark of a fold that waited on a batch API
   under it: :mod:`.batches`).

A lost race rolls all of that back and writes only the visit's record (outcome ``stale``) in a
transaction of its own, then raises :class:`~sessionfold.core.errors.StaleSpanError`. A plan made
on a deleted session's earlier incarnation lands in the new session as that ``stale`` record
only (its detail says so), so the refusal is visible where an operator looks; if the id names no
session at all, the commit raises :class:`~sessionfold.core.errors.SessionNotFoundError` and
writes nothing.

A visit's record that names its claim (job id, epoch, incarnation) releases it when all three
are the session's now; one naming an earlier incarnation is written as ``stale`` instead, with
no latch and no release (:func:`record_visit_locked`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sessionfold.core.compact import FoldResult
from sessionfold.core.economics import next_trigger_tokens
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import Calibration, TokenCounter
from sessionfold.core.window import CompactionRecord, FoldEdit, WindowItem
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql.dml import ReturningDelete

from .claims import NO_BATCH, committed_fold_record, earlier_incarnation
from .codec import encode_message
from .notify import notify_window_change
from .results import StoredRecord, StoredSpan
from .schema import compaction_records, folds, ledger, refusal_latches, window_items
from .search import drop_chunks
from .sessions import current_tokens, load_session, lock_session, update_session
from .usage import tokens_after

__all__ = [
    "PreparedFold",
    "Stale",
    "commit_locked",
    "latched",
    "prepare_fold",
    "read_records",
    "read_spans",
    "record_visit_locked",
]


class Stale(Exception):
    """Internal: the fold lost its race (``reason`` says how). Becomes StaleSpanError."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PreparedFold:
    """A fold result checked for shape, with its inserted items encoded (no database access)."""

    def __init__(self, result: FoldResult, counter: TokenCounter) -> None:
        if not isinstance(result, FoldResult):
            raise InvalidInputError(
                f"commit_fold takes the FoldResult of fold_window, got {type(result).__name__}")
        self.result = result
        self.edit: FoldEdit = result.edit
        self.record: CompactionRecord = result.record
        _check_coverage(self.edit)
        if not self.edit.empty and self.record.outcome != "folded":
            raise InvalidInputError(
                f"a fold that changes the window must be recorded as 'folded', not "
                f"{self.record.outcome!r}")
        self.inserted: list[dict[str, Any]] = [
            {"start_seq": item.start_seq, "end_seq": item.end_seq, "kind": item.kind,
             "message": encode_message(item.message), "edits": list(item.edits),
             "tokens": item.tokens if item.tokens is not None else counter.message(item.message)}
            for item in self.edit.inserted
        ]
        window: Sequence[WindowItem] = result.window
        ends = [i.end_seq for i in window] or [i.end_seq for i in self.edit.inserted]
        #: The last ledger seq the plan saw; items after it were appended since.
        self.seen_seq: int | None = max(ends) if ends else None


def prepare_fold(result: FoldResult, counter: TokenCounter) -> PreparedFold:
    return PreparedFold(result, counter)


def _segments(items: Sequence[WindowItem], what: str) -> list[tuple[int, int]]:
    """The seq ranges ``items`` cover, merged; InvalidInputError if they overlap or are unsorted."""
    merged: list[tuple[int, int]] = []
    for item in items:
        if item.end_seq < item.start_seq:
            raise InvalidInputError(f"{what} item #{item.start_seq} ends before it starts "
                                    f"(end_seq {item.end_seq})")
        if merged and item.start_seq <= merged[-1][1]:
            raise InvalidInputError(f"{what} items overlap or are out of order at "
                                    f"#{item.start_seq}")
        if merged and item.start_seq == merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], item.end_seq)
        else:
            merged.append((item.start_seq, item.end_seq))
    return merged


def _check_coverage(edit: FoldEdit) -> None:
    """The inserted items must cover exactly the seqs of the replaced ones: no seq may be lost
    from the window or covered twice, whatever the planner did."""
    replaced = _segments(edit.replaced, "replaced")
    inserted = _segments(edit.inserted, "inserted")
    if replaced != inserted:
        raise InvalidInputError(
            f"the fold's inserted items cover seqs {inserted}, but its replaced items cover "
            f"{replaced}; a fold must cover exactly the seqs it replaces")


def _stored_span(row: Row[Any]) -> StoredSpan:
    m = row._mapping
    return StoredSpan(
        start_seq=m["start_seq"], end_seq=m["end_seq"], message_count=m["message_count"],
        fingerprint=m["fingerprint"], kind=m["kind"], model=m["model"], usage=m["usage"],
        retained=m["retained"], lost_identifiers=tuple(m["lost_identifiers"]),
        chars_before=m["chars_before"], chars_after=m["chars_after"], id=m["id"],
        session_id=m["session_id"], job_id=m["job_id"], epoch=m["epoch"],
        revision=m["revision"], created_at=m["created_at"], discarded_at=m["discarded_at"],
    )


def _stored_record(row: Row[Any]) -> StoredRecord:
    m = row._mapping
    record: StoredRecord = StoredRecord.model_validate({
        **m["record"], "id": m["id"], "session_id": m["session_id"], "job_id": m["job_id"],
        "epoch": m["epoch"], "revision": m["revision"], "created_at": m["created_at"],
    })
    return record


_INSERT_ITEMS = window_items.insert()
_INSERT_RECORD = compaction_records.insert().returning(compaction_records.c.id)
_INSERT_SPANS = folds.insert().returning(*folds.c, sort_by_parameter_order=True)


def _insert_record(conn: Connection, sid: str, record: CompactionRecord, *, job_id: str | None,
                   epoch: int | None, revision: int, now: datetime) -> int:
    inserted = conn.execute(_INSERT_RECORD, {
        "session_id": sid, "job_id": job_id, "epoch": epoch, "revision": revision,
        "trigger": record.trigger, "outcome": record.outcome,
        "record": record.model_dump(mode="json"), "created_at": now})
    return int(inserted.scalar_one())


def _latch(conn: Connection, sid: str, record: CompactionRecord, now: datetime) -> None:
    wanted = {r.fingerprint: r.reason for r in record.refusals if r.fingerprint}
    if not wanted:
        return
    held = set(conn.execute(sa.select(refusal_latches.c.fingerprint).where(
        refusal_latches.c.session_id == sid,
        refusal_latches.c.fingerprint.in_(list(wanted)))).scalars())
    rows = [{"session_id": sid, "fingerprint": fp, "reason": reason, "created_at": now}
            for fp, reason in wanted.items() if fp not in held]
    if rows:
        conn.execute(refusal_latches.insert(), rows)


#: Stretches a delete names as ranges; the starts of any further ones go in its list.
_MAX_RANGES = 4


def _delete_statement(ranges: int) -> ReturningDelete[Any]:
    """``DELETE … RETURNING`` of the items whose start is in one of ``ranges`` ranges
    (``lo0``/``hi0``…) or in the list ``starts``: built once per number of ranges (building it
    cost more than running it)."""
    start = window_items.c.start_seq
    terms = [start.between(sa.bindparam(f"lo{i}"), sa.bindparam(f"hi{i}"))
             for i in range(ranges)]
    terms.append(start.in_(sa.bindparam("starts", expanding=True)))
    return (window_items.delete()
            .where(window_items.c.session_id == sa.bindparam("sid"), sa.or_(*terms))
            .returning(window_items.c.start_seq, window_items.c.end_seq,
                       window_items.c.version, window_items.c.tokens))


_DELETES = [_delete_statement(n) for n in range(_MAX_RANGES + 1)]


def _starts_in(items: Sequence[WindowItem]) -> tuple[ReturningDelete[Any], dict[str, Any]]:
    """The delete of ``items`` (sorted, as the fold's edit lists them) and its parameters: a
    range for each stretch that covers its seqs without a gap (no other item can start inside
    one; a summarized span is one stretch), the other starts as a list. A range is far cheaper
    to run than a long list of parameters."""
    stretches: list[list[WindowItem]] = []
    for item in items:
        if stretches and item.start_seq == stretches[-1][-1].end_seq + 1:
            stretches[-1].append(item)
        else:
            stretches.append([item])
    long = [s for s in stretches if len(s) > 1][:_MAX_RANGES]
    named = {id(s) for s in long}
    params: dict[str, Any] = {
        "starts": [item.start_seq for s in stretches if id(s) not in named for item in s]}
    for i, s in enumerate(long):
        params[f"lo{i}"], params[f"hi{i}"] = s[0].start_seq, s[-1].start_seq
    return _DELETES[len(long)], params


def _delete_replaced(conn: Connection, sid: str, replaced: Sequence[WindowItem]) -> int:
    """Compare-and-set and delete in one statement: every planned item must still be there at
    its planned version (else :class:`Stale`, and the caller's rollback restores what this
    deleted). Returns the stored token estimate of the deleted items (what leaves the window).
    """
    planned = {item.start_seq: item for item in replaced}
    removed = 0
    deleted: set[int] = set()
    statement, params = _starts_in(replaced)
    for start, end, version, tokens in conn.execute(statement, {"sid": sid, **params}):
        item = planned.get(start)
        if item is None:  # inside a planned range: an item the plan never saw
            raise Stale(f"window item #{start} appeared among the planned ones (another fold "
                        "changed the window)")
        if version != item.version or end != item.end_seq:
            raise Stale(f"window item #{start} changed since the fold was planned "
                        f"(version {item.version} planned, {version} now)")
        deleted.add(start)
        removed += int(tokens)
    gone = [start for start in planned if start not in deleted]
    if gone:
        raise Stale(f"window item #{gone[0]} is gone (another fold replaced it)")
    return removed


#: The weight of the newest background fold in ``fold_lag_calls``' running mean.
LAG_WEIGHT = 0.3


def lag_calls(record: CompactionRecord, appended: int) -> float | None:
    """The calls a background fold (a ``threshold`` or ``idle`` visit) took to land, from the
    messages ``appended`` while it ran: two a call (the model's reply and what answers it).
    None for an inline fold: it runs on the agent's path and tells nothing of a worker's lag;
    nor for one that waited on a batch API (its wait was the batch's, chosen for the price)."""
    if record.forced or record.trigger not in ("threshold", "idle"):
        return None
    if record.economics and record.economics.get("batch"):
        return None
    return max(0, appended) / 2


def _fold_lag(row: Any, lag: float | None) -> dict[str, float]:
    """``fold_lag_calls`` after a fold that took ``lag`` calls to land: a running mean."""
    if lag is None:
        return {}
    before = row.fold_lag_calls
    if before is None:
        return {"fold_lag_calls": float(lag)}
    return {"fold_lag_calls": (1 - LAG_WEIGHT) * float(before) + LAG_WEIGHT * lag}


class Committed(NamedTuple):
    """What :func:`commit_locked` wrote: the window revision, the spans and the record, whether
    a redelivery found it written already, and the calls the fold took to land (None: an inline
    fold)."""

    revision: int
    spans: list[StoredSpan]
    record_id: int
    duplicate: bool
    lag_calls: float | None = None


def commit_locked(conn: Connection, sid: str, prepared: PreparedFold, *, epoch: int,
                  job_id: str, incarnation: int, now: datetime) -> Committed:
    """Steps 1–6 of the module doc.

    Raises :class:`Stale` (the caller rolls back and records the lost race).
    """
    row = lock_session(conn, sid)
    gone = earlier_incarnation(sid, incarnation, row.incarnation)
    if gone is not None:
        raise Stale(gone)
    done = committed_fold_record(conn, sid, job_id)
    if done is not None:
        written = [_stored_span(r) for r in conn.execute(
            sa.select(folds).where(folds.c.session_id == sid, folds.c.job_id == job_id)
            .order_by(folds.c.start_seq))]
        return Committed(row.revision, written, int(done), True)
    if row.fold_epoch != epoch:
        raise Stale(f"the session was claimed again since (epoch {row.fold_epoch} now, this fold "
                    f"claimed {epoch})")
    if row.claimed_by != job_id:
        raise Stale(f"job {job_id!r} no longer holds the claim of epoch {epoch} (its visit was "
                    "recorded, which released it)")

    edit = prepared.edit
    removed_tokens = _delete_replaced(conn, sid, edit.replaced)
    revision = row.revision + 1
    conn.execute(_INSERT_ITEMS,
                 [{"session_id": sid, "version": revision, **item} for item in prepared.inserted])

    policy = FoldPolicy.from_json(row.policy)
    discard = policy.retain == "discard"
    span_rows = [{
        "session_id": sid, "start_seq": s.start_seq, "end_seq": s.end_seq, "kind": s.kind,
        "message_count": s.message_count, "fingerprint": s.fingerprint, "model": s.model,
        "usage": s.usage.model_dump(mode="json"), "retained": not discard,
        "lost_identifiers": list(s.lost_identifiers), "chars_before": s.chars_before,
        "chars_after": s.chars_after, "job_id": job_id, "epoch": epoch, "revision": revision,
        "discarded_at": now if discard else None, "created_at": now,
    } for s in prepared.result.spans]
    spans: list[StoredSpan] = []
    if span_rows:
        try:
            spans = [_stored_span(r) for r in conn.execute(_INSERT_SPANS, span_rows)]
        except sa_exc.IntegrityError as exc:
            # The items passed the compare-and-set, so this is no race: the plan re-folds exactly
            # the range of an earlier span (the planner refuses that as only-existing-summary).
            ranges = ", ".join(f"#{s.start_seq}–#{s.end_seq}" for s in prepared.result.spans)
            raise Stale(f"a span over {ranges} is already recorded; a fold may not re-fold "
                        "exactly the range of an earlier one") from exc
        if discard:
            for s in prepared.result.spans:
                conn.execute(ledger.update().where(
                    ledger.c.session_id == sid, ledger.c.seq >= s.start_seq,
                    ledger.c.seq <= s.end_seq, ledger.c.discarded_at.is_(None),
                ).values(message=None, discarded_at=now))
                # Their text leaves the search index in this transaction too: a recall must
                # not find what the policy discarded.
                drop_chunks(conn, sid, s.start_seq, s.end_seq)
    record_id = _insert_record(conn, sid, prepared.record, job_id=job_id, epoch=epoch,
                               revision=revision, now=now)
    _latch(conn, sid, prepared.record, now)

    window_tokens = row.window_tokens - removed_tokens + sum(i["tokens"]
                                                             for i in prepared.inserted)
    seen = prepared.seen_seq if prepared.seen_seq is not None else row.next_seq - 1
    # Items after ``seen`` were appended while the fold ran; with none (the usual case: the
    # locked row's next seq follows the last one the plan saw) there is nothing to add up.
    pending = tokens_after(conn, sid, seen) if seen < row.next_seq - 1 else 0
    measured = prepared.record.tokens_after
    lag = lag_calls(prepared.record, row.next_seq - 1 - seen)
    update_session(conn, sid, dict(
        revision=revision, fold_revision=revision,
        measured_tokens=measured, measured_seq=seen, measured_revision=revision,
        pending_tokens=pending, window_tokens=window_tokens,
        current_tokens=current_tokens(
            measured_tokens=measured, pending_tokens=pending, system_tokens=row.system_tokens,
            window_tokens=window_tokens, calibration=Calibration.model_validate(row.calibration)),
        claimed_by=None, claim_expires_at=None, abandoned_folds=0, **NO_BATCH,
        last_visit_outcome=prepared.record.outcome,
        last_visit_tokens=prepared.record.measured_tokens, last_visit_at=now, updated_at=now,
        **_next_trigger(policy, prepared.record),
        **_fold_lag(row, lag),
    ))
    notify_window_change(conn, sid, row.incarnation, revision, "fold")
    return Committed(revision, spans, record_id, False, lag)


def record_visit_locked(conn: Connection, sid: str, record: CompactionRecord, *,
                        job_id: str | None, epoch: int | None, incarnation: int | None,
                        now: datetime, latch: bool = True) -> tuple[int, int, str | None]:
    """Write a visit's record; release the claim if it is this job's (same job, epoch and
    incarnation). Returns (record id, the session's revision, why the visit was stale or None).

    Releasing it means the visit ran to its end: the session's ``abandoned_folds`` goes back
    to 0. A record written without the claim (a job that stopped at it) leaves the count alone.

    A visit made on an earlier incarnation of the id (deleted since) is written as ``stale``
    with the reason, releases nothing and latches nothing: it judged another session's window.
    The caller raises StaleSpanError once the record is committed.

    Refusals carrying a span fingerprint are latched (unless ``latch=False``: a lost race's
    refusals were judged on a window that no longer exists).
    """
    if not isinstance(record, CompactionRecord):
        raise InvalidInputError(f"record must be a CompactionRecord, got {type(record).__name__}")
    row = lock_session(conn, sid)
    gone = earlier_incarnation(sid, incarnation, row.incarnation, what="the visit was made")
    if gone is not None:
        latch = False
        if record.outcome != "stale":  # a lost commit's record already says why
            record = record.as_stale(gone)
    record_id = _insert_record(conn, sid, record, job_id=job_id, epoch=epoch,
                               revision=row.revision, now=now)
    if latch:
        _latch(conn, sid, record, now)
    values: dict[str, Any] = {"last_visit_outcome": record.outcome,
                              "last_visit_tokens": record.measured_tokens,
                              "last_visit_at": now, "updated_at": now}
    if gone is None:
        values.update(_next_trigger(FoldPolicy.from_json(row.policy), record))
    ours = gone is None and incarnation is not None and job_id is not None \
        and row.claimed_by == job_id and epoch == row.fold_epoch
    if ours:
        values.update(claimed_by=None, claim_expires_at=None, abandoned_folds=0, **NO_BATCH)
    update_session(conn, sid, values)
    return record_id, row.revision, gone


def _next_trigger(policy: FoldPolicy, record: CompactionRecord) -> dict[str, int]:
    """The ``trigger_tokens`` column after this visit (the cost model may set the next visit
    below the policy's trigger: :func:`~sessionfold.core.economics.next_trigger_tokens`), in the
    visit's own transaction; nothing when the visit lost its race."""
    trigger = next_trigger_tokens(policy, record)
    return {} if trigger is None else {"trigger_tokens": trigger}


def read_spans(conn: Connection, sid: str) -> list[StoredSpan]:
    rows = conn.execute(sa.select(folds).where(folds.c.session_id == sid)
                        .order_by(folds.c.start_seq, folds.c.id)).all()
    if not rows:
        load_session(conn, sid)
    return [_stored_span(r) for r in rows]


def read_records(conn: Connection, sid: str) -> list[StoredRecord]:
    rows = conn.execute(sa.select(compaction_records)
                        .where(compaction_records.c.session_id == sid)
                        .order_by(compaction_records.c.id)).all()
    if not rows:
        load_session(conn, sid)
    return [_stored_record(r) for r in rows]


_LATCHED = sa.select(refusal_latches.c.fingerprint).where(
    refusal_latches.c.session_id == sa.bindparam("sid"))


def latched(conn: Connection, sid: str, *, known: bool = False) -> set[str]:
    """The fingerprints latched for ``sid``; SessionNotFoundError for no such session, unless
    ``known`` (the caller read the session in this transaction)."""
    rows = conn.execute(_LATCHED, {"sid": sid}).scalars().all()
    if not rows and not known:
        load_session(conn, sid)
    return set(rows)
