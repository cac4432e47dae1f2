"""The scheduler: reads the usage bus, keeps each session's measured size, enqueues fold jobs.

    scheduler = Scheduler(settings, store, client, enqueue)
    scheduler.run_forever(stop)             # until stop is set (SIGTERM: install_signal_handlers)
    stats = scheduler.run_once()            # one batch (tests, benchmarks)

Several schedulers share the work by partition (:mod:`.partitions`): sessions are split into
``Settings.partitions`` partitions by a hash of their id, each with its own usage stream, and
each scheduler reads, measures and sweeps only the partitions whose lease it holds. Before a
batch, every third of ``scheduler_lease_ms``, it renews its leases and takes the partitions the
rendezvous assignment gives it; partitions it must hand over (a scheduler joined) are written
out first (:meth:`Scheduler.flush`) and then released, and a dead scheduler's partitions pass
to the others when its leases expire, its unacknowledged entries taken over with ``XAUTOCLAIM``.

One batch, top to bottom (:meth:`Scheduler.run_once`):

1. Read up to ``scheduler_batch_size`` usage events from the stream's consumer group (entries a
   dead scheduler left pending are reclaimed first; see :mod:`.usage_consumer`).
2. Keep the newest event per session, by ``(revision, seq)``
   (:func:`~sessionfold.core.tokens.supersedes`), and check it against the session's *gate*
   (:class:`~sessionfold.store.results.SessionGate`: paused, trigger, size, incarnation; read
   from the store in one query for a batch's sessions, see :meth:`Scheduler._gates_for`).
   A report **deferred** (step 3) stops here: it only moves the session's last call time
   forward (``ZADD GT``, one command per partition). Every other report is compare-and-set
   into the session's ``measured`` hash in Redis with a Lua script that mirrors that rule: an
   event older than the one stored never overwrites it, however schedulers interleave (two may
   briefly read one partition while its lease changes hands). One script call per partition:
   on Redis Cluster a partition's keys share one hash slot, and a script may not touch keys of
   two slots.
3. Write the accepted values to the store in one call (``record_usage_batch``); the store keeps
   its own copy monotonic too, and refuses reports built on a window a fold has replaced. A
   report of a session under its trigger whose size this scheduler wrote less than
   ``scheduler_store_refresh_s`` ago (300 s by default), and not older than that write, is
   deferred: its entry is acknowledged and its value goes nowhere, and the store's copy,
   anchored at most that long ago, is carried forward by the append path's estimate of what
   was appended since (an append that takes the session past its trigger nudges, see below).
   This is what lets one scheduler keep up with a fleet: standing agents report every few
   seconds each, almost always under their trigger, and a store row write (or a Redis script
   call) per report would be the scheduler's whole cost. A report past the trigger is always
   written before the decision (step 4 reads the store), and so is a session's first report
   after a scheduler starts or takes its partition over. ``scheduler_store_refresh_s = 0``
   writes every report.

   The store write hands back each written session's gate as it left the row
   (``apply_usage_batch``), and the decision of step 4 and the next reports are checked
   against that: a session reporting steadily is read by its writes alone, with no query of
   its own. So a gate is renewed whenever the session's size is next due in the store (or read
   again after ``scheduler_policy_cache_s`` for a session not written by this scheduler), and
   is never much older than ``scheduler_store_refresh_s``. A report older than the one written
   (the first report of a session deleted and created again under the same id looks like that)
   has its gate read again at once. Changes made through sessionfold (a policy changed by the
   client, a pause or resume through the service) nudge the scheduler, which drops its gate;
   a change made around it (``sessionfold pause`` on the command line, a direct database
   update) is seen within ``scheduler_store_refresh_s``, or at the next sweep for a session
   the store finds past its trigger. The fold decision itself never uses the gate (step 4).
4. For each session whose report passes its trigger (by its gate): take the session's fold
   lock, re-read the session from the store and enqueue one job if it still needs one
   (:func:`skip_reason`).
5. Acknowledge the entries. A failure before this point leaves them pending: they are reclaimed
   and acted on again, which is harmless (steps 2–4 are idempotent).

The stream also carries agents' inline folds (:class:`~sessionfold.runtime.usage.FoldEvent`):
the scheduler that reads one counts it into its metrics (``folds_total{trigger="overflow"}``…)
and acknowledges it at once, so each is counted by exactly one scheduler.

It also carries nudges (:class:`~sessionfold.runtime.usage.NudgeEvent`): an agent's append
took a session past its trigger, or its policy or pause changed. After the batch's usage
events, the scheduler takes each nudged session once (nudges are deduplicated per batch)
through the same step 4 as a report past the trigger: the fold lock, one fresh read of the
session from the store, and a job if :func:`skip_reason` finds none needed. A nudge changes
nothing of the measured state (no compare-and-set, no store write): it only makes the
scheduler look now rather than at the next usage report or sweep, and drops the session's
gate, which the next report reads again.

When the scheduler is behind (a read comes back full) the store is the slow part: step 3 then
waits, up to ``scheduler_store_flush_ms``, for the next batches, so each session's newest value
is written once rather than once per batch. Sessions past their trigger are never held back
(steps 3–4 run for them at once), and an entry is acknowledged only when the value it carries,
or a newer one, is in the store. When caught up every batch is written as it is read.

Every ``scheduler_sweep_interval_s`` the scheduler also asks the store for over-budget sessions
(``over_trigger``) of the partitions it owns: Redis keeps nothing on disk, and events dropped by
a publisher during an outage or lost in a restart must not leave a session unfolded. The same
sweep counts paused sessions past their budget (``paused_over_budget``) for the metric of that name.

The sweep also folds sessions whose prompt cache has gone cold: the compare-and-set of step 2
also keeps each session's last call time (the usage event's ``time``) in its partition's
``last_calls`` sorted set, and the sweep takes the sessions idle longer than
``Settings.cache_cold_after_s`` (``cache_ttl``'s lifetime, 300 s by default) and enqueues an
``idle`` fold for each one past its policy's idle trigger (:meth:`FoldPolicy.over_idle_trigger
<sessionfold.core.policy.FoldPolicy.over_idle_trigger>`: ``economics="dollars"`` only). Its next
call rewrites the whole cache anyway, so a fold made now costs no cache break; the job prices it
with a cold cache and folds only if that pays (``would-not-pay`` otherwise). Each session leaves
the set when the sweep has looked at it, and comes back with its next call: one idle visit per
idle gap.

The sweep also looks after batch folds (a fold waiting on a provider's batch API,
:mod:`sessionfold.runtime.batch_folds`): such a session is never planned again while it waits
(:func:`skip_reason`: ``batch-pending``). Each waiting fold's ticket is in its partition's
pending set (:mod:`.pending_batches`; the sweep puts back the ticket of every batch mark the
store holds, so the set survives Redis losing it); for each ticket due, under the session's
fold lock, the sweep enqueues a look at the batch (``collect``, the Celery app's
``make_collect``) and pushes the next one ``batch_poll_interval_s`` on. A session that grew
past its policy's trigger while its fold waited is looked at at once (its fold stops waiting).
It sets ``batch_folds_pending`` to the waiting folds it saw.

The sweep also applies the store's retention rules (:meth:`SessionStore.prune
<sessionfold.store.store.SessionStore.prune>`, ``Settings.retention_rules()``) at most every
``prune_interval_s``, on one scheduler only: the one holding partition 0's lease (while that
lease changes hands two may prune at once, which is harmless: a prune deletes by key what its
rules select). Each sweep's prune takes at most ``prune_sweep_batches`` short transactions and
carries on at the next sweep until it has finished, so it never holds up the usage events for
long. ``prune_interval_s = 0`` leaves retention to ``sessionfold prune`` run on a schedule.

``enqueue(session_id, enqueued_epoch, trigger, lock_token) -> job_id`` is supplied by the
caller (the Celery app's; tests pass a recording fake). The job must release the fold lock with
``lock_token`` when it ends (:class:`~sessionfold.workers.locks.FoldLock`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any, Protocol

from sessionfold.core.errors import SessionfoldError, SessionNotFoundError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import supersedes
from sessionfold.runtime.batch_folds import BatchTicket
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics, metrics
from sessionfold.runtime.redis_conn import RedisClient, is_cluster, mapped_errors
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import FoldEvent, NudgeEvent, UsageEvent
from sessionfold.store.results import (
    PruneReport,
    SessionGate,
    SessionInfo,
    UsageReport,
    past_trigger,
)
from sessionfold.store.store import SessionStore

from .locks import FoldLock
from .partitions import PartitionLeases
from .pending_batches import PendingBatches
from .usage_consumer import StreamEntry, UsageConsumer

__all__ = ["BatchStats", "Collect", "Enqueue", "Scheduler", "install_signal_handlers",
           "skip_reason"]

log = logging.getLogger(__name__)

#: The partition whose owner applies the store's retention rules (one scheduler at a time).
PRUNING_PARTITION = 0

#: Idle sessions one sweep looks at per partition (the rest wait for the next sweep).
IDLE_SWEEP_LIMIT = 1000

#: Visit outcomes after which a session waits for its window to grow (or its policy to change).
NO_FOLD_OUTCOMES = frozenset({"nothing-to-fold", "refused"})

# Compare-and-set of the measured size of every session of a batch, in one call. KEYS: the
# sessions' hashes, then the partition's last_calls sorted set. ARGV: one "born revision seq
# tokens time session" string per hash (born: the session's creation time; tokens: the prompt
# size; time: when the call returned; the session id last, as it may hold spaces), then the ttl
# in ms. One string per hash because the client's cost is per argument. The last call's time is kept
# for every event not judged against a stale session ("0" included: an older report is still a
# call), never moved back (ZADD GT). Returns one character per hash:
#   "1"  stored: the event is not older (by revision, then seq) than what the hash holds, or the
#        hash belongs to an earlier session of the same id (deleted and created again: its
#        revisions start over). An equal position counts on purpose: an entry redelivered
#        because its store write failed must reach the store the second time.
#   "0"  older than what the hash holds: ignored.
#   "2"  judged with a creation time older than the hash's: the caller's copy of the session
#        is stale (re-read it); ignored.
# In Lua so each compare and its write are one step however many schedulers race; one call per
# batch because the client's cost is per command, not per key. The ordering is the mirror of
# sessionfold.core.tokens.supersedes (not older by (revision, seq): accepted); change both.
_MEASURED_CAS = """
local ttl = ARGV[#ARGV]
local n = #KEYS - 1
local calls = KEYS[#KEYS]
local out = {}
for i = 1, n do
  local key = KEYS[i]
  local sborn, srev, sseq, stok, stime, sid = string.match(ARGV[i],
    '^(%S+) (%d+) (%d+) (%d+) (%S+) (.+)$')
  local born, rev, seq = tonumber(sborn), tonumber(srev), tonumber(sseq)
  local cur = redis.call('HMGET', key, 'born', 'revision', 'seq')
  local verdict = '1'
  if cur[1] then
    local cborn, crev, cseq = tonumber(cur[1]), tonumber(cur[2]), tonumber(cur[3])
    if born < cborn then
      verdict = '2'
    elseif born == cborn and (rev < crev or (rev == crev and seq < cseq)) then
      verdict = '0'
    end
  end
  if verdict == '1' then
    redis.call('HSET', key, 'born', sborn, 'revision', srev, 'seq', sseq, 'tokens', stok)
    redis.call('PEXPIRE', key, ttl)
  end
  if verdict ~= '2' then
    redis.call('ZADD', calls, 'GT', stime, sid)
  end
  out[i] = verdict
end
redis.call('PEXPIRE', calls, ttl)
return table.concat(out)
"""


class Collect(Protocol):
    """Puts one look at a batch fold's batch on the queue (the ticket's JSON,
    :class:`~sessionfold.runtime.batch_folds.BatchTicket`) and returns its job id; the job
    releases the session's fold lock with ``lock_token`` when it ends."""

    def __call__(self, ticket: dict[str, Any], lock_token: str | None) -> str: ...


class Enqueue(Protocol):
    """Puts one fold job on the queue and returns its job id.

    ``enqueued_epoch`` is the session's ``fold_epoch`` when the scheduler decided (the job's
    claim stops if a newer claim exists); ``trigger`` is ``"threshold"`` (past the trigger) or
    ``"idle"`` (idle past its cache's lifetime); the job releases the session's fold lock with
    ``lock_token`` when it ends.
    """

    def __call__(self, session_id: str, enqueued_epoch: int | None, trigger: str,
                 lock_token: str | None) -> str: ...


@dataclass
class BatchStats:
    """What one :meth:`Scheduler.run_once` did."""

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
    #: ``scheduler_store_refresh_s`` ago (see the module doc).
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


def skip_reason(info: SessionInfo, verdict_policy: FoldPolicy | None = None,
                trigger: str = "threshold") -> str | None:
    """Why a session should not get a fold job now, or None if it should.

    ``verdict_policy`` is the policy the session had when its last no-fold visit was seen (a
    changed policy reopens the session); None when unknown. ``trigger="idle"``: the session is
    idle past its cache's lifetime, and is judged by its policy's idle trigger alone (its cold
    cache changes what pays, whatever the last visit decided; the sweep sends one per idle gap).
    """
    if info.paused:
        return "paused"
    if info.batch is not None:
        return "batch-pending"  # its fold waits on a batch API, under its claim
    if trigger == "idle":
        return None if info.policy.over_idle_trigger(info.current_tokens) else "under-idle-trigger"
    if not past_trigger(info.current_tokens, info.trigger_tokens):
        return "under-trigger"
    if info.last_visit_outcome in NO_FOLD_OUTCOMES:
        grown = info.last_visit_tokens is None or info.current_tokens > info.last_visit_tokens
        policy_changed = verdict_policy is not None and verdict_policy != info.policy
        if not grown and not policy_changed:
            return "no-growth-since-" + info.last_visit_outcome
    return None


class Scheduler:
    """Turns usage events into fold jobs. One instance per process; not thread-safe."""

    def __init__(self, settings: Settings, store: SessionStore, client: RedisClient,
                 enqueue: Enqueue, *, consumer_name: str | None = None,
                 metrics_: Metrics | None = None, clock: Callable[[], float] = time.time,
                 collect: Collect | None = None) -> None:
        self.settings = settings
        self.store = store
        self.keys = Keys.from_settings(settings)
        #: Enqueues looks at batch folds' batches (None: the sweep looks at none).
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
        self._cas = client.register_script(_MEASURED_CAS)
        self._measured_ttl_ms = int(settings.measured_ttl_s * 1000)
        self._cache_s = settings.scheduler_policy_cache_s
        #: session → (monotonic time read, info or None for unknown)
        self._infos: dict[str, tuple[float, SessionInfo | None]] = {}
        #: session → (monotonic time read, its gate or None for unknown): the usage path's
        #: cache, a few fields a session (the full info above serves the sweep)
        self._gates: dict[str, tuple[float, SessionGate | None]] = {}
        #: session → (last_visit_at, policy) of the last no-fold verdict seen
        self._verdicts: dict[str, tuple[datetime | None, FoldPolicy]] = {}
        self._next_sweep = 0.0
        self._next_prune = 0.0
        #: Where an unfinished prune carries on (see _prune); None: it starts over.
        self._prune_resume: str | None = None
        self._prune_unfinished = False
        self._flush_s = settings.scheduler_store_flush_ms / 1000
        #: session → the entry carrying its newest accepted value, not yet in the store
        self._unwritten: dict[str, StreamEntry] = {}
        self._unwritten_since: float | None = None
        self._refresh_s = settings.scheduler_store_refresh_s
        #: session → (its incarnation, when (monotonic) this scheduler last wrote its measured
        #: size to the store, the report's position): see _fresh_in_store
        self._written_at: dict[str, tuple[int, float, tuple[int, int]]] = {}
        #: session → its newest nudge read since the last batch (see _act_on_nudges)
        self._nudges: dict[str, NudgeEvent] = {}

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
        entries = self.consumer.read(stop)
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

    def handle(self, entries: Sequence[StreamEntry], stats: BatchStats | None = None
               ) -> BatchStats:
        """Act on a batch of entries and acknowledge them (see the module doc)."""
        stats = stats or BatchStats()
        now = time.monotonic()
        latest = _latest_per_session(entries)
        gates, fresh = self._gates_for(latest.values(), now)
        # A report of a session under its trigger, written lately by this scheduler and not
        # waiting to be written, is deferred: it only moves the session's last call time
        # (step 2 is for the reports that will reach the store).
        deferred: list[StreamEntry] = []
        known: list[tuple[StreamEntry, SessionGate]] = []
        over: set[str] = set()
        for sid, entry in latest.items():
            gate = gates[sid]
            if gate is None:
                continue
            if self._may_be_over(gate, entry.event):
                over.add(sid)
            elif sid in fresh and sid not in self._unwritten:
                deferred.append(entry)
                continue
            known.append((entry, gate))
        accepted = self._compare_and_set(known)
        self._note_calls(deferred)
        superseded = len(entries) - len(latest) + len(known) - len(accepted)
        unknown = len(latest) - len(known) - len(deferred)
        stats.events += len(entries)
        stats.accepted += len(accepted) + len(deferred)
        stats.superseded += superseded
        stats.unknown += unknown
        stats.deferred += len(deferred)
        self._metrics.count_usage_events("superseded", superseded)
        self._metrics.count_usage_events("unknown-session", unknown)
        self._metrics.count_usage_events("accepted", len(accepted))
        self._metrics.count_usage_events("deferred", len(deferred))

        # An accepted entry "carries" its session's value until the value is in the store;
        # every other entry (deferred, older, unknown session, or carrying a value now replaced
        # by a newer one) is done with and acknowledged now.
        carriers = {id(e) for e in accepted}
        done = [e for e in entries if id(e) not in carriers]
        urgent: list[str] = []
        for entry in accepted:
            sid = entry.event.session_id
            replaced = self._unwritten.get(sid)
            if replaced is not None and replaced.entry_id != entry.entry_id:
                done.append(replaced)  # (the same id: our own entry reclaimed, still carrying)
            self._unwritten[sid] = entry
            if sid in over:
                urgent.append(sid)
        if self._unwritten_since is None and self._unwritten:
            self._unwritten_since = now
        self.consumer.ack(done)

        if self._flush_due(backlog=len(entries) >= self.consumer.batch_size):
            self.flush(stats)
        elif urgent:
            self.flush(stats, only=urgent)  # over the trigger: written and decided at once
        return stats

    def flush(self, stats: BatchStats | None = None, *, only: Sequence[str] | None = None
              ) -> int:
        """Write unwritten measured sizes to the store, decide who gets a job, acknowledge.

        Returns the number of sessions written. If the store fails, the values stay unwritten
        (and their entries unacknowledged) for the next flush.
        """
        stats = stats or BatchStats()
        sids = list(self._unwritten) if only is None else [s for s in only
                                                            if s in self._unwritten]
        step = self.consumer.batch_size  # one short store transaction per batch-size chunk
        for start in range(0, len(sids), step):
            chunk = sids[start:start + step]
            batch = self.store.apply_usage_batch(
                [_report(self._unwritten[sid].event) for sid in chunk])
            written = [self._unwritten.pop(sid) for sid in chunk]
            stats.written += len(written)
            failed: set[str] = set()
            now = time.monotonic()
            # The write hands back each session's gate as it left the row: the decision below
            # and the next reports are checked against that, with no second read.
            for entry in written:
                sid = entry.event.session_id
                gate = batch.gates.get(sid)
                if gate is None:
                    self._forget(sid, gone=True)  # deleted since its gate was read
                    continue
                self._gates[sid] = (now, gate)
                if self._refresh_s > 0:
                    self._written_at[sid] = (gate.incarnation, now, entry.event.position)
                if self._may_be_over(gate, entry.event) and \
                        not self._try_enqueue(sid, "stream", stats, event=entry.event):
                    failed.add(sid)
            # A failed enqueue leaves its entry pending: it comes back through XAUTOCLAIM.
            self.consumer.ack([e for e in written if e.event.session_id not in failed])
        if not self._unwritten:
            self._unwritten_since = None
        return len(sids)

    def _fresh_in_store(self, gate: SessionGate, now: float,
                        position: tuple[int, int] | None = None) -> bool:
        """Did this scheduler write this session's measured size less than
        ``scheduler_store_refresh_s`` ago (this incarnation of it)? With ``position`` (a new
        report's), also: is that report not older than the one written (:meth:`_written`)?"""
        written = self._written(gate, position)
        return written is not None and now - written < self._refresh_s

    def _written(self, gate: SessionGate, position: tuple[int, int] | None = None
                 ) -> float | None:
        """When this scheduler last wrote this incarnation of the session's measured size (a
        monotonic time), or None if it has not; with ``position`` (a new report's), None too if
        the report is older than the one written.

        A report older than the written one is rare (reordered or redelivered), and it is what
        the first report of a session deleted and created again under the same id looks like
        (its revisions and seqs start over): such a report is not deferred, and the session's
        gate is read again (``_gates_for``), which tells the new incarnation apart.
        """
        held = self._written_at.get(gate.id)
        if held is None or held[0] != gate.incarnation or \
                (position is not None and position < held[2]):
            return None
        return held[1]

    def _flush_due(self, *, backlog: bool) -> bool:
        # Caught up (the read was not full): write now. Behind: let reports of sessions under
        # their trigger coalesce for up to scheduler_store_flush_ms, so that a store slower
        # than the stream writes each session's newest value once instead of every batch.
        if not backlog or not self._unwritten:
            return True
        if len(self._unwritten) >= 10 * self.consumer.batch_size:
            return True
        assert self._unwritten_since is not None
        return time.monotonic() - self._unwritten_since >= self._flush_s

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

    def _sweep_idle(self, owned: frozenset[int], stats: BatchStats) -> None:
        """Enqueue an ``idle`` fold for each session idle past its cache's lifetime and past
        its idle trigger (see the module doc)."""
        cutoff = self._clock() - self.settings.cache_cold_after_s
        for partition in sorted(owned):
            key = self.keys.last_calls(partition)
            with mapped_errors("reading the sessions' last calls"):
                raw = self._client.zrangebyscore(key, "-inf", cutoff, start=0,
                                                 num=IDLE_SWEEP_LIMIT)
            seen: list[str] = []
            for member in raw:
                sid = member.decode() if isinstance(member, bytes) else str(member)
                info = self._cached_info(sid)
                if info is None or skip_reason(info, trigger="idle") is not None:
                    seen.append(sid)  # gone, paused or small: its next call brings it back
                elif self._try_enqueue(sid, "idle", stats, trigger="idle"):
                    seen.append(sid)  # (a failed enqueue stays for the next sweep)
            if seen:
                with mapped_errors("forgetting the idle sessions seen"):
                    self._client.zrem(key, *seen)

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

    def _count_inline_fold(self, event: FoldEvent) -> None:
        self._metrics.count_visit(event.visit)

    def _nudged(self, event: NudgeEvent) -> None:
        # Kept until the batch is handled: several nudges of one session make one look.
        self._nudges[event.session_id] = event

    def _act_on_nudges(self, stats: BatchStats) -> None:
        """Take each nudged session once through the enqueue step (see the module doc)."""
        nudges, self._nudges = self._nudges, {}
        owned = self.leases.owned
        for sid in nudges:
            if self.keys.partition_of(sid) not in owned:
                continue  # read while the partition changed hands: its new owner sweeps it
            stats.nudged += 1
            # A nudge may follow a policy change, a pause or a resume: the usage path's gate
            # is read again at the session's next report, whatever happens below.
            self._gates.pop(sid, None)
            # No fresh= here: _try_enqueue takes the fold lock first and then reads the
            # session, so a nudge of a session whose job is pending costs no store read.
            self._try_enqueue(sid, "nudge", stats)

    # --- steps -------------------------------------------------------------------------------
    def _compare_and_set(self, known: Sequence[tuple[StreamEntry, SessionGate]]
                         ) -> list[StreamEntry]:
        if not known:
            return []
        # One script call per partition: a partition's keys share one Redis Cluster slot.
        groups: dict[int, list[tuple[StreamEntry, SessionGate]]] = {}
        for pair in known:
            groups.setdefault(pair[0].partition, []).append(pair)
        calls: list[tuple[list[str], list[str | int]]] = []
        for group in groups.values():
            keys: list[str] = []
            args: list[str | int] = []
            for entry, info in group:
                ev = entry.event
                keys.append(self.keys.measured(ev.session_id))
                args.append(f"{info.created_at.timestamp()!r} {ev.revision} {ev.seq} "
                            f"{ev.prompt_tokens} {float(ev.time)!r} {ev.session_id}")
            keys.append(self.keys.last_calls(group[0][0].partition))
            args.append(self._measured_ttl_ms)
            calls.append((keys, args))
        with mapped_errors("recording measured sizes"):
            replies = self._run_cas(calls)
        verdicts = b"".join(bytes(r) for r in replies)
        ordered = [pair for group in groups.values() for pair in group]
        accepted = []
        for (entry, _), verdict in zip(ordered, verdicts, strict=True):
            if verdict == ord("1"):
                accepted.append(entry)
            elif verdict == ord("2"):
                self._forget(entry.event.session_id)  # re-read it next time
        return accepted

    def _run_cas(self, calls: Sequence[tuple[list[str], list[str | int]]]) -> list[bytes]:
        if len(calls) == 1 or self._cluster:
            # A cluster pipeline does not load scripts on the nodes it reaches (a restarted
            # node has none): direct calls reload on NOSCRIPT.
            return [self._cas(keys=k, args=a) for k, a in calls]
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            self._cas(keys=keys, args=args, client=pipe)
        return list(pipe.execute())

    def _note_calls(self, entries: Sequence[StreamEntry]) -> None:
        """Move the last call time of deferred reports' sessions forward (``ZADD GT``, one
        command per partition, pipelined): what the idle sweep reads. No compare-and-set: a
        deferred report reaches neither the store nor the session's ``measured`` hash."""
        if not entries:
            return
        calls: dict[int, dict[str, float]] = {}
        for entry in entries:
            calls.setdefault(entry.partition, {})[entry.event.session_id] = float(entry.event.time)
        with mapped_errors("recording the sessions' last calls"):
            pipe = self._client.pipeline(transaction=False)
            for partition, mapping in calls.items():
                pipe.zadd(self.keys.last_calls(partition), mapping, gt=True)
            pipe.execute()

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

    # --- session info cache ------------------------------------------------------------------
    def _cached_info(self, sid: str) -> SessionInfo | None:
        hit = self._infos.get(sid)
        if hit is not None and time.monotonic() - hit[0] <= self._cache_s:
            return hit[1]
        try:
            info: SessionInfo | None = self.store.get_session(sid)
        except SessionNotFoundError:
            info = None
        self._infos[sid] = (time.monotonic(), info)
        return info

    def _gates_for(self, entries: Iterable[StreamEntry],
                   now: float) -> tuple[dict[str, SessionGate | None], set[str]]:
        """The gate of each entry's session, the misses read in one store query (a batch of a
        thousand cold sessions: one round trip, not a thousand), and the sessions of those
        whose size this scheduler wrote to the store lately (:meth:`_fresh_in_store`, for the
        entry's report). ``entries``: one per session.

        A gate comes from a store read, or from this scheduler's last write of the session's
        size (:meth:`flush`: the write hands back the row's gate). It serves for
        ``scheduler_policy_cache_s`` after it was read, and for as long as this scheduler has
        written that incarnation's size and the entry's report is not older than the written
        one (:meth:`_written`). A report that is not deferred is written, and its write brings
        the gate up to date before anything is decided on it (flush), so a gate is never much
        older than ``scheduler_store_refresh_s``; until then it only says whether the report
        is written at once (past the trigger) or with the batch. Policy changes, pauses and
        resumes made through sessionfold nudge the scheduler, which drops the gate at once
        (``_act_on_nudges``).
        """
        found: dict[str, SessionGate | None] = {}
        fresh: set[str] = set()
        missing: list[StreamEntry] = []
        for entry in entries:
            ev = entry.event
            sid = ev.session_id
            hit = self._gates.get(sid)
            gate = None if hit is None else hit[1]
            written = None if gate is None else self._written(gate, ev.position)
            if written is None and (hit is None or now - hit[0] > self._cache_s):
                missing.append(entry)
                continue
            found[sid] = gate
            if written is not None and now - written < self._refresh_s:
                fresh.add(sid)
        if missing:
            read = self.store.session_gates([entry.event.session_id for entry in missing])
            now = time.monotonic()
            for entry in missing:
                sid = entry.event.session_id
                gate = found[sid] = read.get(sid)
                self._gates[sid] = (now, gate)
                if gate is not None and self._fresh_in_store(gate, now, entry.event.position):
                    fresh.add(sid)
        return found, fresh

    def _remember(self, info: SessionInfo) -> None:
        """A fresh read of the session: both caches take it."""
        now = time.monotonic()
        self._infos[info.id] = (now, info)
        self._gates[info.id] = (now, info.gate)

    def _forget(self, sid: str, *, gone: bool = False) -> None:
        """Read the session again next time; ``gone``: it is known not to exist."""
        if gone:
            now = time.monotonic()
            self._infos[sid] = (now, None)
            self._gates[sid] = (now, None)
        else:
            self._infos.pop(sid, None)
            self._gates.pop(sid, None)
            self._written_at.pop(sid, None)  # (another incarnation)

    def _prune_caches(self, max_entries: int = 100_000) -> None:
        if len(self._infos) > max_entries:
            now = time.monotonic()
            self._infos = {k: v for k, v in self._infos.items() if now - v[0] <= self._cache_s}
        # A session written lately (within two refresh intervals: one calling at all is
        # written again within one) keeps its write and the gate that came with it.
        if len(self._written_at) > max_entries:
            now = time.monotonic()
            self._written_at = {k: held for k, held in self._written_at.items()
                                if now - held[1] < 2 * self._refresh_s}
        if len(self._gates) > max_entries:
            now = time.monotonic()
            self._gates = {k: v for k, v in self._gates.items()
                           if now - v[0] <= self._cache_s
                           or (v[1] is not None and self._written(v[1]) is not None)}
        if len(self._verdicts) > max_entries:
            self._verdicts = {k: v for k, v in self._verdicts.items() if k in self._infos}


def _latest_per_session(entries: Sequence[StreamEntry]) -> dict[str, StreamEntry]:
    latest: dict[str, StreamEntry] = {}
    for entry in entries:
        sid = entry.event.session_id
        held = latest.get(sid)
        if held is None or supersedes(entry.event.position, held.event.position):
            latest[sid] = entry
    return latest


def _report(ev: UsageEvent) -> UsageReport:
    # The event already carries the measured prompt size: the store takes the number.
    return UsageReport(session_id=ev.session_id, usage=None, seq=ev.seq, revision=ev.revision,
                       model=ev.model or None, prompt_tokens=ev.prompt_tokens)


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop``: the loop finishes its batch and returns (main thread)."""
    def _handler(signum: int, frame: FrameType | None) -> None:
        log.info("received signal %d; stopping after this batch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)
