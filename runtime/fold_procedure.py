"""The one fold procedure, shared by the Celery task and the client's inline fallback.

::

    store.begin_fold: claim the session, read the window, the session and the latches
        (one transaction)  →
    ask the summarizer guard whether this visit may pay  →
    core.fold_window (the summarizer is called here, outside any transaction)  →
    store.finish_fold: commit the fold, or record the visit when nothing changed
        (one transaction)  →  count what was paid

Why each step sits where it does:

- **The claim comes first**, before anything is paid for: a redelivered job finds its own visit
  already written (``already-committed``), a duplicate delivery finds the live claim of its twin,
  and a job overtaken by a newer one finds the newer epoch (``newer-claim``). All of them stop
  with outcome ``skipped`` and no summarizer call. The claim lives in the store, not in Redis,
  which may lose it; the Redis lock of the scheduler only saves work.
- **What the plan needs is read with the claim**, in the claim's transaction: the window it
  plans on is the one the claim saw. A fold crosses into the store twice, to begin and to
  finish (plus a ledger lookup in the rare case a clipped output is edited again).
- **No transaction is open while the summarizer runs**: every store call is one short
  transaction, and the commit checks (compare-and-set on item versions, and the claimed epoch)
  that nothing the plan relied on changed meanwhile. Appends only add items after the planned
  ones, so an agent appending during a fold never makes it stale.
- **The claim is carried to the end**: the commit, and every record that releases the claim,
  name the claim's job id, epoch and session *incarnation*. A session deleted and created again
  under the same id while the fold ran is another session (its epochs start over): the store
  refuses the fold as ``stale`` and records that in the new session; a session that is gone
  raises SessionNotFoundError.
- **A lost compare-and-set** (:class:`StaleSpanError`) wrote nothing but the visit's ``stale``
  record. A background job ends there (the scheduler comes back if the session is still over
  budget). The inline fallback (``replan=True``) re-reads the session: if the fold that won
  already brought it under the target it stops; otherwise it claims again and plans once more.
- **A transient summarizer failure** still commits whatever the cheap layers did (masking old
  tool output is worth keeping) and the report carries the error in :attr:`FoldReport.retry_error`
  for the Celery task to retry. Every store job id is used for one visit only, so a retry runs
  under its own job id (see :func:`store_job_id`).
- **A time limit** (``out_of_time``: the exceptions the caller's runner raises into the
  planner or the summarizer wherever it happens to be; the Celery task passes Celery's
  ``SoftTimeLimitExceeded``, so this module imports nothing of Celery) ends the visit like a
  transient summarizer failure: a ``summarizer-failed`` refusal (detail ``soft time limit``) is
  recorded, which releases the claim at once instead of leaving it to block the session until
  its lease runs out, and the report carries a :class:`TransientSummarizerError` so the task
  retries with its backoff.
- **The summarizer is guarded** (:mod:`.summarizer_guard`) for the Celery task and the inline
  fallback alike: every call holds one of the global summarizer slots, and a visit to a session
  past its spend cap (or one whose spend cannot be read) folds with the free layers only. An
  inline fold never waits for a slot: with none free it folds with the cheap layers only. In
  every case the record says why the summarizer was skipped, and what the summarizer cost is
  counted against the session's spend once the visit has landed.
- **A session whose folds keep dying** (``FoldJob.max_abandoned``): the store counts claims
  taken over from holders that never finished, per session; at the cap the claim answers
  ``abandoned`` and the visit stops as ``skipped`` with that claim status, before any
  summarizer call, for the task to give the session up.

- **Priced visits** (policy ``economics="dollars"``): given the settings' ``pricing``
  (:func:`.prices.fold_pricing`: the Celery task passes it), the planner prices the visit with
  the cost model and folds as deep as pays, or records ``would-not-pay``
  (:mod:`sessionfold.core.economics`). An ``idle`` visit (the scheduler saw the session idle
  past its cache's lifetime) is priced with a cold cache. Forced and overflow visits (the
  inline fallback) are never priced: the budget wins over dollars.

- **Batch folds** (``batch``: a provider's batch API, :mod:`.batch_folds`): a priced background
  visit whose fold can wait (:mod:`sessionfold.core.batching`) sends its summary request there
  instead of calling the summarizer, and keeps its claim, held to the batch's deadline, with
  the session's batch mark (:meth:`SessionStore.hold_for_batch
  <sessionfold.store.store.SessionStore.hold_for_batch>`); its report says ``batch-pending``.
  A collection (:mod:`.batch_collect`) makes the visit again from the plan the mark keeps, with
  the batch's answer, and lands it here (:func:`visit`). A request the batch API refuses is
  asked of the summarizer at once.

Fault points for tests (:mod:`.faults`): ``after-summary`` sits between the summarizer's return
and the commit; ``after-batch-submit`` between a batch fold's hold and the end of its job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sessionfold.core.batching import BatchTerms
from sessionfold.core.compact import FoldResult, FoldVisit, fold_window
from sessionfold.core.economics import FoldEconomics, expected_calls_left
from sessionfold.core.errors import (
    SessionfoldError,
    SessionNotFoundError,
    StaleSpanError,
    SummarizerError,
    SummaryDeferred,
    TransientSummarizerError,
)
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.core.messages import Message
from sessionfold.core.summarizers import Summarizer, Summary
from sessionfold.core.window import (
    CompactionRecord,
    SummarizerUsage,
    Trigger,
)
from sessionfold.store.fold_commit import LAG_WEIGHT

from .batch_folds import (
    BatchOffer,
    BatchRecorder,
    BatchTicket,
    DeferredRequest,
    plan_of,
    visit_of,
)
from .faults import fault_point
from .summarizer_guard import SummarizerChoice, SummarizerGuard

if TYPE_CHECKING:
    from sessionfold.store import SessionStore
    from sessionfold.store.results import Claim, FoldContext, SessionInfo

__all__ = [
    "BATCH_PENDING",
    "FOLD_LAG",
    "Collected",
    "FoldJob",
    "FoldReport",
    "OutOfTime",
    "cancel_quietly",
    "charged",
    "claim_report",
    "run_fold",
    "store_job_id",
    "visit",
]

log = logging.getLogger(__name__)

SOFT_TIME_LIMIT = "soft time limit"
#: The outcome of a visit whose fold waits on a batch API (a report's, never a record's).
BATCH_PENDING = "batch-pending"

#: Exceptions a runner raises into a visit when its time limit strikes (an ``except`` clause's
#: tuple: empty catches nothing).
OutOfTime = tuple[type[BaseException], ...]


@dataclass(frozen=True)
class FoldJob:
    """One visit to fold a session: who asks, why, and how hard.

    ``enqueued_epoch`` is the session's ``fold_epoch`` when the job was enqueued (None: do not
    compare). ``force`` (the inline fallback) claims over any other claim and folds even under
    the trigger. ``target_tokens`` overrides the policy's target (overflow: half the budget).
    ``measured_tokens`` is a size the caller knows better than the store (the token count of a
    provider's "prompt is too long" error). ``lease_s`` bounds the claim: a worker that dies
    holding it blocks the session no longer than that. ``replan`` re-plans once after a lost race.
    ``if_revision``: fold only the window at that revision (what the caller measured and
    decided on); a window that changed since (a fold landed, another writer appended) is not
    folded (outcome ``stale``, recorded, no re-plan), for the caller to measure again: the
    request guard's inline fold, which must not fold again a window a background fold just
    left under its line.
    ``max_abandoned`` (the Celery task: ``max_attempts``) stops a session whose folds were
    abandoned that many times in a row (claim status ``abandoned``); None never stops.
    ``incarnation``: the session incarnation the job is for (a retry carries the one it claimed
    before); a session deleted and created again since is not claimed (SessionNotFoundError).
    """

    session_id: str
    job_id: str
    trigger: Trigger = "threshold"
    enqueued_epoch: int | None = None
    force: bool = False
    target_tokens: int | None = None
    measured_tokens: int | None = None
    lease_s: float = 300.0
    replan: bool = False
    max_abandoned: int | None = None
    incarnation: int | None = None
    if_revision: int | None = None


@dataclass(frozen=True)
class FoldReport:
    """How a visit ended. ``outcome`` is a record outcome, or ``skipped`` (stopped at the claim).

    ``to_json()`` is what a Celery task returns, so Flower's task list shows the session and the
    outcome of every fold.
    """

    session_id: str
    job_id: str
    trigger: str
    outcome: str
    claim: str
    epoch: int | None = None
    revision: int | None = None
    #: The incarnation of the session the claim was taken in (None: stopped before claiming).
    incarnation: int | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    spans: int = 0
    summarizer_usage: SummarizerUsage = field(default_factory=SummarizerUsage)
    refusals: tuple[str, ...] = ()
    replans: int = 0
    detail: str = ""
    #: A transient summarizer error worth retrying (what the cheap layers did is committed).
    retry_error: TransientSummarizerError | None = None
    #: The visit's record as written (None when the job stopped at its claim).
    record: CompactionRecord | None = None
    #: A batch fold's batch (:class:`~.batch_folds.BatchTicket` as JSON), and what became of
    #: it in this job: ``submitted``, ``collected``, ``fallen-back`` (the summarizer called
    #: now instead), ``dropped`` (nothing waits for it any more).
    batch: dict[str, Any] | None = None
    batch_event: str | None = None

    @property
    def summarizer_calls(self) -> int:
        return self.summarizer_usage.calls

    @property
    def folded(self) -> bool:
        return self.outcome == "folded"

    def moved_from(self, revision: int | None) -> bool:
        """Whether this visit found the window past ``revision``, the one its job measured
        (:attr:`FoldJob.if_revision`), and so folded nothing: not a lost race to re-plan, a
        window for the caller to measure again. False for ``revision`` None."""
        return (revision is not None and self.outcome == "stale"
                and self.revision not in (None, revision))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "session": self.session_id, "outcome": self.outcome, "job": self.job_id,
            "trigger": self.trigger, "claim": self.claim, "epoch": self.epoch,
            "revision": self.revision, "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after, "spans": self.spans,
            "summarizer_calls": self.summarizer_calls,
            "summarizer_input_tokens": self.summarizer_usage.input_tokens,
            "summarizer_output_tokens": self.summarizer_usage.output_tokens,
            "refusals": list(self.refusals), "replans": self.replans, "detail": self.detail,
        }
        if self.retry_error is not None:
            data["retry_error"] = str(self.retry_error)
        if self.batch is not None:
            data["batch"] = {**self.batch, "event": self.batch_event}
        return data


def store_job_id(task_id: str, retries: int) -> str:
    """The store's job id for one attempt of a Celery task.

    The store treats a job id as one visit (a second claim by it answers ``already-committed``),
    while Celery keeps one task id across retries. Redeliveries of the same attempt share the id,
    so the store still catches them; a retry gets a new one.
    """
    return task_id if retries == 0 else f"{task_id}~r{retries}"


def run_fold(store: SessionStore, summarizer: Summarizer | SummarizerGuard | None,
             job: FoldJob, *, pricing: FoldPricing | None = None,
             out_of_time: OutOfTime = (), batch: BatchOffer | None = None) -> FoldReport:
    """Claim, plan, summarize, commit: one visit (and, with ``job.replan``, one re-plan).

    ``summarizer``: a :class:`~.summarizer_guard.SummarizerGuard` (what the Celery task and the
    client pass: it decides per visit, once the claim names the session incarnation, whether
    the summarizer may be called, and counts what it cost), a bare summarizer (called without
    guards: tests, ``compact``), or None (the free layers only). ``pricing``: what a policy
    with ``economics="dollars"`` is priced with (None: no visit is priced). ``out_of_time``:
    the exceptions that mean the runner's time limit struck (see the module doc; none by
    default: an inline fold has no time limit of its own). ``batch``: a provider's batch API
    a priced background visit may send its fold to (see "Batch folds" in the module doc).

    Raises what the store raises (SessionNotFoundError, StoreError...) and nothing of the
    summarizer's: a summarizer failure is a refusal in the record, and a transient one is also
    returned in :attr:`FoldReport.retry_error`. A store error after the claim leaves the claim
    to its lease: the session waits no longer than ``job.lease_s`` for the next visit.
    """
    report = _attempt(store, summarizer, job, pricing, out_of_time, batch)
    if report.outcome != "stale" or not job.replan or report.moved_from(job.if_revision):
        return charged(summarizer, report)
    # Lost the race (another inline fold, or a claim that outlived ours). The winner may have
    # done the work already: look before paying again.
    info = store.get_session(job.session_id)
    target = job.target_tokens if job.target_tokens is not None else info.policy.target_tokens
    if info.current_tokens <= target:
        return charged(summarizer, replace(
            report, detail=f"a concurrent fold won; the window is at {info.current_tokens} "
                           f"tokens, under the target {target}"))
    # The provider's count named the window before the winner's fold: measure afresh.
    again = _attempt(store, summarizer, replace(job, job_id=f"{job.job_id}~replan",
                                                measured_tokens=None, replan=False),
                     pricing, out_of_time, None)
    return charged(summarizer, replace(
        again, replans=1, summarizer_usage=report.summarizer_usage + again.summarizer_usage))


def _choose(summarizer: Summarizer | SummarizerGuard | None, claim: Claim) -> SummarizerChoice:
    """The summarizer of the visit under ``claim``: a guard decides, a bare one is used."""
    if isinstance(summarizer, SummarizerGuard):
        return summarizer.choose(claim.session_id, claim.incarnation)
    return SummarizerChoice(summarizer)


def charged(summarizer: Summarizer | SummarizerGuard | None,
            report: FoldReport) -> FoldReport:
    """``report``, once what its summarizer calls cost is counted against the session."""
    if isinstance(summarizer, SummarizerGuard) and report.incarnation is not None:
        summarizer.charge(report.session_id, report.incarnation, report.summarizer_usage)
    return report


def _attempt(store: SessionStore, summarizer: Summarizer | SummarizerGuard | None,
             job: FoldJob, pricing: FoldPricing | None, out_of_time: OutOfTime,
             batch: BatchOffer | None) -> FoldReport:
    """One attempt: claim and read, plan, land (the procedure of the module doc, once)."""
    context = store.begin_fold(job.session_id, job.job_id, enqueued_epoch=job.enqueued_epoch,
                               lease_s=job.lease_s, force=job.force,
                               max_abandoned=job.max_abandoned, incarnation=job.incarnation)
    if not context.claim.claimed:
        return claim_report(job, context.claim)
    return visit(store, summarizer, job, context, pricing=pricing, out_of_time=out_of_time,
                 batch=batch)


def claim_report(job: FoldJob, claim: Claim) -> FoldReport:
    """The report of a visit as its claim left it (``skipped``, until it lands)."""
    return FoldReport(session_id=job.session_id, job_id=job.job_id, trigger=job.trigger,
                      outcome="skipped", claim=claim.status, epoch=claim.epoch,
                      revision=claim.revision, incarnation=claim.incarnation,
                      detail=claim.detail)


@dataclass(frozen=True)
class Collected:
    """A batch fold's answer, for :func:`visit` to make the visit of ``plan`` again with
    (:mod:`.batch_collect`)."""

    plan: Mapping[str, Any]
    key: str
    answer: Summary


def visit(store: SessionStore, summarizer: Summarizer | SummarizerGuard | None, job: FoldJob,
          context: FoldContext, *, pricing: FoldPricing | None = None,
          out_of_time: OutOfTime = (), batch: BatchOffer | None = None,
          collected: Collected | None = None) -> FoldReport:
    """Plan and land one visit under the held claim of ``context`` (what :func:`run_fold` does
    once it has claimed; a batch collection, once it has taken its claim up again).

    ``batch``: the visit may send its fold to that batch API (the report's outcome is then
    ``batch-pending``). ``collected``: the visit is a batch fold's, made again from its plan
    with the batch's answer.
    """
    claim = context.claim
    window, info = context.window, context.session
    assert claim.claimed and window is not None and info is not None  # read with the claim
    base = replace(claim_report(job, claim), revision=window.revision)
    if info.paused and not job.force and job.trigger in ("threshold", "idle"):
        record = CompactionRecord.paused(
            trigger=job.trigger, policy=info.policy, current_tokens=info.current_tokens,
            measured=info.measured_tokens is not None, target_tokens=job.target_tokens)
        return _land_record(store, claim, _ended(base, record))
    if job.if_revision is not None and window.revision != job.if_revision:
        record = CompactionRecord.moved(
            trigger=job.trigger, policy=info.policy, current_tokens=info.current_tokens,
            measured=info.measured_tokens is not None, decided_at=job.if_revision,
            revision=window.revision, target_tokens=job.target_tokens)
        return _land_record(store, claim, _ended(base, record))
    choice = _choose(summarizer, claim)
    sid = job.session_id

    def originals(seq: int) -> Message | None:
        # Read only for a clipped output masked (or clipped shorter) now: the stub names the
        # ledger original's size, never a number found in the output.
        return store.recover(sid, seq, seq)[0]

    recorder = None
    if collected is not None:
        items, folding = visit_of(collected.plan, window, collected.key, collected.answer,
                                  live=choice.summarizer, latched=context.latched,
                                  originals=originals)
    else:
        if batch is not None and choice.summarizer is not None and _may_wait(job):
            recorder = BatchRecorder(choice.summarizer)
        items = window.items
        folding = FoldVisit(
            info.policy, choice.summarizer, system=window.system,
            summarizer_skipped=choice.skipped,
            measured_tokens=_measured(job, info), calibration=info.calibration,
            trigger=job.trigger, force=job.force, target_tokens=job.target_tokens,
            latched=context.latched,
            economics=(None if pricing is None else _economics(
                pricing, job, info, None if recorder is None or batch is None
                else batch.terms(info))),
            trigger_tokens=info.trigger_tokens, item_chars=window.chars or None,
            originals=originals, batch_summarizer=recorder)
    try:
        result = fold_window(items, folding)
    except SummaryDeferred:
        assert recorder is not None and recorder.request is not None and batch is not None
        return _submit(store, summarizer, job, context, folding, recorder.request, batch,
                       pricing=pricing, out_of_time=out_of_time)
    except out_of_time:
        # The hard limit follows shortly: release the claim now (a recorded visit), so the
        # session is not blocked for a whole lease, and let the task retry later.
        record = CompactionRecord.out_of_time(
            trigger=job.trigger, policy=info.policy, current_tokens=info.current_tokens,
            measured_tokens=_measured(job, info),
            window=(items[0].start_seq, items[-1].end_seq) if items else (0, 0),
            why=SOFT_TIME_LIMIT, forced=job.force, target_tokens=job.target_tokens)
        log.warning("fold of %s by %s hit the soft time limit; recording the visit", sid,
                    job.job_id)
        return _land_record(store, claim, replace(
            _ended(base, record), refusals=("summarizer-failed",),
            retry_error=TransientSummarizerError(f"{SOFT_TIME_LIMIT}: the fold ran out of time")))
    fault_point("after-summary")
    report = _land(store, claim, result, base)
    if choice.skipped and choice.skipped not in report.detail:
        # Said in the record only when the summarize layer was reached; said to the caller
        # (the task's result in Flower, the inline fold's report) always.
        report = replace(report, detail="; ".join(x for x in (report.detail, choice.skipped)
                                                   if x))
    return report


def _may_wait(job: FoldJob) -> bool:
    """Only a background visit may wait for a batch: an inline fold's agent is waiting on it."""
    return not job.force and job.trigger in ("threshold", "idle")


