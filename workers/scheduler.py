"""The scheduler: reads the usage bus, keeps each session's measured size, enqueues fold jobs.

    scheduler = Scheduler(settings, store, client, enqueue)
    scheduler.run_forever(stop)             # until stop is set (SIGTERM: install_signal_handlers)
    stats = scheduler.run_once()            # one batch (tests, benchmarks)

What it reads and when a session is due is described once, in docs/architecture.md ("Deciding
to fold"). This module is the loop and the partition leases; each step of a batch is a module of
its own, mixed into :class:`Scheduler`:

- :mod:`.usage_intake`: the entries read from the usage streams (:mod:`.usage_consumer`): each
  session's newest report, compare-and-set in Redis (:mod:`.measured_sizes`) and written to the
  store, or deferred; inline folds' counts; nudges. What the scheduler keeps of each session
  between batches is :mod:`.session_cache`.
- :mod:`.fold_enqueue`: the enqueue step (the fold lock, a fresh read, :func:`skip_reason`, one
  job through ``enqueue``).
- :mod:`.sweep`, every ``scheduler_sweep_interval_s``: the sessions the store finds past their
  trigger, idle sessions (:mod:`.idle_sweep`), batch folds (:mod:`.batch_sweep`), the store's
  retention rules.
- :mod:`.batch_stats`: what one batch did (:class:`BatchStats`).

Several schedulers share the work by partition (:mod:`.partitions`): sessions are split into
``Settings.partitions`` partitions by a hash of their id, each with its own usage stream, and
each scheduler reads, measures and sweeps only the partitions whose lease it holds. Before a
batch, every third of ``scheduler_lease_ms``, it renews its leases and takes the partitions the
rendezvous assignment gives it; partitions it must hand over (a scheduler joined) are written
out first (:meth:`Scheduler.flush`) and then released, and a dead scheduler's partitions pass
to the others when its leases expire, its unacknowledged entries taken over with ``XAUTOCLAIM``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics, metrics
from sessionfold.runtime.redis_conn import RedisClient, is_cluster
from sessionfold.runtime.settings import Settings
from sessionfold.store.store import SessionStore

from .batch_stats import BatchStats
from .batch_sweep import Collect
from .fold_enqueue import Enqueue, skip_reason
from .locks import FoldLock
from .measured_sizes import MEASURED_CAS
from .partitions import PartitionLeases
from .pending_batches import PendingBatches
from .sweep import PRUNING_PARTITION, Sweep
from .usage_consumer import UsageConsumer
from .usage_intake import UsageIntake

__all__ = ["PRUNING_PARTITION", "BatchStats", "Collect", "Enqueue", "Scheduler",
           "install_signal_handlers", "skip_reason"]

log = logging.getLogger(__name__)


class Scheduler(UsageIntake, Sweep):
    """Turns usage events into fold jobs. One instance per process; not thread-safe."""

    def __init__(self, settings: Settings, store: SessionStore, client: RedisClient,
                 enqueue: Enqueue, *, consumer_name: str | None = None,
                 metrics_: Metrics | None = None, clock: Callable[[], float] = time.time,
                 collect: Collect | None = None) -> None:
        self.settings = settings
        self.store = store
        self.keys = Keys.from_settings(settings)
        self._collect = collect
        self.pending_batches = PendingBatches(client, self.keys)
        self._metrics = metrics_ or metrics()
        # Agents' inline folds arrive on the same stream; the group hands each to one scheduler.
        # No partition is read before its lease is held (the first batch takes them).
        self.consumer = UsageConsumer.from_settings(settings, client, consumer_name,
                                                    on_fold=self._count_inline_fold,
                                                    on_nudge=self._nudged,
                                                    partitions=())
        self.leases = PartitionLeases(client, self.keys, member=self.consumer.name,
                                      ttl_ms=settings.scheduler_lease_ms)
        self.lock = FoldLock.from_settings(settings, client)
        self._cluster = is_cluster(client)
        self._client = client
        self._enqueue = enqueue
        self._clock = clock
        self._cas = client.register_script(MEASURED_CAS)
        self._measured_ttl_ms = int(settings.measured_ttl_s * 1000)
        self._cache_s = settings.scheduler_policy_cache_s
        self._infos = {}
        self._gates = {}
        self._verdicts = {}
        self._next_sweep = 0.0
        self._next_prune = 0.0
        self._prune_resume = None
        self._prune_unfinished = False
        self._flush_s = settings.scheduler_store_flush_ms / 1000
        self._unwritten = {}
        self._unwritten_since = None
        self._refresh_s = settings.scheduler_store_refresh_s
        self._written_at = {}
        self._nudges = {}

    # --- the loop ----------------------------------------------------------------------------
    def run_forever(self, stop: threading.Event) -> None:
        """Run batches until ``stop`` is set; survives Redis and store outages with backoff."""
        backoff = 0.0
        log.info("scheduler %s reading the usage streams of %d partitions",
                 self.consumer.name, self.keys.partitions)
        while not stop.is_set():
            try:
                self.run_once(stop)
                backoff = 0.0
            except Exception:  # a scheduler must outlive any one bad batch or outage
                backoff = min(max(backoff * 2, 0.1), 10.0)
                log.exception("scheduler batch failed; retrying in %.1fs", backoff)
                stop.wait(backoff)
        try:
            self.flush()
            # Handing the partitions over at once: the others need not wait out the leases.
            self.leases.leave()
        except Exception:  # the entries stay pending; another scheduler takes them over
            log.exception("could not write the last measured sizes before stopping")
        log.info("scheduler %s stopped", self.consumer.name)

    def run_once(self, stop: threading.Event | None = None) -> BatchStats:
        """One batch: sweep if due, read, measure, record, enqueue, acknowledge."""
        stats = BatchStats()
        if self.leases.due():
            stats.partitions = self.rebalance()
        if time.monotonic() >= self._next_sweep:
            self.sweep(stats)
        resets = self.consumer.resets
        entries = self.consumer.read(stop)
        if self.consumer.resets != resets:
            self.leases.refresh_soon()  # the leases went with what Redis lost: take them again
        if entries:
            self.handle(entries, stats)
        elif self._unwritten:
            self.flush(stats)  # caught up: nothing more will coalesce with what waits
        self._act_on_nudges(stats)
        return stats

    def rebalance(self) -> frozenset[int]:
        """Renew leases, take the partitions assigned here, hand over the others. Returns the
        partitions owned now.

        A partition handed over is written out first (its measured sizes stored, its entries
        acknowledged), so its next owner starts from the store and finds nothing pending of
        ours but failed enqueues, which it takes over with ``XAUTOCLAIM``.
        """
        change = self.leases.refresh()
        surplus = self.leases.surplus(change.members)
        if change.lost or surplus:
            self.flush()
            self.leases.release(surplus)
        if change.gained or change.lost or surplus:
            log.info("scheduler %s owns %d of %d partitions (%d schedulers)",
                     self.consumer.name, len(self.leases.owned), self.keys.partitions,
                     len(change.members))
        self.consumer.assign(self.leases.owned)
        return self.leases.owned


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop``: the loop finishes its batch and returns (main thread)."""
    def _handler(signum: int, frame: FrameType | None) -> None:
        log.info("received signal %d; stopping after this batch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)
