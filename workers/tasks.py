"""The Celery task ``sessionfold.fold_session``: one background fold of one session.

::

    fold_session(session_id, enqueued_epoch=None, trigger="threshold", lock_token=None,
                 incarnation=None)

1. Count this delivery (Redis). ``task_reject_on_worker_lost`` requeues a job whose worker died
   without limit (celery #9082); past ``max_attempts`` deliveries the job is dead-lettered in the
   store and stops — unless the store shows a twin delivery at work, which is a duplicate, not a
   failure. Only a redelivery is counted: both brokers mark a message they hand out again
   (RabbitMQ's ``redelivered`` flag; kombu's Redis transport sets it when it restores an
   unacknowledged message), so a job's first delivery is number 1 without a word to Redis, and
   the count it keeps is of the redeliveries: a first delivery costs no round trip for it. (The
   store's count of abandoned claims, below, caps folds that keep dying while they hold the
   claim, whatever the flag says.)
2. Run the shared fold procedure (:func:`~sessionfold.runtime.fold_procedure.run_fold`): claim in
   the store (a redelivery of a committed job, a duplicate, or a job overtaken by a newer claim
   stops here, before any summarizer call), fold, commit. The summarizer is the worker's guarded
   one (:mod:`~sessionfold.runtime.summarizer_guard`): each call holds a global slot, and a
   session past its spend cap folds with the free layers only. The spend is counted per session
   *incarnation* (checked once the claim names it): a session deleted and created again under the
   same id starts at 0.

   A worker lost mid-fold is not seen by the delivery count: a redelivery that finds the dead
   fold's claim still live (RabbitMQ returns the message at once) retries once that lease has
   run out (``_after_own_lease``), and a job lost for good is found again by the sweep. The
   store counts such abandoned claims per session instead, and the claim passes
   ``max_attempts`` as the cap: at it the claim answers ``abandoned``, and the session is given
   up — dead-lettered, and *paused*, so no background fold of it runs again (and no summarizer
   is paid) until an operator runs ``sessionfold resume SESSION``.
3. A transient summarizer error (429, 529, 5xx, timeout, no free slot, Celery's soft time
   limit) is retried with capped
   exponential backoff, honouring ``retry-after`` up to the cap; the settings keep the cap plus
   the hard time limit within the broker's visibility timeout, so a countdown never outlives it
   (an ETA message held past it is delivered twice). The retry carries the epoch and the
   session incarnation it claimed: if the session was deleted and created again meanwhile, the
   retry claims nothing and ends as ``skipped`` (the session it was for no longer exists). A
   permanent one is a recorded refusal (``summarizer-failed``), not retried. A lost
   compare-and-set ends the job as ``stale``.
4. Release the scheduler's per-session lock (compare-and-delete on the token the job carries);
   a retrying job keeps it, extended. A job that fails with an error keeps it until it expires
   (``lock_ttl_s``): a backoff before the scheduler tries that session again, so a store outage
   does not turn every usage event into a failing job.

The task returns :meth:`FoldReport.to_json` (session, outcome, tokens, spans…): Flower shows it
in the task list beside the arguments, so every fold is visible with its session and outcome.

With ``batch_folds`` on, a fold that can wait is sent to the provider's batch API instead
(outcome ``batch-pending``, the batch in the result's ``batch``): its ticket goes into the
partition's pending set, and a collection job (:mod:`.batch_tasks`) lands it later.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, cast, get_args

from celery.exceptions import SoftTimeLimitExceeded  # type: ignore[import-untyped]
from sessionfold.core.errors import (
    InvalidInputError,
    RedisUnavailableError,
    SessionNotFoundError,
)
from sessionfold.core.window import Trigger
from sessionfold.runtime.batch_folds import BatchTicket
from sessionfold.runtime.faults import fault_point
from sessionfold.runtime.fold_procedure import FoldJob, FoldReport, run_fold, store_job_id
from sessionfold.runtime.metrics import metrics
from sessionfold.runtime.prices import summarizer_cost_usd
from sessionfold.runtime.redis_conn import mapped_errors

from .locks import FoldLock
from .pending_batches import PendingBatches
from .runtime import WorkerRuntime, runtime_of

__all__ = ["FOLD_TASK", "fold_session", "register", "retry_countdown"]

log = logging.getLogger(__name__)

#: The task's name on the broker (what ``make_enqueue`` sends and Flower lists).
FOLD_TASK = "sessionfold.fold_session"

_TRIGGERS: tuple[str, ...] = get_args(Trigger)


def register(app: Any) -> Any:
    """Register :func:`fold_session` on ``app`` (done by ``make_celery``)."""
    return app.task(bind=True, name=FOLD_TASK, acks_late=True, reject_on_worker_lost=True,
                    max_retries=None, track_started=False)(fold_session)


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
                 trigger: str = "threshold", lock_token: str | None = None,
                 incarnation: int | None = None) -> dict[str, Any]:
    """Fold one session in the background (the body of the Celery task; see the module doc).

    ``incarnation`` is set on retries only (the session incarnation the first attempt claimed).
    """
    if trigger not in _TRIGGERS:
        raise InvalidInputError(f"trigger must be one of {', '.join(_TRIGGERS)}, got {trigger!r}")
    runtime = runtime_of(task.app)
    settings = runtime.settings
    request = task.request
    job = FoldJob(session_id=session_id, job_id=store_job_id(request.id, request.retries),
                  trigger=cast(Trigger, trigger), enqueued_epoch=enqueued_epoch,
                  lease_s=settings.task_time_limit_s, max_abandoned=settings.max_attempts,
                  incarnation=incarnation)
    attempts_key = runtime.keys.fold_attempts(job.job_id)
    redelivered = _redelivered(request)
    deliveries = 1 + _count_redelivery(runtime, attempts_key) if redelivered else 1
    lock = FoldLock.from_settings(settings, runtime.redis)
    meter = metrics()
    with meter.track_fold(trigger) as timer:
        try:
            if deliveries > settings.max_attempts:
                report = _give_up(runtime, job, deliveries,
                                  f"delivered {deliveries} times (max {settings.max_attempts}): "
                                  "its worker was lost each time")
            else:
                report = _fold(runtime, job)
                if report.claim == "abandoned":
                    report = _abandon(runtime, job, report)
                else:
                    _after_own_lease(task, runtime, job, report, lock, lock_token)
        except SessionNotFoundError:
            report = FoldReport(session_id=session_id, job_id=job.job_id, trigger=trigger,
                                outcome="skipped", claim="none",
                                detail="the session no longer exists")
        if report.record is not None:
            timer.done(report.record, cost_usd=summarizer_cost_usd(report.summarizer_usage,
                                                                   runtime.spend.prices))
    if report.outcome == "dead-lettered":
        meter.record_dead_letter("worker-lost" if report.claim == "abandoned"
                                 else "max-attempts")
    if report.batch_event is not None:
        _batch_sent(runtime, report)
    if report.retry_error is not None:
        _retry_or_give_up(task, runtime, job, report, lock, lock_token, attempts_key)
    fault_point("after-commit")
    lock.release_quietly(session_id, lock_token)
    if redelivered:  # a first delivery left no count behind
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
    # The retry claims with the epoch and incarnation this attempt claimed: it stops if anyone
    # claimed since, or if the session was deleted (and perhaps created again) meanwhile.
    raise task.retry(args=[job.session_id],
                     kwargs={"enqueued_epoch": report.epoch, "trigger": job.trigger,
                             "lock_token": lock_token, "incarnation": report.incarnation},
                     countdown=countdown, exc=err)


def _after_own_lease(task: Any, runtime: WorkerRuntime, job: FoldJob, report: FoldReport,
                     lock: FoldLock, lock_token: str | None) -> None:
    """A job that finds its own earlier delivery's claim still live retries once the lease ends.

    The claim is held by an earlier delivery of this task: the same attempt redelivered by the
    broker (its worker died or lost the broker), or an earlier attempt whose lease outlived it.
    On a Redis broker a lost delivery comes back only after the visibility timeout, past the
    lease, so this is rare; on RabbitMQ a dead worker's message returns the moment its
    connection closes, while the dead delivery's claim still has most of its lease. That
    delivery may also still be running (a worker that lost the broker), so the lease is waited
    out, never broken: the retry (a new attempt, with the epoch and incarnation the claim
    holds) claims once it has expired, or stops at ``already-committed`` if the earlier one
    committed after all. Two fresh publishes of one task id at once (not redelivered) are
    twins, and the one without the claim stops as before.

    Returns when there is nothing to wait for; raises Celery's Retry otherwise.
    """
    if report.outcome != "skipped" or report.claim != "newer-claim":
        return
    request = task.request
    settings = runtime.settings
    info = runtime.store.get_session(job.session_id)
    holder = info.claimed_by
    if holder is None or info.claim_expires_at is None:
        return
    if info.batch is not None:
        return  # the claim waits on a batch: its collection lands it, not a retry of this job
    if holder != request.id and not holder.startswith(f"{request.id}~r"):
        return  # another task's claim: a newer job's, and it is theirs to finish
    if holder == job.job_id and not _redelivered(request):
        return  # a twin delivery of this attempt is at work
    if request.retries >= settings.max_attempts:
        return  # waited long enough: the sweep finds the session again
    remaining = (info.claim_expires_at - datetime.now(UTC)).total_seconds()
    # Past the lease, and within the broker's visibility timeout (an ETA message held longer
    # is delivered twice on Redis); a retry that still finds the claim waits again.
    ceiling = max(1.0, settings.visibility_timeout_s - settings.task_time_limit_s - 1.0)
    countdown = min(max(remaining, 0.0) + 1.0, ceiling)
    _keep_lock(lock, job.session_id, lock_token, countdown + settings.task_time_limit_s)
    metrics().record_retry("lease")
    log.info("fold of %s: an earlier delivery of this job still holds the claim; retry in "
             "%.1fs, once its lease has run out", job.session_id, countdown)
    raise task.retry(args=[job.session_id],
                     kwargs={"enqueued_epoch": report.epoch, "trigger": job.trigger,
                             "lock_token": lock_token, "incarnation": report.incarnation},
                     countdown=countdown)


def _fold(runtime: WorkerRuntime, job: FoldJob) -> FoldReport:
    """Run the shared procedure with this worker's guarded summarizer (slots, spend cap) and,
    with ``batch_folds`` on, its provider's batch API; the soft time limit ends the visit as
    the procedure's ``out_of_time`` (a recorded visit, a retry)."""
    return run_fold(runtime.store, runtime.summarizer, job, pricing=runtime.pricing,
                    out_of_time=(SoftTimeLimitExceeded,), batch=runtime.batch)


