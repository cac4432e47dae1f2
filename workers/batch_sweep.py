"""The batch sweep: a look at each batch fold's batch that is due.

A batch fold waits on a provider's batch API (:mod:`sessionfold.runtime.batch_folds`): such a
session is never planned again while it waits (:func:`~.fold_enqueue.skip_reason`:
``batch-pending``). Each waiting fold's ticket is in its partition's pending set
(:mod:`.pending_batches`; the sweep puts back the ticket of every batch mark the store holds, so
the set survives Redis losing it); for each ticket due, under the session's fold lock, the sweep
enqueues a look at the batch (:class:`Collect`, the Celery app's ``make_collect``) and pushes
the next one ``batch_poll_interval_s`` on. A session that grew past its policy's trigger while
its fold waited is looked at at once (its fold stops waiting). It sets ``batch_folds_pending``
to the waiting folds it saw.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from sessionfold.runtime.batch_folds import BatchTicket
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.settings import Settings
from sessionfold.store.store import SessionStore

from .batch_stats import BatchStats
from .idle_sweep import IDLE_SWEEP_LIMIT
from .locks import FoldLock
from .pending_batches import PendingBatches

__all__ = ["BatchSweep", "Collect"]

#: The scheduler's logger, whichever of its modules logs.
log = logging.getLogger("sessionfold.workers.scheduler")


class Collect(Protocol):
    """Puts one look at a batch fold's batch on the queue (the ticket's JSON,
    :class:`~sessionfold.runtime.batch_folds.BatchTicket`) and returns its job id; the job
    releases the session's fold lock with ``lock_token`` when it ends."""

    def __call__(self, ticket: dict[str, Any], lock_token: str | None) -> str: ...


class BatchSweep:
    """The sweep's look at batch folds (a mixin of :class:`~.scheduler.Scheduler`, which sets
    up what it reads)."""

    settings: Settings
    store: SessionStore
    keys: Keys
    lock: FoldLock
    pending_batches: PendingBatches
    #: Enqueues looks at batch folds' batches (None: the sweep looks at none).
    _collect: Collect | None
    _metrics: Metrics
    _clock: Callable[[], float]

    def _sweep_batches(self, owned: frozenset[int], stats: BatchStats) -> None:
        """Enqueue a look at each batch fold's batch that is due (see the module doc)."""
        if self._collect is None:
            return
        now = self._clock()
        poll_s = self.settings.batch_poll_interval_s
        waiting = 0
        # The session rows are the truth: every mark's ticket goes (back) into the pending set,
        # due at once when its session outgrew its trigger while it waited.
        for info in self.store.pending_batches(limit=IDLE_SWEEP_LIMIT):
            if self.keys.partition_of(info.id) not in owned or info.batch is None:
                continue
            waiting += 1
            urgent = info.current_tokens > info.policy.trigger_tokens
            ticket = BatchTicket(info.id, info.incarnation, info.batch.job_id,
                                 info.batch.provider, info.batch.batch_id)
            self.pending_batches.add(ticket, now if urgent else now + poll_s, sooner=urgent)
        self._metrics.set_batches_pending(waiting)
        for partition in sorted(owned):
            for ticket in self.pending_batches.due(partition, now, IDLE_SWEEP_LIMIT):
                self._try_collect(ticket, now + poll_s, stats)

    def _try_collect(self, ticket: BatchTicket, next_look: float, stats: BatchStats) -> None:
        """Enqueue one look at ``ticket``'s batch under the session's fold lock."""
        assert self._collect is not None
        sid = ticket.session_id
        token = self.lock.acquire(sid)
        if token is None:
            stats.skipped[sid] = "job-pending"  # looked at again at the next sweep
            return
        try:
            job_id = self._collect(ticket.to_json(), token)
        except Exception:
            log.exception("could not enqueue a look at batch %s of %r", ticket.batch_id, sid)
            self.lock.release(sid, token)
            return
        self.pending_batches.push_back(ticket, next_look)
        stats.collecting[sid] = job_id
