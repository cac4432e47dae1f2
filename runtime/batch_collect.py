"""Collecting a batch fold: look at its batch, and land the fold through the claim it holds.

::

    report = collect_batch(store, guard, offer, ticket, pricing=pricing)

One look (:func:`collect_batch`), asked for by the scheduler every ``batch_poll_interval_s``
(:mod:`sessionfold.workers.batch_tasks`):

1. The session must still be the one the batch was sent for, still waiting on this batch: a
   session deleted (or deleted and created again) gets nothing, and its batch is cancelled
   (``dropped``); a fold whose claim moved on (an inline fold forced its own, a claim past the
   deadline) likewise. A fold already committed by an earlier look is left alone.
2. Ask the provider. Still running: wait for the next look (``batch-pending``), unless the
   fold may wait no longer: past its deadline, or its session woke and grew past its policy's
   trigger. Then the batch is cancelled and the summarizer called now (``fallen-back``).
3. Ended with a summary: take up the claim again (:meth:`SessionStore.resume_batch
   <sessionfold.store.store.SessionStore.resume_batch>`) and make the visit again from the plan
   with that answer (:func:`~.fold_procedure.visit`), landing it through the commit every fold
   takes: compare-and-set on the items the plan changes, the claim's epoch and incarnation
   (``collected``). Expired, cancelled, failed, or an errored request: the visit is made now,
   with the live summarizer, on the window as it is (``fallen-back``).

What the summarizer cost (at the batch rate for the batch's answer) is counted against the
session once the visit has landed, as for any fold.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sessionfold.core.errors import SessionNotFoundError, SummarizerError
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.core.summarizers import Summarizer, Summary
from sessionfold.core.window import Trigger

from .batch_folds import BatchMismatch, BatchOffer, BatchTicket
from .fold_procedure import (
    BATCH_PENDING,
    Collected,
    FoldJob,
    FoldReport,
    OutOfTime,
    cancel_quietly,
    charged,
    claim_report,
    visit,
)
from .providers.batch_api import BatchPoll
from .summarizer_guard import SummarizerGuard

if TYPE_CHECKING:
    from sessionfold.store import SessionStore
    from sessionfold.store.results import BatchMark

__all__ = ["collect_batch"]

log = logging.getLogger(__name__)


def collect_batch(store: SessionStore, summarizer: Summarizer | SummarizerGuard | None,
                  offer: BatchOffer | None, ticket: BatchTicket, *,
                  pricing: FoldPricing | None = None, lease_s: float = 300.0,
                  out_of_time: OutOfTime = ()) -> FoldReport:
    """One look at ``ticket``'s batch, and the fold landed when it can be (module doc).

    ``offer``: the batch API of this worker's summarizer (None, or another provider's than the
    ticket's: the batch cannot be read here, and the summarizer is called now instead).
    ``summarizer``, ``pricing`` and ``out_of_time`` as for :func:`~.fold_procedure.run_fold`;
    ``lease_s`` is the lease of a fold made now, should the batch fail. The report's
    ``batch_event`` says what became of the batch (None: it still runs, or an earlier look
    landed it). Raises what the store raises, and nothing of the provider's: a look that could
    not reach it is a ``batch-pending`` report saying so.
    """
    if offer is not None and offer.provider != ticket.provider:
        offer = None
    sid = ticket.session_id
    base = FoldReport(session_id=sid, job_id=ticket.job_id, trigger="threshold",
                      outcome="skipped", claim="none", incarnation=ticket.incarnation,
                      batch=ticket.to_json())
    try:
        info = store.get_session(sid)
    except SessionNotFoundError:
        return _drop(offer, ticket, base, "the session was deleted")
    mark = info.batch
    if info.incarnation != ticket.incarnation:
        return _drop(offer, ticket, base, "the session was deleted; its id names a new one")
    if mark is None or mark.batch_id != ticket.batch_id or mark.job_id != ticket.job_id:
        return _over(store, offer, ticket, base)
    job = FoldJob(session_id=sid, job_id=mark.job_id, trigger=_trigger(mark),
                  lease_s=lease_s, incarnation=ticket.incarnation)
    base = replace(base, trigger=job.trigger)
    late = _why_not_wait(info.current_tokens, info.policy.trigger_tokens,
                         past_deadline=store.now() >= mark.deadline)
    try:
        polled = (offer.api.poll(mark.batch_id, mark.custom_id) if offer is not None
                  else BatchPoll("failed", detail=f"this worker has no batch API of "
                                                  f"{ticket.provider}"))
    except SummarizerError as exc:
        if late is None:
            return replace(base, outcome=BATCH_PENDING,
                           detail=f"could not look at the batch ({exc}); looking again later")
        polled = BatchPoll("failed", detail=str(exc))
    if polled.state == "pending":
        if late is None:
            return replace(base, outcome=BATCH_PENDING, detail=polled.detail or "still running")
        _cancel(offer, ticket)
        return _fall_back(store, summarizer, job, mark, late, pricing, out_of_time)
    if polled.state == "ended" and isinstance(polled.answer, Summary):
        return _land_answer(store, summarizer, job, mark, polled.answer, pricing, out_of_time)
    why = (f"the batched request failed: {polled.answer}" if polled.answer is not None
           else f"the batch is {polled.state}" + (f" ({polled.detail})" if polled.detail
                                                  else ""))
    return _fall_back(store, summarizer, job, mark, why, pricing, out_of_time)


def _trigger(mark: BatchMark) -> Trigger:
    return "idle" if mark.trigger == "idle" else "threshold"


def _why_not_wait(current_tokens: int, trigger_tokens: int, *,
                  past_deadline: bool) -> str | None:
    """Why a fold may wait for its batch no longer (None: it may)."""
    if past_deadline:
        return "the fold waited for its batch until its deadline"
    if current_tokens > trigger_tokens:
        # The session woke and kept growing: a fold landing later would leave its requests
        # over the policy's trigger, on the way to the pre-send guard's shrinks.
        return (f"the session grew to {current_tokens} tokens, past its trigger of "
                f"{trigger_tokens}, while its fold waited")
    return None


def _cancel(offer: BatchOffer | None, ticket: BatchTicket) -> None:
    if offer is None:
        log.warning("batch %s of %s (%s) cannot be cancelled from here: no batch API of that "
                    "provider", ticket.batch_id, ticket.session_id, ticket.provider)
        return
    cancel_quietly(offer, ticket)


def _drop(offer: BatchOffer | None, ticket: BatchTicket, base: FoldReport,
          why: str) -> FoldReport:
    """Nothing waits for ``ticket``'s answer: cancel its batch."""
    _cancel(offer, ticket)
    log.info("batch %s of %s dropped: %s", ticket.batch_id, ticket.session_id, why)
    return replace(base, detail=why, batch_event="dropped")