def _batch_sent(runtime: WorkerRuntime, report: FoldReport) -> None:
    """Count what became of a batch fold's batch; a batch sent goes into its partition's
    pending set, first looked at after one poll interval (see :mod:`.pending_batches`)."""
    assert report.batch_event is not None and report.batch is not None
    metrics().record_batch(report.batch_event)
    if report.batch_event != "submitted":
        return
    ticket = BatchTicket.from_json(report.batch)
    try:
        PendingBatches(runtime.redis, runtime.keys).add(
            ticket, time.time() + runtime.settings.batch_poll_interval_s)
    except RedisUnavailableError as exc:
        # The session row's mark stays the truth: the sweep adds the ticket back from it.
        log.warning("could not remember batch %s of %s: %s", ticket.batch_id,
                    ticket.session_id, exc)


def _give_up(runtime: WorkerRuntime, job: FoldJob, deliveries: int, reason: str) -> FoldReport:
    """Dead-letter a job that keeps coming back, unless a twin delivery holds the session.

    The claim tells the two apart: a duplicate delivery finds a live claim (or the committed
    visit) and stops as ``skipped``; a job nobody is running gets the claim, and gives it up
    in one store transaction: the dead letter, the refusal that says why, and the claim
    released (:meth:`SessionStore.give_up`).
    """
    store = runtime.store
    claim = store.claim(job.session_id, job.job_id, enqueued_epoch=job.enqueued_epoch,
                        lease_s=job.lease_s, incarnation=job.incarnation)
    base = FoldReport(session_id=job.session_id, job_id=job.job_id, trigger=job.trigger,
                      outcome="skipped", claim=claim.status, epoch=claim.epoch,
                      revision=claim.revision, incarnation=claim.incarnation,
                      detail=claim.detail)
    if not claim.claimed:
        return base
    gave_up = store.give_up(job.session_id, job.job_id, reason, deliveries, _payload(job, None),
                            trigger=job.trigger, epoch=claim.epoch,
                            incarnation=claim.incarnation)
    log.error("fold job %s for %s dead-lettered: %s", job.job_id, job.session_id, reason)
    return replace(base, outcome="dead-lettered", detail=reason, record=gave_up.record)


