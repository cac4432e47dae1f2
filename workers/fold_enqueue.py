"""The scheduler's enqueue step: the fold lock, a fresh read, :func:`skip_reason`, one job.

For a session that may be past its trigger (its report, a nudge, the sweep), the scheduler
takes the session's fold lock (:class:`~.locks.FoldLock`: while a job is pending this costs one
``SET NX``, not a store read), re-reads the session from the store and enqueues one job if it
still needs one (:func:`skip_reason`). The cached gate only picks the sessions to look at;
the decision is made on the fresh read.

``enqueue(session_id, enqueued_epoch, trigger, lock_token) -> job_id`` (:class:`Enqueue`) is
supplied by the caller (the Celery app's; tests pass a recording fake). The job must release
the fold lock with ``lock_token`` when it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from sessionfold.core.errors import SessionNotFoundError
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.usage import UsageEvent
from sessionfold.store.results import NO_FOLD_OUTCOMES, SessionGate, SessionInfo, skip_reason

from .batch_stats import BatchStats
from .locks import FoldLock
from .session_cache import SessionCache

__all__ = ["NO_FOLD_OUTCOMES", "Enqueue", "FoldEnqueue", "skip_reason"]

#: The scheduler's logger, whichever of its modules logs.
log = logging.getLogger("sessionfold.workers.scheduler")

class Enqueue(Protocol):
    """Puts one fold job on the queue and returns its job id.

    ``enqueued_epoch`` is the session's ``fold_epoch`` when the scheduler decided (the job's
    claim stops if a newer claim exists); ``trigger`` is ``"threshold"`` (past the trigger) or
    ``"idle"`` (idle past its cache's lifetime); the job releases the session's fold lock with
    ``lock_token`` when it ends.
    """

    def __call__(self, session_id: str, enqueued_epoch: int | None, trigger: str,
                 lock_token: str | None) -> str: ...


class FoldEnqueue(SessionCache):
    """The enqueue step (a mixin of :class:`~.scheduler.Scheduler`, which sets up what it
    reads)."""

    lock: FoldLock
    _enqueue: Enqueue
    _metrics: Metrics
    _clock: Callable[[], float]

    def _may_be_over(self, info: SessionGate | SessionInfo, ev: UsageEvent) -> bool:
        # Cheap filter on cached data; the decision itself is made on a fresh read.
        gate = info if isinstance(info, SessionGate) else info.gate
        return gate.past_trigger() or gate.past_trigger(ev.prompt_tokens)

    def _try_enqueue(self, sid: str, source: str, stats: BatchStats, *,
                     event: UsageEvent | None = None, fresh: SessionInfo | None = None,
                     trigger: str = "threshold") -> bool:
        """Lock, re-check, enqueue a ``trigger`` job. False only when the enqueue itself
        failed."""
        # The lock first: while a job is pending this costs one SET NX, not a store read.
        token = self.lock.acquire(sid)
        if token is None:
            stats.skipped[sid] = "job-pending"
            return True
        try:
            info = fresh or self.store.get_session(sid)
        except SessionNotFoundError:
            self.lock.release(sid, token)
            self._forget(sid, gone=True)
            stats.skipped[sid] = "unknown-session"
            return True
        except BaseException:
            self.lock.release(sid, token)
            raise
        self._remember(info)
        reason = skip_reason(info, self._verdict_policy(info), trigger)
        if reason is not None:
            self.lock.release(sid, token)
            stats.skipped[sid] = reason
            return True
        try:
            job_id = self._enqueue(sid, info.fold_epoch, trigger, token)
        except Exception:
            log.exception("could not enqueue a fold job for session %r", sid)
            self.lock.release(sid, token)
            stats.skipped[sid] = "enqueue-failed"
            return False
        stats.enqueued[sid] = job_id
        self._metrics.count_enqueued(source)
        if event is not None:
            self._metrics.observe_scheduler_lag(self._clock() - event.time)
        log.debug("enqueued fold job %s for session %r (%s)", job_id, sid, source)
        return True

    def _verdict_policy(self, info: SessionInfo) -> FoldPolicy | None:
        """The policy the session had when its current no-fold verdict was first seen."""
        if info.last_visit_outcome not in NO_FOLD_OUTCOMES:
            self._verdicts.pop(info.id, None)
            return None
        seen = self._verdicts.get(info.id)
        if seen is None or seen[0] != info.last_visit_at:
            self._verdicts[info.id] = (info.last_visit_at, info.policy)
            return info.policy
        return seen[1]
