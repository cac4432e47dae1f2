"""SessionStore: the one object the workers and the client use (see docs/internals.md, "store").

Every method is one short transaction (a lost fold race writes its ``stale`` record in a second
one). A fold crosses into the store twice: :meth:`SessionStore.begin_fold` claims the session and
reads what planning needs, :meth:`SessionStore.finish_fold` writes what the visit came to. Work that
needs no lock (validating messages, counting tokens, encoding a fold) happens before the transaction
opens, so a session's write lock is held for SQL round trips only::

    store = SessionStore.from_url(None)         # ./.sessionfold/sessionfold.db (see from_url)
    store.migrate()
    store.create_session("agent-7", FoldPolicy(budget_tokens=32_000), system="You are ...")
    store.append("agent-7", [{"role": "user", "content": "hello"}], key="turn-1")
    window = store.read_window("agent-7")       # .messages(), .revision
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sessionfold.core.compact import FoldResult
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import TokenCounter, default_counter
from sessionfold.core.window import CompactionRecord, Trigger
from sqlalchemy.engine import URL, Engine

from . import (
    api_keys,
    batches,
    claims,
    dead_letters,
    export,
    fold_commit,
    fold_visit,
    ledger,
    notify,
    pruning,
    sessions,
    usage,
    windows,
)
from . import search as search_index
from .api_keys import ApiKeyInfo
from .cache import DEFAULT_ITEMS, ItemCache
from .db import Clock, Database
from .engine import create_store_engine, default_sqlite_url, normalize_url
from .give_up import give_up_job
from .migrate import check_schema, upgrade
from .notify import WindowState
from .results import (
    AppendResult,
    BatchMark,
    Claim,
    CommitResult,
    DeadLetter,
    FoldContext,
    GaveUp,
    LedgerEntry,
    PruneReport,
    SearchHit,
    SessionGate,
    SessionInfo,
    StoredRecord,
    StoredSpan,
    UsageBatch,
    UsageReport,
    UsageResult,
    Window,
)

__all__ = ["SessionStore"]


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError(f"limit must be a positive integer, got {limit!r}")
    return limit


class SessionStore:
    """Sessions, their ledgers and windows, folds and records, on SQLite or PostgreSQL."""

    def __init__(self, engine: Engine, *, counter: TokenCounter | None = None,
                 clock: Clock | None = None, item_cache: int = DEFAULT_ITEMS) -> None:
        """``item_cache``: how many decoded window items to keep (0: decode every read).

        ``clock``: None stamps rows with this host's clock and sets and compares leases on the
        database's (see :mod:`.db`); a test may inject one clock for both, to move time.
        """
        self.engine = engine
        self.counter = counter or default_counter()
        self.item_cache = ItemCache(item_cache)
        self._db = Database(engine, clock=clock)

    @classmethod
    def from_url(cls, url: str | URL | None, *, counter: TokenCounter | None = None,
                 clock: Clock | None = None, echo: bool = False,
                 item_cache: int = DEFAULT_ITEMS) -> SessionStore:
        """A store on ``url``; None means the SQLite file ``./.sessionfold/sessionfold.db`` in the
        working folder, whatever the environment says: the store reads no settings. An entry
        point passes the URL its settings name (``Settings.store_url``)."""
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
        system = sessions.check_system(system)
        return sessions.create_session(self._db, sid, policy, system, exist_ok=exist_ok,
                                       counter=self.counter)

    def get_session(self, sid: str) -> SessionInfo:
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return sessions.session_info(sessions.load_session(conn, sid))

    def session_gates(self, sids: Iterable[str]) -> dict[str, SessionGate]:
        """The :class:`SessionGate` of each of ``sids`` that exists, by id, in one query (five
        columns, no policy to parse: a fifth of a full row's cost): what a scheduler checks a
        batch of usage reports against.

        An id that is absent, or that no session could have (not a valid session id), is
        simply missing from the result: the caller asks about ids it was told of, not ids it
        vouches for.
        """
        wanted = sorted({sid for sid in sids if sessions.is_session_id(sid)})
        if not wanted:
            return {}
        with self._db.read() as conn:
            return {row.id: SessionGate(row.id, row.incarnation, row.created_at, row.paused,
                                        row.current_tokens, row.trigger_tokens)
                    for row in sessions.load_gates(conn, wanted)}

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
            sessions.set_paused(conn, sid, paused, clock=self._db.lease_now)

    def delete_session(self, sid: str) -> bool:
        sid = sessions.check_session_id(sid)
        with self._db.write() as conn:
            deleted = sessions.delete_session(conn, sid)
            if deleted:  # waiting readers (the HTTP API's long-polls) answer 404 at once
                notify.notify_window_change(conn, sid, 0, 0, "delete")
            return deleted

    def list_sessions(self, *, limit: int = 100, after: str | None = None,
                      prefix: str | None = None) -> list[SessionInfo]:
        """Sessions in id order, after the id ``after``; with ``prefix``, only ids that start
        with it (the HTTP API lists one tenant's sessions so)."""
        limit = _check_limit(limit)
        with self._db.read() as conn:
            return sessions.list_sessions(conn, limit=limit, after=after, prefix=prefix)

    def last_fold_times(self, sids: Iterable[str]) -> dict[str, datetime]:
        """When each of ``sids`` last had a fold committed, by id; a session never folded (or
        absent, or with an id no session could have) is missing."""
        wanted = sorted({sid for sid in sids if sessions.is_session_id(sid)})
        if not wanted:
            return {}
        with self._db.read() as conn:
            return sessions.last_folds(conn, wanted)

    def over_trigger(self, *, limit: int = 1000) -> list[SessionInfo]:
        """Sessions past their trigger (a background fold is due), not paused, most over
        first: what the scheduler's sweep re-finds when Redis lost their usage events."""
        limit = _check_limit(limit)
        with self._db.read() as conn:
            return sessions.over_trigger(conn, limit=limit)

    def over_budget(self, *, limit: int = 1000) -> list[SessionInfo]:
        """Deprecated name of :meth:`over_trigger` (it never meant past the budget); goes away
        in the next release."""
        warnings.warn("SessionStore.over_budget() is deprecated: it returns the sessions over "
                      "their trigger; call over_trigger()", DeprecationWarning, stacklevel=2)
        return self.over_trigger(limit=limit)

    def paused_over_budget(self, *, limit: int = 1000) -> list[SessionInfo]:
        """Paused sessions past their whole budget (no background fold brings them down)."""
        limit = _check_limit(limit)
        with self._db.read() as conn:
            return sessions.paused_over_budget(conn, limit=limit)

    # --- ledger and window -----------------------------------------------------------------

    def append(self, sid: str, messages: Sequence[Message | Mapping[str, Any]], *,
               key: str | None = None, recall: bool = False) -> AppendResult:
        """Append messages to the ledger and the window tail, and index them for search, in
        one transaction; idempotent by ``key``.

        ``recall=True``: a recall exchange the client made for the agent (ledger origin
        ``'recall'``, window items of kind ``"recall"``, not indexed).
        """
        sid = sessions.check_session_id(sid)
        key = ledger.check_key(key)
        prepared = ledger.prepare_append(messages, self.counter, recall=recall)
        with self._db.write() as conn:
            return ledger.append_prepared(conn, sid, prepared, key, now=self._db.now(),
                                          counter=self.counter)

    def read_window(self, sid: str) -> Window:
        sid = sessions.check_session_id(sid)
        # A snapshot: an item evicted from the cache is fetched by a second statement.
        with self._db.read(snapshot=True) as conn:
            return windows.read_window(conn, sid, self.item_cache)

    def window_states(self, sids: Sequence[str]) -> dict[str, WindowState]:
        """Where each session's window stands (incarnation, revision, fold revision), for the
        sessions of ``sids`` that exist, in one query per 500 ids: what a reader waiting on
        many sessions polls where the database cannot notify it (see :mod:`.notify`)."""
        checked = [sessions.check_session_id(sid) for sid in sids]
        if not checked:
            return {}
        with self._db.read() as conn:
            return notify.window_states(conn, checked)

    def read_window_state(self, sid: str) -> tuple[Window, WindowState]:
        """The window and its state (the incarnation tells a re-created id apart), read in
        one snapshot: the pair an HTTP ETag is made of."""
        sid = sessions.check_session_id(sid)
        with self._db.read(snapshot=True) as conn:
            window = windows.read_window(conn, sid, self.item_cache)
            state = notify.window_states(conn, [sid]).get(sid)
        if state is None:  # a snapshot cannot lose the row read_window found
            raise SessionNotFoundError(f"no session {sid!r} in the store")
        return window, state

    def read_ledger(self, sid: str, start: int = 0, end: int | None = None) -> list[LedgerEntry]:
        """Ledger entries ``start <= seq < end`` (``end=None``: to the tail)."""
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return ledger.read_ledger(conn, sid, start, end)

    def search(self, sid: str, query: str, *, limit: int = 10) -> list[SearchHit]:
        """The session's ledger chunks that best match ``query``, best first (see
        :mod:`.search`): only this session's rows, never a discarded or recall one.

        ``query`` is words and identifiers (``ACCT-90417``, ``base.py``,
        ``self.missing_args_message``), nothing else: no operator or syntax is read, so no query
        is a database error. InvalidInputError (a message to show as it is) for an empty,
        wordless or too long query, or a limit outside 1..1000; SessionNotFoundError.
        """
        sid = sessions.check_session_id(sid)
        parsed = search_index.parse(query)
        limit = search_index.check_limit(limit)
        with self._db.read() as conn:
            return search_index.search(conn, sid, parsed, limit)

    def reindex(self, *, sid: str | None = None, batch: int = 500) -> int:
        """Index the ledger rows the search index lacks (written before it existed); returns
        how many rows were indexed. ``sid``: that session, whatever its flag; None: every
        session flagged ``search_pending``. Many short transactions (``batch`` ledger rows
        read at a time), safe beside live appends and folds, idempotent: not one long lock.
        """
        if sid is not None:
            sid = sessions.check_session_id(sid)
        batch = search_index.check_batch(batch)
        with self._db.mapped_errors():
            return search_index.reindex(self._db, sid, batch)

    def unindexed_sessions(self) -> int:
        """How many sessions may hold ledger rows the search index has not seen (a cheap
        count): more than 0 means ``sessionfold reindex`` has work."""
        with self._db.read() as conn:
            return search_index.pending_sessions(conn)

    def recover(self, sid: str, start_seq: int, end_seq: int) -> list[Message]:
        """The originals of ledger seqs ``start_seq..end_seq`` (inclusive), exactly as appended
        (without ``cache_control``); DiscardedOriginalsError under ``retain="discard"``."""
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return ledger.recover(conn, sid, start_seq, end_seq)

    def spans(self, sid: str) -> list[StoredSpan]:
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return fold_commit.read_spans(conn, sid)

    def records(self, sid: str) -> list[StoredRecord]:
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return fold_commit.read_records(conn, sid)

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
        return self.apply_usage_batch(reports).taken

    def apply_usage_batch(self, reports: Sequence[UsageReport]) -> UsageBatch:
        """:meth:`record_usage_batch`, also handing back the :class:`SessionGate` of every
        session the reports name that exists, as the write left it (its new size when its
        report was taken): what a scheduler checks the next reports against, without reading
        the rows a second time. A session missing from ``gates`` does not exist (or its id is
        not one a session could have).
        """
        latest = usage.latest_per_session(reports)
        if not latest:
            return UsageBatch(0, {})
        gates: dict[str, SessionGate] = {}
        with self._db.write() as conn:
            results = usage.apply_reports(conn, latest, now=self._db.now(), strict=False,
                                          gates=gates)
        return UsageBatch(sum(r.accepted for r in results.values()), gates)

    # --- folds -----------------------------------------------------------------------------

    def claim(self, sid: str, job_id: str, *, enqueued_epoch: int | None = None,
              lease_s: float = claims.DEFAULT_LEASE_S, force: bool = False,
              max_abandoned: int | None = None, incarnation: int | None = None) -> Claim:
        """Claim ``sid`` for a fold by ``job_id`` (see :mod:`.claims`).

        ``max_abandoned``: refuse (status ``abandoned``) once the session's folds were abandoned
        that many times in a row (claims taken over from holders that never finished).
        ``incarnation``: the session the job was enqueued for (a retry passes the incarnation
        of its earlier claim); SessionNotFoundError if the id was deleted and created since.
        """
        sid = sessions.check_session_id(sid)
        job_id = claims.check_job_id(job_id)
        with self._db.write() as conn:
            return claims.claim_locked(conn, sid, job_id, enqueued_epoch=enqueued_epoch,
                                       lease_s=lease_s, force=force, clock=self._db.lease_now,
                                       max_abandoned=max_abandoned, incarnation=incarnation)

    def begin_fold(self, sid: str, job_id: str, *, enqueued_epoch: int | None = None,
                   lease_s: float = claims.DEFAULT_LEASE_S, force: bool = False,
                   max_abandoned: int | None = None,
                   incarnation: int | None = None) -> FoldContext:
        """Claim ``sid`` for a fold by ``job_id`` and read what planning it needs, in one
        transaction: the claim (see :meth:`claim` for the arguments), and when it is held the
        window, the session and the refusal latches (:class:`FoldContext`).

        One transaction, so the plan starts from the state the claim saw: nothing can land
        between the claim and the read. The summarizer is called after it, with no
        transaction open; :meth:`finish_fold` writes what the visit came to.
        """
        return fold_visit.begin_fold(self._db, self.item_cache, sid, job_id,
                                     enqueued_epoch=enqueued_epoch, lease_s=lease_s,
                                     force=force, max_abandoned=max_abandoned,
                                     incarnation=incarnation)

    def finish_fold(self, claim: Claim, outcome: FoldResult | CompactionRecord) -> CommitResult:
        """Write what a visit under ``claim`` came to, in one call.

        A :class:`FoldResult` is committed under compare-and-set (:meth:`commit_fold`; one that
        changes nothing is recorded as the visit); a :class:`CompactionRecord` (a visit that
        ended before planning: paused, out of time) is recorded (:meth:`record_visit`). Either
        releases the claim. A lost race raises StaleSpanError after writing the visit's
        ``stale`` record.
        """
        if not isinstance(claim, Claim) or not claim.claimed:
            raise InvalidInputError("finish_fold takes the held claim of begin_fold")
        if isinstance(outcome, CompactionRecord):
            record_id, revision = fold_visit.record_visit(
                self._db, claim.session_id, outcome, job_id=claim.job_id, epoch=claim.epoch,
                incarnation=claim.incarnation)
            return CommitResult(session_id=claim.session_id, revision=revision, spans=[],
                                record_id=record_id)
        return self.commit_fold(claim.session_id, outcome, epoch=claim.epoch,
                                job_id=claim.job_id, incarnation=claim.incarnation)

    def commit_fold(self, sid: str, result: FoldResult, *, epoch: int, job_id: str,
                    incarnation: int) -> CommitResult:
        """Commit a fold planned under the claim (``job_id``, ``epoch``, ``incarnation``) under
        compare-and-set (see :mod:`.fold_commit`).

        A result that changes nothing is recorded as a visit. A lost race (a newer claim, a
        changed item, or a session deleted and created again since the claim) raises
        StaleSpanError after writing the visit's record with outcome ``stale``; a session that
        no longer exists raises SessionNotFoundError.
        """
        return fold_visit.commit_fold(self._db, self.counter, sid, result, epoch=epoch,
                                      job_id=job_id, incarnation=incarnation)

    def record_visit(self, sid: str, record: CompactionRecord, *, job_id: str | None = None,
                     epoch: int | None = None, incarnation: int | None = None) -> int:
        """Record a visit that folded nothing; returns the record's id.

        ``epoch`` and ``incarnation`` name the claim the visit was made under (both or
        neither): the claim is released when ``job_id`` still holds it in that incarnation. A
        visit made on an earlier incarnation of the id (deleted and created since) is recorded
        as ``stale``, releases nothing, and raises StaleSpanError.
        """
        return fold_visit.record_visit(self._db, sid, record, job_id=job_id, epoch=epoch,
                                       incarnation=incarnation)[0]

    # --- batch folds (see .batches) -------------------------------------------------------

    def now(self) -> datetime:
        """The time this store stamps rows with (this host's clock, or the injected one): what
        a batch fold's deadline is set and checked on."""
        return self._db.now()

    def hold_for_batch(self, claim: Claim, mark: BatchMark) -> None:
        """Keep ``claim`` (a held one: :meth:`begin_fold`'s) while its fold waits on a provider's
        batch API: write the session's batch ``mark`` and stretch the lease to its deadline.

        StaleSpanError (nothing written) if the claim is no longer the job's; SessionNotFoundError
        if the session is gone. The caller then cancels the batch.
        """
        fold_visit.hold_for_batch(self._db, claim, mark)

    def resume_batch(self, sid: str, job_id: str, *, epoch: int,
                     incarnation: int) -> FoldContext:
        """Take up the claim a batch fold holds (``job_id``, ``epoch``, ``incarnation``) to land
        it, and read what planning needs, in one transaction (:meth:`begin_fold`'s answer).

        The claim comes back ``claimed`` while the fold still holds it with its batch mark set,
        ``already-committed`` or ``newer-claim`` otherwise; SessionNotFoundError for a session
        gone, or deleted and created again.
        """
        return fold_visit.resume_batch(self._db, self.item_cache, sid, job_id, epoch=epoch,
                                       incarnation=incarnation)

    def pending_batches(self, *, limit: int = 1000) -> list[SessionInfo]:
        """Sessions with a fold waiting on a provider's batch API, soonest deadline first."""
        limit = _check_limit(limit)
        with self._db.read() as conn:
            return batches.pending_batches(conn, limit=limit)

    def latched(self, sid: str) -> set[str]:
        """Fingerprints of spans refused before (not to be sent to the summarizer again)."""
        sid = sessions.check_session_id(sid)
        with self._db.read() as conn:
            return fold_commit.latched(conn, sid)

    # --- dead letters ----------------------------------------------------------------------

    def give_up(self, sid: str, job_id: str, reason: str, attempts: int,
                payload: Mapping[str, Any], *, trigger: Trigger = "threshold",
                pause: bool = False, epoch: int | None = None,
                incarnation: int | None = None) -> GaveUp:
        """Give a fold job up in one transaction (see :mod:`.give_up`): its dead letter, the
        refusal record that says why (``dead-lettered: REASON``), and with ``pause`` the pause
        of the session. A reader sees all of it or none of it.

        ``incarnation``: the session the job was about (SessionNotFoundError, nothing written,
        if the id names another one now); with ``epoch``, the job's claim, released here.
        """
        return give_up_job(self._db, sid, job_id, reason, attempts, payload, trigger=trigger,
                           pause=pause, epoch=epoch, incarnation=incarnation)

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

    # --- retention -------------------------------------------------------------------------

    def prune(self, rules: pruning.RetentionRules | None = None, *,
              now: datetime | None = None, batch: int = 1000, dry_run: bool = False,
              max_batches: int | None = None, resume: str | None = None) -> PruneReport:
        """Delete what the retention ``rules`` let go (see :mod:`.pruning`): old append keys,
        no-op visit records beyond each session's newest ones, old and orphaned dead letters.

        ``now`` (default: the store's clock) is what ages are measured from. Many short
        transactions of at most ``batch`` deleted rows, safe beside live appends and folds; at
        most ``max_batches`` of them (None: until done); an unfinished pass reports
        ``complete=False`` and a ``resume`` cursor to pass back. ``dry_run``: count, delete
        nothing. Never a folded record, never a record a span names, never a session's newest
        no-op records.
        """
        rules = pruning.RetentionRules() if rules is None else rules
        if not isinstance(rules, pruning.RetentionRules):
            raise InvalidInputError(f"rules must be RetentionRules, got {type(rules).__name__}")
        batch = pruning.check_batch(batch)
        max_batches = pruning.check_max_batches(max_batches)
        pruning.parse_resume(resume)
        if now is None:
            now = self._db.now()
        elif not isinstance(now, datetime) or now.tzinfo is None:
            raise InvalidInputError(f"now must be a timezone-aware datetime, got {now!r}")
        with self._db.mapped_errors():
            return pruning.prune(self._db, rules, now=now, batch=batch, dry_run=dry_run,
                                   max_batches=max_batches, resume=resume)

    # --- API keys (the HTTP API's; made and checked by sessionfold.service.auth) -----------

    def create_api_key(self, key_id: str, tenant: str, digest: str, *,
                       admin: bool = False) -> ApiKeyInfo:
        """Store a key's row: its id, tenant, admin flag and the digest of its secret."""
        key_id = api_keys.check_key_id(key_id)
        if not isinstance(tenant, str) or not 0 < len(tenant) <= 64:
            raise InvalidInputError(f"a tenant is 1 to 64 characters, got {tenant!r:.80}")
        if not isinstance(digest, str) or len(digest) != 64:
            raise InvalidInputError("an API key digest is 64 hex digits (SHA-256)")
        with self._db.write() as conn:
            return api_keys.insert_api_key(conn, key_id, tenant, digest, admin=bool(admin),
                                           now=self._db.now())

    def get_api_key(self, key_id: str) -> ApiKeyInfo | None:
        with self._db.read() as conn:
            return api_keys.get_api_key(conn, api_keys.check_key_id(key_id))

    def list_api_keys(self, tenant: str | None = None) -> list[ApiKeyInfo]:
        with self._db.read() as conn:
            return api_keys.list_api_keys(conn, tenant)

    def revoke_api_key(self, key_id: str) -> bool:
        """Revoke a key; False when there is no live key of that id."""
        key_id = api_keys.check_key_id(key_id)
        with self._db.write() as conn:
            return api_keys.revoke_api_key(conn, key_id, now=self._db.now())

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
            spans = fold_commit.read_spans(conn, sid)
        return export.render_inspect(info, window, spans, width=width, full=full)