def _abandon(runtime: WorkerRuntime, job: FoldJob, report: FoldReport) -> FoldReport:
    """Give up a session whose folds keep killing their worker (the claim said ``abandoned``).

    One store transaction pauses it, dead-letters the job and records the refusal that says why
    (:meth:`SessionStore.give_up`), so no reader sees a paused session without its reason. Once
    paused, no background fold of it is tried (the scheduler skips paused sessions) and no
    summarizer call is paid until an operator resumes it. Nothing was claimed, so nothing is
    released: the count of abandoned folds stays for an operator to see until the resume.
    """
    store = runtime.store
    sid = job.session_id
    times = store.get_session(sid).abandoned_folds
    reason = (f"the fold of this session was abandoned {times} times in a row (worker lost); "
              f"paused until `sessionfold resume {sid}`")
    # The incarnation the claim was refused in: a session deleted and created again meanwhile
    # is not paused for its predecessor's failures (SessionNotFoundError: the job is skipped).
    gave_up = store.give_up(sid, job.job_id, reason, times, _payload(job, None),
                            trigger=job.trigger, pause=True, incarnation=report.incarnation)
    log.error("fold of %s dead-lettered by job %s: %s", sid, job.job_id, reason)
    return replace(report, outcome="dead-lettered", detail=reason, record=gave_up.record)


def _redelivered(request: Any) -> bool:
    """Whether the broker handed this message out before (its ``redelivered`` mark)."""
    return bool((request.delivery_info or {}).get("redelivered"))


def _count_redelivery(runtime: WorkerRuntime, key: str) -> int:
    """This redelivery's number (1 for the first). The count outlives every redelivery the
    broker can make."""
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
            "trigger": job.trigger, "lock_token": lock_token, "incarnation": job.incarnation}


def _keep_lock(lock: FoldLock, session_id: str, token: str | None, ttl_s: float) -> None:
    if token is None:
        return
    try:
        lock.extend(session_id, token, int(ttl_s * 1000))
    except Exception:  # the lock only saves work; losing it costs a duplicate visit at most
        log.warning("could not extend the fold lock of %s", session_id, exc_info=True)