def _submit(store: SessionStore, summarizer: Summarizer | SummarizerGuard | None, job: FoldJob,
            context: FoldContext, folding: FoldVisit, request: DeferredRequest,
            batch: BatchOffer, *, pricing: FoldPricing | None,
            out_of_time: OutOfTime) -> FoldReport:
    """Send the visit's summary request to the batch API and hold the claim for its answer;
    a request the API refuses is asked of the summarizer now instead (the visit again,
    without the batch API)."""
    claim = context.claim
    assert context.window is not None
    base = replace(claim_report(job, claim), revision=context.window.revision)
    try:
        mark = batch.submit(claim, job.trigger, request, plan_of(folding, context.window),
                            now=store.now())
    except SummarizerError as exc:
        log.warning("fold of %s: the batch API refused its request (%s); calling the "
                    "summarizer now", job.session_id, exc)
        again = visit(store, summarizer, job, context, pricing=pricing,
                      out_of_time=out_of_time)
        return replace(again, batch_event="fallen-back",
                       detail="; ".join(x for x in (again.detail, f"batch API: {exc}") if x))
    ticket = BatchTicket.of(claim, mark)
    try:
        store.hold_for_batch(claim, mark)
    except (StaleSpanError, SessionNotFoundError) as exc:
        # The claim moved on while the request went out (an inline fold forced its own, or the
        # session was deleted): nothing waits for the answer.
        cancel_quietly(batch, ticket)
        return replace(base, outcome="stale", detail=str(exc), batch=ticket.to_json(),
                       batch_event="dropped")
    fault_point("after-batch-submit")
    return replace(base, outcome=BATCH_PENDING, batch=ticket.to_json(),
                   batch_event="submitted",
                   detail=f"summary sent to {mark.provider}'s batch API (batch "
                          f"{mark.batch_id}); the fold lands once it is collected")


