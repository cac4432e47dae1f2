"""The Celery task ``sessionfold.collect_batch``: one look at a batch fold's batch.

::

    collect_batch(ticket, lock_token=None)

The scheduler's sweep enqueues it for each pending batch whose look is due (every
``batch_poll_interval_s``; at once for a session that grew past its trigger while it waited).
It runs :func:`~sessionfold.runtime.batch_collect.collect_batch` with this worker's guarded
summarizer, the provider's batch API and the settings' pricing, then:

- counts the visit it landed (``folds_total`` and the rest, as a fold job's) and what became of
  the batch (``batch_folds_total{event}``);
- forgets the ticket (:mod:`.pending_batches`) once the batch is over: landed, fallen back to a
  summarizer call, or dropped; a batch still running keeps its ticket for the next look;
- releases the session's fold lock with ``lock_token``.

It returns the report's JSON, so Flower lists every look with its session, the batch, and what
came of it. A failure (the store unreachable) raises, and the next sweep looks again: a look
changes nothing it cannot make again.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded  # type: ignore[import-untyped]
from sessionfold.core.errors import RedisUnavailableError
from sessionfold.runtime.batch_collect import collect_batch as collect
from sessionfold.runtime.batch_folds import BatchTicket
from sessionfold.runtime.fold_procedure import BATCH_PENDING
from sessionfold.runtime.metrics import metrics
from sessionfold.runtime.prices import summarizer_cost_usd

from .locks import FoldLock
from .pending_batches import PendingBatches
from .runtime import runtime_of

__all__ = ["COLLECT_TASK", "collect_batch", "register"]

log = logging.getLogger(__name__)

#: The task's name on the broker (what ``make_collect`` sends and Flower lists).
COLLECT_TASK = "sessionfold.collect_batch"


def register(app: Any) -> Any:
    """Register :func:`collect_batch` on ``app`` (done by ``make_celery``)."""
    return app.task(bind=True, name=COLLECT_TASK, acks_late=True, reject_on_worker_lost=True,
                    max_retries=0, track_started=False)(collect_batch)


def collect_batch(task: Any, ticket: dict[str, Any],
                  lock_token: str | None = None) -> dict[str, Any]:
    """One look at ``ticket``'s batch (the body of the Celery task; see the module doc)."""
    runtime = runtime_of(task.app)
    settings = runtime.settings
    pending = BatchTicket.from_json(ticket)
    meter = metrics()
    lock = FoldLock.from_settings(settings, runtime.redis)
    try:
        with meter.track_fold("threshold") as timer:
            report = collect(runtime.store, runtime.summarizer, runtime.batches, pending,
                             pricing=runtime.pricing, lease_s=settings.task_time_limit_s,
                             out_of_time=(SoftTimeLimitExceeded,))
            if report.record is not None:
                timer.done(report.record, cost_usd=summarizer_cost_usd(
                    report.summarizer_usage, runtime.spend.prices))
        if report.batch_event is not None:
            meter.record_batch(report.batch_event)
        if report.outcome != BATCH_PENDING:
            _forget(runtime.redis, runtime.keys, pending)
    finally:
        lock.release_quietly(pending.session_id, lock_token)
    log.info("batch %s of %s: %s (%s)", pending.batch_id, pending.session_id,
             report.batch_event or report.outcome, report.detail)
    return report.to_json()


def _forget(client: Any, keys: Any, ticket: BatchTicket) -> None:
    try:
        PendingBatches(client, keys).remove(ticket)
    except RedisUnavailableError as exc:  # the next look finds it over and forgets it then
        log.warning("could not forget batch %s of %s: %s", ticket.batch_id, ticket.session_id,
                    exc)

