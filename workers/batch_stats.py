"""What one batch of the scheduler did: :class:`BatchStats`, filled in by each of its steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from sessionfold.store.results import PruneReport

__all__ = ["BatchStats"]


@dataclass
class BatchStats:
    """What one :meth:`Scheduler.run_once <.scheduler.Scheduler.run_once>` did."""

    events: int = 0
    #: Sessions whose newest event in the batch was taken: compare-and-set (not older than
    #: their measured size) or deferred.
    accepted: int = 0
    #: Events older than another for their session (in the batch or in Redis).
    superseded: int = 0
    #: Sessions the store does not know (deleted, or never created).
    unknown: int = 0
    #: Measured sizes written to the store.
    written: int = 0
    #: Reports of sessions under their trigger neither compare-and-set nor written to the
    #: store, because this scheduler wrote the session's size less than
    #: ``scheduler_store_refresh_s`` ago (see :mod:`.usage_intake`).
    deferred: int = 0
    #: Job ids enqueued, by session.
    enqueued: dict[str, str] = field(default_factory=dict)
    #: Sessions over their trigger that were not enqueued, with the reason.
    skipped: dict[str, str] = field(default_factory=dict)
    #: Sessions nudged in this batch (each looked at once, however many nudges it had).
    nudged: int = 0
    swept: bool = False
    #: What the sweep's prune deleted, when it ran one.
    pruned: PruneReport | None = None
    #: The partitions this scheduler owned after the batch's lease refresh (None: no refresh).
    partitions: frozenset[int] | None = None
    #: Looks at batch folds' batches enqueued by the sweep, by session (job ids).
    collecting: dict[str, str] = field(default_factory=dict)
