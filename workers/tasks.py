"""The Celery task ``sessionfold.fold_session``: one background fold of one session.

::

    fold_session(session_id, enqueued_epoch=None, trigger="threshold", lock_token=None)

1. Count this delivery (Redis). ``task_reject_on_worker_lost`` requeues a job whose worker died
   without limit (celery #9082); past ``max_attempts`` deliveries the job is dead-lettered in the
   store and stops — unless the store shows a twin delivery at work, which is a duplicate, not a
   failure.
2. Run the shared fold procedure (:func:`~sessionfold.workers.folding.run_fold`): claim in the
   store (a redelivery of a committed job, a duplicate, or a job overtaken by a newer claim stops
   here, before any summarizer call), fold, commit. The summarizer holds a global slot per call
   (:class:`~sessionfold.workers.gate.SummarizerSlots`); a session past its spend cap folds
   with the free layers only.

   A worker lost mid-fold is not seen by the delivery count: the immediate redelivery finds the
   dead fold's claim live and stops, and after the lease the scheduler enqueues a new job. The
   store counts such abandoned claims per session instead, and the claim passes
   ``max_attempts`` as the cap: at it the claim answers ``abandoned``, and the session is given
   up — dead-lettered, and *paused*, so no background fold of it runs again (and no summarizer
   is paid) until an operator runs ``sessionfold resume SESSION``.
3. A transient summarizer error (429, 529, 5xx, timeout, no free slot, Celery's soft time
   limit) is retried with capped
   exponential backoff, honouring ``retry-after`` up to the cap; the settings keep the cap plus
   the hard time limit within the broker's visibility timeout, so a countdown never outlives it
   (an ETA message held past it is delivered twice). A permanent one is a recorded refusal
   (``summarizer-failed``), not retried. A lost compare-and-set ends the job as ``stale``.
4. Release the scheduler's per-session lock (compare-and-delete on the token the job carries);
   a retrying job keeps it, extended. A job that fails with an error keeps it until it expires
   (``lock_ttl_s``): a backoff before the scheduler tries that session again, so a store outage
   does not turn every usage event into a failing job.

The task returns :meth:`FoldReport.to_json` (session, outcome, tokens, spans…): Flower shows it
in the task list beside the arguments, so every fold is visible with its session and outcome.
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import Any, cast, get_args

from sessionfold.core.errors import InvalidInputError, SessionNotFoundError
from sessionfold.core.summarizers import Summarizer
from sessionfold.core.window import CompactionRecord, Trigger

from .celery_app import FOLD_TASK, WorkerRuntime, runtime_of
from .folding import FoldJob, FoldReport, fault_point, run_fold, store_job_id
from .gate import summarizer_cost_usd
from .locks import FoldLock
from .metrics import metrics
from .redis_conn import mapped_errors

__all__ = ["fold_session", "register", "retry_countdown"]

log = logging.getLogger(__name__)

_TRIGGERS: tuple[str, ...] = get_args(Trigger)


def register(app: Any) -> Any:
    """Register :func:`fold_session` on ``app`` (done by ``make_celery``)."""
    return app.task(bind=True, name=FOLD_TASK, acks_late=True, reject_on_worker_lost=True,
                    max_retries=None, track_started=True)(fold_session)


def retry_countdown(retries: int, *, base_s: float, cap_s: float,
                    retry_after: float | None = None) -> float:
    """Seconds before retry number ``retries + 1``: exponential with jitter, capped.

    ``retry_after`` (the provider's hint) is honoured as a lower bound, but never beyond the
    cap: the cap keeps the countdown inside the broker's visibility timeout.
    """
    backoff = min(cap_s, base_s * 2.0 ** min(retries, 30))
    backoff *= random.uniform(0.8, 1.0)  # jitter: jobs failed together do not retry together
    if retry_after is not None and retry_after > backoff:
        backoff = retry_after
    return max(0.0, min(cap_s, backoff))


def fold_session(task: Any, session_id: str, enqueued_epoch: int | None = None,
                 trigger: str = "threshold", lock_token: str | None = None) -> dict[str, Any]:
    """Fold one session in the background (the body of the Celery task; see the module doc)."""
    if trigger not in _TRIGGERS:
        raise InvalidInputError(f"trigger must be one of {', '.join(_TRIGGERS)}, got {trigger!r}")
    runtime = runtime_of(task.app)
    settings = runtime.settings
    request = task.request
    job = FoldJob(session_id=session_id, job_id=store_job_id(request.id, request.retries),
                  trigger=cast(Trigger, trigger), enqueued_epoch=enqueued_epoch,
                  lease_s=settings.task_time_limit_s, max_abandoned=settings.max_attempts)
    attempts_key = runtime.keys.fold_attempts(job.job_id)
    deliveries = _count_delivery(runtime, attempts_key)
    lock = FoldLock.from_settings(settings, runtime.redis)
    meter = metrics()
    with meter.track_fold(trigger) as visit:
        try:
            if deliveries > settings.max_attempts:
                report = _give_up(runtime, job, deliveries,
                                  f"delivered {deliveries} times (max {settings.max_attempts}): "
                                  "its worker was lost each time")
            else:
                report = _fold(runtime, job)
                if report.claim == "abandoned":
                    report = _abandon(runtime, job, report)
        except SessionNotFoundError:
            report = FoldReport(session_id=session_id, job_id=job.job_id, trigger=trigger,
                                outcome="skipped", claim="none",
                                detail="the session no longer exists")
        if report.record is not None:
            visit.done(report.record, cost_usd=summarizer_cost_usd(report.summarizer_usage))
    if report.outcome == "dead-lettered":
        meter.record_dead_letter("worker-lost" if report.claim == "abandoned"
                                 else "max-attempts")
    if report.retry_error is not None:
        _retry_or_give_up(task, runtime, job, report, lock, lock_token, attempts_key)
    fault_point("after-commit")
    _release_lock(lock, session_id, lock_token)
    _forget_deliveries(runtime, attempts_key)
    result = report.to_json()
    result["deliveries"] = deliveries
    log.info("fold of %s: %s (%s)", session_id, report.outcome, report.detail or report.claim)
    return result


def _retry_or_give_up(task: Any, runtime: WorkerRuntime, job: FoldJob, report: FoldReport,
                      lock: FoldLock, lock_token: str | None, attempts_key: str) -> None:
    """Retry a transient summarizer failure later (raises Celery's Retry), or, past
    ``max_attempts`` retries, dead-letter the job and return."""
    settings = runtime.settings
    retries = task.request.retries
    err = report.retry_error
    assert err is not None
    if retries >= settings.max_attempts:
        runtime.store.dead_letter(job.job_id, job.session_id,
                                  f"summarizer still failing after {retries} retries: {err}",
                                  retries + 1, _payload(job, lock_token))
        metrics().record_dead_letter("retries-exhausted")
        return
    # The lock stays with the job through its countdown, so no twin is enqueued meanwhile.
    _keep_lock(lock, job.session_id, lock_token,
               settings.retry_backoff_cap_s + settings.task_time_limit_s)
    countdown = retry_countdown(retries, base_s=settings.retry_backoff_base_s,
                                cap_s=settings.retry_backoff_cap_s, retry_after=err.retry_after)
    metrics().record_retry(str(err.status_code) if err.status_code else "unavailable")
    _forget_deliveries(runtime, attempts_key)  # the retry is a new attempt, with its own count
    log.info("fold of %s: summarizer unavailable (%s); retry %d in %.1fs", job.session_id,
             err, retries + 1, countdown)
    # The retry claims with the epoch this attempt claimed: it stops if anyone claimed since.
    raise task.retry(args=[job.session_id],
                     kwargs={"enqueued_epoch": report.epoch, "trigger": job.trigger,
                             "lock_token": lock_token},
                     countdown=countdown, exc=err)


def _fold(runtime: WorkerRuntime, job: FoldJob) -> FoldReport:
    """Run the shared procedure with this worker's summarizer, minding the spend cap."""
    spend_key = runtime.keys.summarizer_spend(job.session_id)
    summarizer: Summarizer | None = runtime.summarizer
    capped = runtime.spend.exhausted(spend_key)
    if capped:
        summarizer = None  # the free layers still run; fold_window notes the skipped summary
    report = run_fold(runtime.store, summarizer, job)
    if report.summarizer_calls:
        runtime.spend.add(spend_key, report.summarizer_usage)
    if capped:
        note = (f"summarizer spend cap of ${runtime.spend.cap_usd:g} reached for this session: "
                "folded with the free layers only")
        return replace(report, detail="; ".join(x for x in (report.detail, note) if x))
    return report


def _give_up(runtime: WorkerRuntime, job: FoldJob, deliveries: int, reason: str) -> FoldReport:
    """Dead-letter a job that keeps coming back, unless a twin delivery holds the session.

    The claim tells the two apart: a duplicate delivery finds a live claim (or the committed
    visit) and stops as ``skipped``; a job nobody is running gets the claim, is dead-lettered,
    and releases it with a recorded visit that says why.
    """
    store = runtime.store
    claim = store.claim(job.session_id, job.job_id, enqueued_epoch=job.enqueued_epoch,
                        lease_s=job.lease_s)
    base = FoldReport(session_id=job.session_id, job_id=job.job_id, trigger=job.trigger,
                      outcome="skipped", claim=claim.status, epoch=claim.epoch,
                      revision=claim.revision, detail=claim.detail)
    if not claim.claimed:
        return base
    store.dead_letter(job.job_id, job.session_id, reason, deliveries, _payload(job, None))
    info = store.get_session(job.session_id)
    record = CompactionRecord(
        trigger=job.trigger, outcome="refused", budget_tokens=info.policy.budget_tokens,
        target_tokens=info.policy.target_tokens, measured_tokens=info.current_tokens,
        measured_by="reported" if info.measured_tokens is not None else "estimate",
        tokens_after=info.current_tokens, detail=f"dead-lettered: {reason}")
    store.record_visit(job.session_id, record, job_id=job.job_id, epoch=claim.epoch)
    log.error("fold job %s for %s dead-lettered: %s", job.job_id, job.session_id, reason)
    return replace(base, outcome="dead-lettered", detail=reason, record=record)


def _abandon(runtime: WorkerRuntime, job: FoldJob, report: FoldReport) -> FoldReport:
    """Give up a session whose folds keep killing their worker (the claim said ``abandoned``).

    Paused first: from then on no background fold of it is tried (the scheduler skips paused
    sessions), so no summarizer call is paid again until an operator resumes it. Then the dead
    letter and a recorded refusal say why. Nothing was claimed, so nothing is released here.
    """
    store = runtime.store
    sid = job.session_id
    info = store.get_session(sid)
    times = info.abandoned_folds
    reason = (f"the fold of this session was abandoned {times} times in a row (worker lost); "
              f"paused until `sessionfold resume {sid}`")
    store.set_paused(sid, True)
    store.dead_letter(job.job_id, sid, reason, times, _payload(job, None))
    record = CompactionRecord(
        trigger=job.trigger, outcome="refused", budget_tokens=info.policy.budget_tokens,
        target_tokens=info.policy.target_tokens, measured_tokens=info.current_tokens,
        measured_by="reported" if info.measured_tokens is not None else "estimate",
        tokens_after=info.current_tokens, detail=f"dead-lettered: {reason}")
    # Written without the claim (job_id only names the writer): the count stays for an operator
    # to see until the resume clears it.
    store.record_visit(sid, record, job_id=job.job_id)
    log.error("fold of %s dead-lettered by job %s: %s", sid, job.job_id, reason)
    return replace(report, outcome="dead-lettered", detail=reason, record=record)


def _count_delivery(runtime: WorkerRuntime, key: str) -> int:
    """This delivery's number. The count outlives every redelivery the broker can make."""
    settings = runtime.settings
    ttl_s = int(settings.visibility_timeout_s * (settings.max_attempts + 1))
    with mapped_errors("counting a fold job's deliveries"):
        pipe = runtime.redis.pipeline()
        pipe.incr(key)
        pipe.expire(key, ttl_s)
        count, _ = pipe.execute()
    return int(count)


def _forget_deliveries(runtime: WorkerRuntime, key: str) -> None:
    """A job that ran to its end needs no count: a late redelivery stops at the claim anyway."""
    try:
        with mapped_errors("clearing a fold job's delivery count"):
            runtime.redis.delete(key)
    except Exception:  # it expires by itself
        log.warning("could not clear %s", key, exc_info=True)


def _payload(job: FoldJob, lock_token: str | None) -> dict[str, Any]:
    return {"session_id": job.session_id, "enqueued_epoch": job.enqueued_epoch,
            "trigger": job.trigger, "lock_token": lock_token}


def _keep_lock(lock: FoldLock, session_id: str, token: str | None, ttl_s: float) -> None:
    if token is None:
        return
    try:
        lock.extend(session_id, token, int(ttl_s * 1000))
    except Exception:  # the lock only saves work; losing it costs a duplicate visit at most
        log.warning("could not extend the fold lock of %s", session_id, exc_info=True)


def _release_lock(lock: FoldLock, session_id: str, token: str | None) -> None:
    if token is None:
        return
    try:
        lock.release(session_id, token)
    except Exception:  # it expires by itself; the store's claim stays the guard
        log.warning("could not release the fold lock of %s", session_id, exc_info=True)