def cancel_quietly(batch: BatchOffer, ticket: BatchTicket) -> None:
    """Ask the provider to stop ``ticket``'s batch; a batch already over is no error worth
    more than a log line."""
    try:
        batch.api.cancel(ticket.batch_id)
    except SessionfoldError as exc:
        log.info("could not cancel batch %s of %s: %s", ticket.batch_id, ticket.session_id, exc)


class _Lag:
    """The calls background folds took to land in this process lately (a running mean over
    every session): the prior of a session whose own folds have not landed yet. A slow
    summarizer (or a long queue) makes every session's first fold late, and a short session may
    have only that one; 1 (a fold lands by the next call) until a fold has landed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mean: float | None = None

    def prior(self) -> float:
        with self._lock:
            return 1.0 if self._mean is None else max(1.0, self._mean)

    def landed(self, lag: float | None) -> None:
        if lag is None:
            return
        with self._lock:
            self._mean = lag if self._mean is None else (
                (1 - LAG_WEIGHT) * self._mean + LAG_WEIGHT * lag)


FOLD_LAG = _Lag()


def _economics(pricing: FoldPricing, job: FoldJob, info: SessionInfo,
               batch: BatchTerms | None) -> FoldEconomics:
    """What a priced visit is priced with: the cache's state, the calls the session is expected
    to make from now on (its policy's ``expected_calls``, else its age), how late its
    background folds have landed so far (this process's recent folds when it has none), and
    the batch API it may wait for."""
    remaining, growth = expected_calls_left(info.policy, info.calls)
    lag = info.fold_lag_calls if info.fold_lag_calls is not None else FOLD_LAG.prior()
    return FoldEconomics(pricing, cold=job.trigger == "idle", remaining_calls=remaining,
                         horizon_growth=growth, lag_calls=lag, batch=batch)


def _ended(base: FoldReport, record: CompactionRecord) -> FoldReport:
    """The report of a visit that ended before planning, with its record."""
    return replace(base, outcome=record.outcome, tokens_before=record.measured_tokens,
                   tokens_after=record.tokens_after, detail=record.detail, record=record)


def _land(store: SessionStore, claim: Claim, result: FoldResult,
          base: FoldReport) -> FoldReport:
    """Write the visit in one store call: commit the fold, or record a visit that changed
    nothing."""
    record = result.record
    report = replace(
        base, outcome=record.outcome, tokens_before=record.measured_tokens,
        tokens_after=record.tokens_after, spans=len(result.spans),
        summarizer_usage=record.summarizer_usage,
        refusals=tuple(sorted({r.reason for r in record.refusals})), detail=record.detail,
        retry_error=(result.summarizer_error
                     if isinstance(result.summarizer_error, TransientSummarizerError) else None),
        record=record,
    )
    try:
        commit = store.finish_fold(claim, result)
    except StaleSpanError as exc:
        # Nothing of the fold was written (the store recorded the stale visit itself). What the
        # summarizer cost is still reported: it was paid.
        return _stale(report, str(exc))
    if not result.changed:
        return report
    FOLD_LAG.landed(commit.lag_calls)
    return replace(report, revision=commit.revision,
                   detail=record.detail or ("re-committed by a redelivery"
                                            if commit.duplicate else ""))


def _land_record(store: SessionStore, claim: Claim, report: FoldReport) -> FoldReport:
    """Write ``report.record`` under the claim (releasing it). A visit whose session was deleted
    and created again meanwhile is recorded by the store as ``stale`` instead."""
    assert report.record is not None
    try:
        store.finish_fold(claim, report.record)
    except StaleSpanError as exc:
        return _stale(report, str(exc))
    return report


def _stale(report: FoldReport, why: str) -> FoldReport:
    """``report`` as a lost race: nothing of it landed, nothing is retried."""
    record = report.record.as_stale(why) if report.record is not None else None
    return replace(report, outcome="stale", spans=0, retry_error=None, detail=why, record=record)


def _measured(job: FoldJob, info: SessionInfo) -> int | None:
    """The provider-measured size of the window to fold, when one is known."""
    if job.measured_tokens is not None:
        return job.measured_tokens
    # ``current_tokens`` is the last accepted report plus the calibrated estimate of what was
    # appended since; never measured, it is only an estimate, which fold_window makes itself.
    return info.current_tokens if info.measured_tokens is not None else None
