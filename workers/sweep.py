"""The scheduler's sweep, every ``scheduler_sweep_interval_s``, over the partitions it owns.

It asks the store for the sessions past their trigger (``over_trigger``): Redis keeps nothing
on disk, and events dropped by a publisher during an outage or lost in a restart must not leave
a session unfolded. It counts paused sessions past their budget (``paused_over_budget``) for
the metric of that name. Then it looks at idle sessions (:mod:`.idle_sweep`) and at batch folds
(:mod:`.batch_sweep`), drops dead schedulers' consumers, trims the scheduler's caches
(:mod:`.session_cache`) and applies the store's retention rules when due.

The retention rules (:meth:`SessionStore.prune <sessionfold.store.store.SessionStore.prune>`,
``Settings.retention_rules()``) are applied at most every ``prune_interval_s``, on one
scheduler only: the one holding partition 0's lease (while that lease changes hands two may
prune at once, which is harmless: a prune deletes by key what its rules select). Each sweep's
prune takes at most ``prune_sweep_batches`` short transactions and carries on at the next sweep
until it has finished, so it never holds up the usage events for long. ``prune_interval_s = 0``
leaves retention to ``sessionfold prune`` run on a schedule.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from sessionfold.core.errors import SessionfoldError
from sessionfold.store.results import PruneReport

from .batch_stats import BatchStats
from .batch_sweep import BatchSweep
from .idle_sweep import IdleSweep
from .partitions import PartitionLeases
from .usage_consumer import UsageConsumer

__all__ = ["PRUNING_PARTITION", "Sweep"]

#: The scheduler's logger, whichever of its modules logs.
log = logging.getLogger("sessionfold.workers.scheduler")

#: The partition whose owner applies the store's retention rules (one scheduler at a time).
PRUNING_PARTITION = 0


class Sweep(IdleSweep, BatchSweep):
    """The sweep (a mixin of :class:`~.scheduler.Scheduler`, which sets up what it reads and
    decides when it is due)."""

    consumer: UsageConsumer
    leases: PartitionLeases
    #: When (monotonic) the next sweep is due.
    _next_sweep: float
    #: When (monotonic) the next prune is due, once the last one finished.
    _next_prune: float
    #: Where an unfinished prune carries on (see _prune); None: it starts over.
    _prune_resume: str | None
    _prune_unfinished: bool

    if TYPE_CHECKING:
        def rebalance(self) -> frozenset[int]: ...

    def sweep(self, stats: BatchStats | None = None) -> int:
        """Enqueue over-budget sessions the store knows of (events lost by Redis). Returns the
        number of jobs enqueued."""
        stats = stats or BatchStats()
        if self.leases.due():
            stats.partitions = self.rebalance()  # sweep only what this scheduler owns now
        self._next_sweep = time.monotonic() + self.settings.scheduler_sweep_interval_s
        stats.swept = True
        before = len(stats.enqueued)
        past_budget = 0
        owned = self.leases.owned
        for info in self.store.over_trigger(limit=1000):
            if self.keys.partition_of(info.id) not in owned:
                continue  # another scheduler's partition: its owner sweeps it
            self._remember(info)
            past_budget += info.policy.over_budget(info.current_tokens)
            self._try_enqueue(info.id, "sweep", stats, fresh=info)
        # Paused sessions are left out above (nothing folds them) and counted apart: each one
        # past its budget sends its whole, growing window on every call.
        paused = sum(self.keys.partition_of(info.id) in owned
                     for info in self.store.paused_over_budget(limit=10_000))
        self._metrics.set_sessions_over_budget(past_budget, paused=paused)
        self._sweep_idle(owned, stats)
        self._sweep_batches(owned, stats)
        try:
            self.consumer.prune_consumers(idle_ms=self.settings.scheduler_claim_idle_ms * 10)
        except SessionfoldError as exc:
            log.warning("could not prune dead scheduler consumers: %s", exc)
        self._prune_caches()
        stats.pruned = self._prune(owned)
        return len(stats.enqueued) - before

    def _prune(self, owned: frozenset[int]) -> PruneReport | None:
        """Apply the retention rules if due here (see the module doc); what was deleted."""
        if self.settings.prune_interval_s <= 0 or PRUNING_PARTITION not in owned:
            return None
        if not self._prune_unfinished and time.monotonic() < self._next_prune:
            return None
        try:
            report = self.store.prune(self.settings.retention_rules(),
                                      batch=self.settings.prune_batch,
                                      max_batches=self.settings.prune_sweep_batches,
                                      resume=self._prune_resume)
        except SessionfoldError as exc:  # the store is down: the next sweep tries again
            log.warning("could not prune the store: %s", exc)
            return None
        self._prune_unfinished = not report.complete
        self._prune_resume = report.resume
        if report.complete:
            self._next_prune = time.monotonic() + self.settings.prune_interval_s
        if report.total:
            log.info("pruned %d append keys, %d visit records, %d dead letters%s",
                     report.append_keys, report.visit_records, report.dead_letters,
                     "" if report.complete else " (carrying on at the next sweep)")
        return report
