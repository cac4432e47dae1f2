"""The one fold procedure, shared by the Celery task and the client's inline fallback.

::

    claim the session in the store  →  read the window and the session  →
    core.fold_window (the summarizer is called here, outside any transaction)  →
    store.commit_fold, or store.record_visit when nothing changed

Why each step sits where it does:

- **The claim comes first**, before anything is paid for: a redelivered job finds its own visit
  already written (``already-committed``), a duplicate delivery finds the live claim of its twin,
  and a job overtaken by a newer one finds the newer epoch (``newer-claim``). All of them stop
  with outcome ``skipped`` and no summarizer call. The claim lives in the store, not in Redis,
  which may lose it; the Redis lock of the scheduler only saves work.
- **No transaction is open while the summarizer runs**: every store call is one short
  transaction, and the commit checks (compare-and-set on item versions, and the claimed epoch)
  that nothing the plan relied on changed meanwhile. Appends only add items after the planned
  ones, so an agent appending during a fold never makes it stale.
- **A lost compare-and-set** (:class:`StaleSpanError`) wrote nothing but the visit's ``stale``
  record. A background job ends there (the scheduler comes back if the session is still over
  budget). The inline fallback (``replan=True``) re-reads the session: if the fold that won
  already brought it under the target it stops; otherwise it claims again and plans once more.
- **A transient summarizer failure** still commits whatever the cheap layers did (masking old
  tool output is worth keeping) and the report carries the error in :attr:`FoldReport.retry_error`
  for the Celery task to retry. Every store job id is used for one visit only, so a retry runs
  under its own job id (see :func:`store_job_id`).
- **Celery's soft time limit** (``SoftTimeLimitExceeded``, raised into the planner or the
  summarizer wherever it happens to be) ends the visit like a transient summarizer failure: a
  ``summarizer-failed`` refusal (detail ``soft time limit``) is recorded, which releases the
  claim at once instead of leaving it to block the session until its lease runs out, and the
  report carries a :class:`TransientSummarizerError` so the task retries with its backoff.
- **A session whose folds keep dying** (``FoldJob.max_abandoned``): the store counts claims
  taken over from holders that never finished, per session; at the cap the claim answers
  ``abandoned`` and the visit stops as ``skipped`` with that claim status, before any
  summarizer call, for the task to give the session up.

Fault points (tests only): with ``SESSIONFOLD_TEST_PAUSE_AT`` naming a point and
``SESSIONFOLD_TEST_PAUSE_MARKER`` a file path, the first process to reach that point creates the
file (holding its pid) and then waits for ever, so a test can SIGKILL a worker at exactly that
moment instead of sleeping and hoping. Points: ``after-summary`` (the summarizer returned, nothing
committed yet) and ``after-commit`` (committed, the Celery message not yet acknowledged).
With ``SESSIONFOLD_TEST_KILL_AT`` naming a point instead, *every* process reaching it kills
itself with SIGKILL (a fold that takes its worker down each time it runs).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

# Celery raises billiard's class (celery.exceptions re-exports it); importing it from billiard
# keeps the client, which shares this module, from importing Celery.
from billiard.exceptions import SoftTimeLimitExceeded  # type: ignore[import-untyped]
from sessionfold.core.compact import FoldResult, fold_window
from sessionfold.core.errors import StaleSpanError, TransientSummarizerError
from sessionfold.core.summarizers import ExtractiveSummarizer, Summarizer
from sessionfold.core.window import (
    CompactionRecord,
    Refusal,
    SummarizerUsage,
    Trigger,
    WindowItem,
)

if TYPE_CHECKING:
    from sessionfold.store import SessionStore
    from sessionfold.store.results import Claim, SessionInfo

    from .settings import Settings

__all__ = [
    "KILL_AT_ENV",
    "PAUSE_AT_ENV",
    "PAUSE_MARKER_ENV",
    "FoldJob",
    "FoldReport",
    "fault_point",
    "make_summarizer",
    "run_fold",
    "store_job_id",
]

log = logging.getLogger(__name__)

PAUSE_AT_ENV = "SESSIONFOLD_TEST_PAUSE_AT"
PAUSE_MARKER_ENV = "SESSIONFOLD_TEST_PAUSE_MARKER"
KILL_AT_ENV = "SESSIONFOLD_TEST_KILL_AT"
SOFT_TIME_LIMIT = "soft time limit"


@dataclass(frozen=True)
class FoldJob:
    """One visit to fold a session: who asks, why, and how hard.

    ``enqueued_epoch`` is the session's ``fold_epoch`` when the job was enqueued (None: do not
    compare). ``force`` (the inline fallback) claims over any other claim and folds even under
    the trigger. ``target_tokens`` overrides the policy's target (overflow: half the budget).
    ``measured_tokens`` is a size the caller knows better than the store (the token count of a
    provider's "prompt is too long" error). ``lease_s`` bounds the claim: a worker that dies
    holding it blocks the session no longer than that. ``replan`` re-plans once after a lost race.
    ``max_abandoned`` (the Celery task: ``max_attempts``) stops a session whose folds were
    abandoned that many times in a row (claim status ``abandoned``); None never stops.
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

    @property
    def summarizer_calls(self) -> int:
        return self.summarizer_usage.calls

    @property
    def folded(self) -> bool:
        return self.outcome == "folded"

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
        return data


def store_job_id(task_id: str, retries: int) -> str:
    """The store's job id for one attempt of a Celery task.

    The store treats a job id as one visit (a second claim by it answers ``already-committed``),
    while Celery keeps one task id across retries. Redeliveries of the same attempt share the id,
    so the store still catches them; a retry gets a new one.
    """
    return task_id if retries == 0 else f"{task_id}~r{retries}"


def make_summarizer(settings: Settings) -> Summarizer:
    """The summarizer the settings name: Anthropic's cheap model, or the offline extractive one.

    The Anthropic client is built with ``max_retries=0``: the Celery task owns retries, their
    count and their cap (and the SDK would honour a retry-after without an upper bound).
    ``ANTHROPIC_BASE_URL`` (``settings.anthropic_base_url``) points it at another endpoint (the
    scripted provider in tests).
    """
    if settings.summarizer_kind == "anthropic":
        key = settings.anthropic_api_key
        from sessionfold.core.anthropic_summarizer import AnthropicSummarizer  # import cost: ~1 s

        return AnthropicSummarizer(api_key=key.get_secret_value() if key else None,
                                   base_url=settings.anthropic_base_url,
                                   model=settings.summarizer_model,
                                   timeout=settings.summarizer_timeout_s)
    return ExtractiveSummarizer()


def run_fold(store: SessionStore, summarizer: Summarizer | None, job: FoldJob) -> FoldReport:
    """Claim, plan, summarize, commit: one visit (and, with ``job.replan``, one re-plan).

    Raises what the store raises (SessionNotFoundError, StoreError...) and nothing of the
    summarizer's: a summarizer failure is a refusal in the record, and a transient one is also
    returned in :attr:`FoldReport.retry_error`. A store error after the claim leaves the claim
    to its lease: the session waits no longer than ``job.lease_s`` for the next visit.
    """
    report = _visit(store, summarizer, job)
    if report.outcome != "stale" or not job.replan:
        return report
    # Lost the race (another inline fold, or a claim that outlived ours). The winner may have
    # done the work already: look before paying again.
    info = store.get_session(job.session_id)
    target = job.target_tokens if job.target_tokens is not None else info.policy.target_tokens
    if info.current_tokens <= target:
        return replace(report, detail=f"a concurrent fold won; the window is at "
                                      f"{info.current_tokens} tokens, under the target {target}")
    # The provider's count named the window before the winner's fold: measure afresh.
    again = _visit(store, summarizer, replace(job, job_id=f"{job.job_id}~replan",
                                              measured_tokens=None, replan=False))
    return replace(again, replans=1,
                   summarizer_usage=report.summarizer_usage + again.summarizer_usage)


def _visit(store: SessionStore, summarizer: Summarizer | None, job: FoldJob) -> FoldReport:
    sid = job.session_id
    claim = store.claim(sid, job.job_id, enqueued_epoch=job.enqueued_epoch, lease_s=job.lease_s,
                        force=job.force, max_abandoned=job.max_abandoned)
    base = FoldReport(session_id=sid, job_id=job.job_id, trigger=job.trigger,
                      outcome="skipped", claim=claim.status, epoch=claim.epoch,
                      revision=claim.revision, detail=claim.detail)
    if not claim.claimed:
        return base
    window = store.read_window(sid)
    info = store.get_session(sid)
    if info.paused and not job.force and job.trigger == "threshold":
        record = _paused_record(info, job)
        store.record_visit(sid, record, job_id=job.job_id, epoch=claim.epoch)
        return replace(base, outcome=record.outcome, revision=window.revision,
                       tokens_before=record.measured_tokens, tokens_after=record.tokens_after,
                       detail=record.detail, record=record)
    try:
        result = fold_window(
            window.items, info.policy, summarizer, system=window.system,
            measured_tokens=_measured(job, info), calibration=info.calibration,
            trigger=job.trigger, force=job.force, target_tokens=job.target_tokens,
            latched=store.latched(sid),
        )
    except SoftTimeLimitExceeded:
        # The hard limit follows shortly: release the claim now (a recorded visit), so the
        # session is not blocked for a whole lease, and let the task retry later.
        record = _out_of_time_record(info, job, window.items)
        store.record_visit(sid, record, job_id=job.job_id, epoch=claim.epoch)
        log.warning("fold of %s by %s hit the soft time limit; visit recorded", sid, job.job_id)
        return replace(base, outcome=record.outcome, revision=window.revision,
                       tokens_before=record.measured_tokens, tokens_after=record.tokens_after,
                       refusals=("summarizer-failed",), detail=record.detail, record=record,
                       retry_error=TransientSummarizerError(
                           f"{SOFT_TIME_LIMIT}: the fold ran out of time"))
    fault_point("after-summary")
    return _land(store, job, claim, result, replace(base, revision=window.revision))


def _land(store: SessionStore, job: FoldJob, claim: Claim, result: FoldResult,
          base: FoldReport) -> FoldReport:
    """Write the visit: commit the fold, or record a visit that changed nothing."""
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
    if not result.changed:
        store.record_visit(job.session_id, record, job_id=job.job_id, epoch=claim.epoch)
        return report
    try:
        commit = store.commit_fold(job.session_id, result, epoch=claim.epoch, job_id=job.job_id)
    except StaleSpanError as exc:
        # Nothing of the fold was written (the store recorded the stale visit itself). What the
        # summarizer cost is still reported: it was paid.
        stale = record.model_copy(update={"outcome": "stale", "detail": str(exc)})
        return replace(report, outcome="stale", spans=0, retry_error=None, detail=str(exc),
                       record=stale)
    return replace(report, revision=commit.revision,
                   detail=record.detail or ("re-committed by a redelivery"
                                            if commit.duplicate else ""))


def _measured(job: FoldJob, info: SessionInfo) -> int | None:
    """The provider-measured size of the window to fold, when one is known."""
    if job.measured_tokens is not None:
        return job.measured_tokens
    # ``current_tokens`` is the last accepted report plus the calibrated estimate of what was
    # appended since; never measured, it is only an estimate, which fold_window makes itself.
    return info.current_tokens if info.measured_tokens is not None else None


def _paused_record(info: SessionInfo, job: FoldJob) -> CompactionRecord:
    policy = info.policy
    return CompactionRecord(
        trigger=job.trigger, outcome="nothing-to-fold", budget_tokens=policy.budget_tokens,
        target_tokens=job.target_tokens or policy.target_tokens,
        measured_tokens=info.current_tokens,
        measured_by="reported" if info.measured_tokens is not None else "estimate",
        tokens_after=info.current_tokens,
        detail="the session is paused: background folds wait until it is resumed",
    )


def _out_of_time_record(info: SessionInfo, job: FoldJob,
                        items: list[WindowItem]) -> CompactionRecord:
    """The record of a visit cut short by Celery's soft time limit (nothing was changed; what
    the summarizer was paid for is unknown, the call did not return)."""
    policy = info.policy
    start = items[0].start_seq if items else 0
    end = items[-1].end_seq if items else 0
    measured = _measured(job, info)
    return CompactionRecord(
        trigger=job.trigger, outcome="refused", budget_tokens=policy.budget_tokens,
        target_tokens=job.target_tokens or policy.target_tokens,
        measured_tokens=measured if measured is not None else info.current_tokens,
        measured_by="reported" if measured is not None else "estimate",
        tokens_after=info.current_tokens, forced=job.force,
        refusals=(Refusal(reason="summarizer-failed", start_seq=start, end_seq=end,
                          detail=SOFT_TIME_LIMIT),),
        detail=f"{SOFT_TIME_LIMIT}: the visit ran out of time before it could fold; retried",
    )


def fault_point(name: str) -> None:
    """Test hook: the first process to reach point ``name`` marks it and waits for ever.

    Does nothing unless ``SESSIONFOLD_TEST_PAUSE_AT`` equals ``name`` and
    ``SESSIONFOLD_TEST_PAUSE_MARKER`` names a file that does not exist yet. Creating the marker
    is atomic (``O_EXCL``), so of several processes, and of a redelivery after the kill, only
    the first one stops: the job can then run to its end.

    ``SESSIONFOLD_TEST_KILL_AT`` equal to ``name``: every process reaching it SIGKILLs itself.
    """
    if os.environ.get(KILL_AT_ENV) == name:
        log.warning("fault point %s reached in pid %d: killing it", name, os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(PAUSE_AT_ENV) != name:
        return
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)
    log.warning("fault point %s reached in pid %d: waiting to be killed", name, os.getpid())
    while True:
        time.sleep(3600)
