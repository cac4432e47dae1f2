"""SessionStore: the one object the workers and the client use (see docs/internals.md, "store").

Every method is one short transaction (a lost fold race writes its ``stale`` record in a second
one). Work that needs no lock (validating messages, counting tokens, encoding a fold) happens
before the transaction opens, so a session's write lock is held for SQL round trips only::

    store = SessionStore.from_url(None)         # DATABASE_URL's job is the entry point's
    store.migrate()
    store.create_session("agent-7", FoldPolicy(budget_tokens=32_000), system="You are ...")
    store.append("agent-7", [{"role": "user", "content": "hello"}], key="turn-1")
    window = store.read_window("agent-7")       # .messages(), .revision
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessionfold.core.compact import FoldResult
from sessionfold.core.errors import (
    InvalidInputError,
    SessionNotFoundError,
    StaleSpanError,
    StoreError,
)
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import TokenCounter, default_counter
from sessionfold.core.window import CompactionRecord
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine

from . import claims, dead_letters, export, folds, ledger, sessions, usage, windows
from .cache import DEFAULT_ITEMS, ItemCache
from .db import Clock, Database, utc_now
from .engine import create_store_engine, default_sqlite_url, normalize_url
from .migrate import check_schema, upgrade
from .results import (
    AppendResult,
    Claim,
    CommitResult,
    DeadLetter,
    LedgerEntry,
    SessionInfo,
    StoredRecord,
    StoredSpan,
    UsageReport,
    UsageResult,
    Window,
)

__all__ = ["SessionStore"]


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError(f"limit must be a positive integer, got {limit!r}")
    return limit


def _check_system(system: object) -> str:
    if not isinstance(system, str):
        raise InvalidInputError(f"system must be a string, got {type(system).__name__}")
    return system


class SessionStore:
    """Sessions, their ledgers and windows, folds and records, on SQLite or PostgreSQL."""

    def __init__(self, engine: Engine, *, counter: TokenCounter | None = None,
                 clock: Clock = utc_now, item_cache: int = DEFAULT_ITEMS) -> None:
        """``item_cache``: how many decoded window items to keep (0: decode every read)."""
        self.engine = engine
        self.counter = counter or default_counter()
        self.item_cache = ItemCache(item_cache)
        self._db = Database(engine, clock=clock)

    @classmethod
    def from_url(cls, url: str | URL | None, *, counter: TokenCounter | None = None,
                 clock: Clock = utc_now, echo: bool = False,
                 item_cache: int = DEFAULT_ITEMS) -> SessionStore:
        """A store on ``url``; None means the SQLite file ``./.sessionfold/sessionfold.db``."""
        if url is None:
            url = default_sqlite_url()
        return cls(create_store_engine(normalize_url(url), echo=echo), counter=counter,
                   clock=clock, item_cache=item_cache)

    def __repr__(self) -> str:
        return f"SessionStore({self.engine.url.render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        """Close the pooled connections (call in a forked child before first use, too)."""
        self.engine.dispose()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- schema ----------------------------------------------------------------------------

    def migrate(self) -> str:
        """Apply pending migrations; returns the schema revision reached."""
        with self._db.mapped_errors():
            reached = upgrade(self.engine)
        self._db.forget_schema()
        return reached

    def check_schema(self) -> str:
        """The schema revision, or SchemaError naming what to do (``sessionfold migrate``)."""
        with self._db.mapped_errors(), self.engine.connect() as conn:
            return check_schema(conn)

    # --- sessions --------------------------------------------------------------------------

    def create_session(self, sid: str, policy: FoldPolicy, system: str = "", *,
                       exist_ok: bool = False) -> SessionInfo:
        sid = sessions.check_session_id(sid)
        policy = sessions.check_policy(policy)
        system = _check_system(system)
        try:
            return self._create_session(sid, policy, system, exist_ok=exist_ok)
        except StoreError as exc:
            if not isinstance(exc.__cause__, sa_exc.IntegrityError):
                raise
            # PostgreSQL: a concurrent create of the same id won the insert. Look again.
            return self._create_session(sid, policy, system, exist_ok=exist_ok)

    def _create_session(self, sid: str, policy: FoldPolicy, system: str, *,
                        exist_ok: bool) -> SessionInfo:
        with self._db.write() as conn:
            try:
                existing = sessions.load_session(conn, sid)
            except SessionNotFoundError:
                sessions.insert_session(conn, sid, policy, system, now=self._db.now(),
                                        counter=self.counter)
                return sessions.session_info(sessions.load_session(conn, sid))
            if not exist_ok:
                raise InvalidInputError(f"session {sid!r} already exists")
            return sessions.session_info(existing)

    def get_session(self, sid: str) -> SessionInfo:
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return sessions.session_info(sessions.load_session(conn, sid))

    def set_policy(self, sid: str, policy: FoldPolicy) -> None:
        sid = sessions.check_session_id(sid)
        policy = sessions.check_policy(policy)
        with self._db.write() as conn:
            sessions.set_policy(conn, sid, policy, now=self._db.now())

    def set_paused(self, sid: str, paused: bool) -> None:
        """Pause (no background folds) or resume; resuming also zeroes ``abandoned_folds``."""
        sid = sessions.check_session_id(sid)
        if not isinstance(paused, bool):
            raise InvalidInputError(f"paused must be True or False, got {paused!r}")
        with self._db.write() as conn:
            sessions.set_paused(conn, sid, paused, now=self._db.now())

    def delete_session(self, sid: str) -> bool:
        sid = sessions.check_session_id(sid)
        with self._db.write() as conn:
            return sessions.delete_session(conn, sid)

    def list_sessions(self, *, limit: int = 100, after: str | None = None) -> list[SessionInfo]:
        limit = _check_limit(limit)
        with self._db.read() as conn:
            return sessions.list_sessions(conn, limit=limit, after=after)

    def over_budget(self, *, limit: int = 1000) -> list[SessionInfo]:
        limit = _check_limit(limit)
        with self._db.read() as conn:
            return sessions.over_budget(conn, limit=limit)

    # --- ledger and window -----------------------------------------------------------------

    def append(self, sid: str, messages: Sequence[Message | Mapping[str, Any]], *,
               key: str | None = None) -> AppendResult:
        """Append messages to the ledger and the window tail; idempotent by ``key``."""
        sid = sessions.check_session_id(sid)
        key = ledger.check_key(key)
        prepared = ledger.prepare_append(messages, self.counter)
        with self._db.write() as conn:
            return ledger.append_prepared(conn, sid, prepared, key, now=self._db.now(),
                                          counter=self.counter)

    def read_window(self, sid: str) -> Window:
        sid = sessions.check_session_id(sid)
        # A snapshot: an item evicted from the cache is fetched by a second statement.
        with self._db.read(snapshot=True) as conn:
            return windows.read_window(conn, sid, self.item_cache)

    def read_ledger(self, sid: str, start: int = 0, end: int | None = None) -> list[LedgerEntry]:
        """Ledger entries ``start <= seq < end`` (``end=None``: to the tail)."""
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return ledger.read_ledger(conn, sid, start, end)

    def recover(self, sid: str, start_seq: int, end_seq: int) -> list[Message]:
        """The originals of ledger seqs ``start_seq..end_seq`` (inclusive), exactly as appended
        (without ``cache_control``); DiscardedOriginalsError under ``retain="discard"``."""
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return ledger.recover(conn, sid, start_seq, end_seq)

    def spans(self, sid: str) -> list[StoredSpan]:
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return folds.read_spans(conn, sid)

    def records(self, sid: str) -> list[StoredRecord]:
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return folds.read_records(conn, sid)

    # --- usage -----------------------------------------------------------------------------

    def record_usage(self, sid: str, usage_: Any, *, seq: int, revision: int,
                     model: str | None = None) -> UsageResult:
        """Record a call's provider-reported usage (see :mod:`.usage` for what is accepted).

        ``model`` is accepted for the callers' convenience and not stored.
        """
        sid = sessions.check_session_id(sid)
        report = usage.check_report(sid, usage_, seq, revision, model)
        with self._db.write() as conn:
            results = usage.apply_reports(conn, [report], now=self._db.now(), strict=True)
        return results[sid]

    def record_usage_batch(self, reports: Sequence[UsageReport]) -> int:
        """Apply the latest report per session in one transaction; returns how many were taken.

        Reports naming a deleted session, an impossible seq or revision, or zero usage are
        skipped (logged), not raised: the batch's other sessions still count.
        """
        latest = usage.latest_per_session(reports)
        if not latest:
            return 0
        with self._db.write() as conn:
            results = usage.apply_reports(conn, latest, now=self._db.now(), strict=False)
        return sum(r.accepted for r in results.values())

    # --- folds -----------------------------------------------------------------------------

    def claim(self, sid: str, job_id: str, *, enqueued_epoch: int | None = None,
              lease_s: float = claims.DEFAULT_LEASE_S, force: bool = False,
              max_abandoned: int | None = None) -> Claim:
        """Claim ``sid`` for a fold by ``job_id`` (see :mod:`.claims`).

        ``max_abandoned``: refuse (status ``abandoned``) once the session's folds were abandoned
        that many times in a row (claims taken over from holders that never finished).
        """
        sid = sessions.check_session_id(sid)
        job_id = claims.check_job_id(job_id)
        with self._db.write() as conn:
            return claims.claim_locked(conn, sid, job_id, enqueued_epoch=enqueued_epoch,
                                       lease_s=lease_s, force=force, now=self._db.now(),
                                       max_abandoned=max_abandoned)

    def commit_fold(self, sid: str, result: FoldResult, *, epoch: int,
                    job_id: str) -> CommitResult:
        """Commit a planned fold under compare-and-set (see :mod:`.folds`).

        A result that changes nothing is recorded as a visit. A lost race raises StaleSpanError
        after writing the visit's record with outcome ``stale``.
        """
        sid = sessions.check_session_id(sid)
        job_id = claims.check_job_id(job_id)
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise InvalidInputError(f"epoch must be an integer, got {epoch!r}")
        prepared = folds.prepare_fold(result, self.counter)
        if prepared.edit.empty:
            record_id = self.record_visit(sid, prepared.record, job_id=job_id, epoch=epoch)
            return CommitResult(session_id=sid, revision=self.get_session(sid).revision,
                                spans=[], record_id=record_id)
        try:
            with self._db.write() as conn:
                revision, spans, record_id, duplicate = folds.commit_locked(
                    conn, sid, prepared, epoch=epoch, job_id=job_id, now=self._db.now())
        except folds.Stale as lost:
            stale = prepared.record.model_copy(update={
                "outcome": "stale",
                "detail": "; ".join(x for x in (prepared.record.detail, lost.reason) if x),
            })
            with self._db.write() as conn:
                folds.record_visit_locked(conn, sid, stale, job_id=job_id, epoch=epoch,
                                          now=self._db.now(), latch=False)
            raise StaleSpanError(
                f"fold of session {sid!r} by job {job_id!r} is stale: {lost.reason}; nothing "
                "of it was written") from None
        return CommitResult(session_id=sid, revision=revision, spans=spans,
                            record_id=record_id, duplicate=duplicate)

    def record_visit(self, sid: str, record: CompactionRecord, *, job_id: str | None = None,
                     epoch: int | None = None) -> int:
        """Record a visit that folded nothing; releases the claim if it is this job's.
        Returns the record's id."""
        sid = sessions.check_session_id(sid)
        if job_id is not None:
            job_id = claims.check_job_id(job_id)
        with self._db.write() as conn:
            return folds.record_visit_locked(conn, sid, record, job_id=job_id, epoch=epoch,
                                             now=self._db.now())

    def latched(self, sid: str) -> set[str]:
        """Fingerprints of spans refused before (not to be sent to the summarizer again)."""
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return folds.latched(conn, sid)

    # --- dead letters ----------------------------------------------------------------------

    def dead_letter(self, job_id: str, sid: str, reason: str, attempts: int,
                    payload: Mapping[str, Any]) -> int:
        """Keep a job the workers gave up on; returns its id. The session need not exist."""
        job_id = claims.check_job_id(job_id)
        sid = sessions.check_session_id(sid)
        with self._db.write() as conn:
            return dead_letters.insert_dead_letter(conn, job_id, sid, reason, attempts, payload,
                                                   now=self._db.now())

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        limit = _check_limit(limit)
        with self._db.read() as conn:
            return dead_letters.read_dead_letters(conn, limit=limit)

    # --- export ----------------------------------------------------------------------------

    def export(self, sid: str) -> dict[str, Any]:
        """The whole session as one JSON-ready object (see :mod:`.export`), one snapshot."""
        sid = sessions.check_session_id(sid)
        with self._db.read(snapshot=True) as conn:
            return export.export_session(conn, sid)

    def inspect(self, sid: str, *, width: int = 100, full: bool = False) -> str:
        """The window as text for a person, with fold seams and the ledger ranges behind them."""
        sid = sessions.check_session_id(sid)
        with self._db.read(snapshot=True) as conn:
            info = sessions.session_info(sessions.load_session(conn, sid))
            window = windows.read_window(conn, sid, self.item_cache)
            spans = folds.read_spans(conn, sid)
        return export.render_inspect(info, window, spans, width=width, full=full)