def _over(store: SessionStore, offer: BatchOffer | None, ticket: BatchTicket,
          base: FoldReport) -> FoldReport:
    """The session waits on no batch of this ticket's: an earlier look landed the fold (left
    alone), or its claim moved on (the batch is dropped)."""
    # The claim's epoch is not in the ticket: ask with one that cannot be held, for the answer
    # that tells a committed fold from a claim that moved on.
    context = store.resume_batch(ticket.session_id, ticket.job_id, epoch=-1,
                                 incarnation=ticket.incarnation)
    if context.claim.status == "already-committed":
        return replace(base, claim=context.claim.status, detail=context.claim.detail)
    return _drop(offer, ticket, base, "the fold no longer waits on this batch (its claim "
                                      "moved on)")


def _land_answer(store: SessionStore, summarizer: Summarizer | SummarizerGuard | None,
                 job: FoldJob, mark: BatchMark, answer: Summary,
                 pricing: FoldPricing | None, out_of_time: OutOfTime) -> FoldReport:
    context = store.resume_batch(job.session_id, job.job_id, epoch=mark.epoch,
                                 incarnation=_incarnation(job))
    if not context.claim.claimed:
        return replace(claim_report(job, context.claim), batch=_ticket_json(job, mark))
    try:
        report = visit(store, summarizer, job, context, pricing=pricing,
                       out_of_time=out_of_time,
                       collected=Collected(mark.plan, mark.custom_id, answer))
    except BatchMismatch:
        # Cannot happen while the plan's inputs are kept whole; if they moved, the answer is
        # no longer the one the visit asks for, and the summarizer is called now instead.
        return _fall_back(store, summarizer, job, mark,
                          "the visit made again asked another summary than its batch's",
                          pricing, out_of_time)
    return charged(summarizer, replace(report, batch=_ticket_json(job, mark),
                                       batch_event="collected"))


def _fall_back(store: SessionStore, summarizer: Summarizer | SummarizerGuard | None,
               job: FoldJob, mark: BatchMark, why: str,
               pricing: FoldPricing | None, out_of_time: OutOfTime) -> FoldReport:
    """Make the visit now, with the live summarizer, under the claim the fold held."""
    log.info("batch fold of %s falls back to a summarizer call now: %s", job.session_id, why)
    context = store.resume_batch(job.session_id, job.job_id, epoch=mark.epoch,
                                 incarnation=_incarnation(job))
    ticket = _ticket_json(job, mark)
    if not context.claim.claimed:
        return replace(claim_report(job, context.claim), batch=ticket)
    report = visit(store, summarizer, job, context, pricing=pricing, out_of_time=out_of_time)
    detail = "; ".join(x for x in (f"batch: {why}", report.detail) if x)
    return charged(summarizer, replace(report, batch=ticket, batch_event="fallen-back",
                                       detail=detail))


def _incarnation(job: FoldJob) -> int:
    assert job.incarnation is not None  # a collection's job always names it
    return job.incarnation


def _ticket_json(job: FoldJob, mark: BatchMark) -> dict[str, Any]:
    return BatchTicket(session_id=job.session_id, incarnation=_incarnation(job),
                       job_id=mark.job_id, provider=mark.provider,
                       batch_id=mark.batch_id).to_json()
