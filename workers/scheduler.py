"""The scheduler: reads the usage bus, keeps each session's measured size, enqueues fold jobs.

    scheduler = Scheduler(settings, store, client, enqueue)
    scheduler.run_forever(stop)             # until stop is set (SIGTERM: install_signal_handlers)
    stats = scheduler.run_once()            # one batch (tests, benchmarks)

One batch, top to bottom (:meth:`Scheduler.run_once`):

1. Read up to ``scheduler_batch_size`` usage events from the stream's consumer group (entries a
   dead scheduler left pending are reclaimed first; see :mod:`.usagebus`).
2. Keep the newest event per session, by ``(revision, seq)``, and compare-and-set it into the
   session's ``measured`` hash in Redis with a Lua script: an event older than the one stored
   never overwrites it, however schedulers interleave (several may run at once).
3. Write the accepted values to the store in one call (``record_usage_batch``); the store keeps
   its own copy monotonic too, and refuses reports built on a window a fold has replaced.
4. For each session whose report passes its policy's trigger (policy read from the store,
   cached for ``scheduler_policy_cache_s``): take the session's fold lock, re-read the session
   from the store and enqueue one job if it still needs one (:func:`skip_reason`).
5. Acknowledge the entries. A failure before this point leaves them pending: they are reclaimed
   and acted on again, which is harmless (steps 2–4 are idempotent).

When the scheduler is behind (a read comes back full) the store is the slow part: step 3 then
waits, up to ``scheduler_store_flush_ms``, for the next batches, so each session's newest value
is written once rather than once per batch. Sessions past their trigger are never held back
(steps 3–4 run for them at once), and an entry is acknowledged only when the value it carries,
or a newer one, is in the store. When caught up every batch is written as it is read.

Every ``scheduler_sweep_interval_s`` the scheduler also asks the store for over-budget sessions
(``over_budget``): Redis keeps nothing on disk, and events dropped by a publisher during an
outage or lost in a restart must not leave a session unfolded.

``enqueue(session_id, enqueued_epoch, trigger, lock_token) -> job_id`` is supplied by the
caller (the Celery app's; tests pass a recording fake). The job must release the fold lock with
``lock_token`` when it ends (:class:`~sessionfold.workers.locks.FoldLock`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Protocol

import redis
from sessionfold.core.errors import SessionfoldError, SessionNotFoundError
from sessionfold.core.policy import FoldPolicy
from sessionfold.store.results import SessionInfo, UsageReport
from sessionfold.store.store import SessionStore

from .keys import Keys
from .locks import FoldLock
from .metrics import Metrics, metrics
from .redis_conn import mapped_errors
from .settings import Settings
from .usagebus import StreamEntry, UsageConsumer, UsageEvent

__all__ = ["BatchStats", "Enqueue", "Scheduler", "install_signal_handlers", "skip_reason"]

log = logging.getLogger(__name__)

#: Visit outcomes after which a session waits for its window to grow (or its policy to change).
NO_FOLD_OUTCOMES = frozenset({"nothing-to-fold", "refused"})

# Compare-and-set of the measured size of every session of a batch, in one call. KEYS: the
# sessions' hashes. ARGV: one "born revision seq tokens" string per key (born: the session's
# creation time; tokens: the prompt size), then the ttl in ms. One string per key because the
# client's cost is per argument. Returns one character per key:
#   "1"  stored: the event is not older (by revision, then seq) than what the hash holds, or the
#        hash belongs to an earlier session of the same id (deleted and created again: its
#        revisions start over). An equal position counts on purpose: an entry redelivered
#        because its store write failed must reach the store the second time.
#   "0"  older than what the hash holds: ignored.
#   "2"  judged with a creation time older than the hash's: the caller's copy of the session
#        is stale (re-read it); ignored.
# In Lua so each compare and its write are one step however many schedulers race; one call per
# batch because the client's cost is per command, not per key.
_MEASURED_CAS = """
local ttl = ARGV[#ARGV]
local out = {}
for i, key in ipairs(KEYS) do
  local sborn, srev, sseq, stok = string.match(ARGV[i], '^(%S+) (%d+) (%d+) (%d+)$')
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
  out[i] = verdict
end
return table.concat(out)
"""


class Enqueue(Protocol):
    """Puts one fold job on the queue and returns its job id.

    ``enqueued_epoch`` is the session's ``fold_epoch`` when the scheduler decided (the job's
    claim stops if a newer claim exists); ``trigger`` is ``"threshold"``; the job releases the
    session's fold lock with ``lock_token`` when it ends.
    """

    def __call__(self, session_id: str, enqueued_epoch: int | None, trigger: str,
                 lock_token: str | None) -> str: ...


@dataclass
class BatchStats:
    """What one :meth:`Scheduler.run_once` did."""

    events: int = 0
    #: Sessions whose newest event in the batch was not older than their measured size.
    accepted: int = 0
    #: Events older than another for their session (in the batch or in Redis).
    superseded: int = 0
    #: Sessions the store does not know (deleted, or never created).
    unknown: int = 0
    #: Measured sizes written to the store.
    written: int = 0
    #: Job ids enqueued, by session.
    enqueued: dict[str, str] = field(default_factory=dict)
    #: Sessions over their trigger that were not enqueued, with the reason.
    skipped: dict[str, str] = field(default_factory=dict)
    swept: bool = False


def skip_reason(info: SessionInfo, verdict_policy: FoldPolicy | None = None) -> str | None:
    """Why a session should not get a fold job now, or None if it should.

    ``verdict_policy`` is the policy the session had when its last no-fold visit was seen (a
    changed policy reopens the session); None when unknown.
    """
    if info.paused:
        return "paused"
    if info.current_tokens <= info.trigger_tokens:
        return "under-trigger"
    if info.last_visit_outcome in NO_FOLD_OUTCOMES:
        grown = info.last_visit_tokens is None or info.current_tokens > info.last_visit_tokens
        policy_changed = verdict_policy is not None and verdict_policy != info.policy
        if not grown and not policy_changed:
            return "no-growth-since-" + info.last_visit_outcome
    return None


class Scheduler:
    """Turns usage events into fold jobs. One instance per process; not thread-safe."""

    def __init__(self, settings: Settings, store: SessionStore, client: redis.Redis,
                 enqueue: Enqueue, *, consumer_name: str | None = None,
                 metrics_: Metrics | None = None, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.keys = Keys.from_settings(settings)
        self.consumer = UsageConsumer.from_settings(settings, client, consumer_name)
        self.lock = FoldLock.from_settings(settings, client)
        self._client = client
        self._enqueue = enqueue
        self._metrics = metrics_ or metrics()
        self._clock = clock
        self._cas = client.register_script(_MEASURED_CAS)
        self._measured_ttl_ms = int(settings.measured_ttl_s * 1000)
        self._cache_s = settings.scheduler_policy_cache_s
        #: session → (monotonic time read, info or None for unknown)
        self._infos: dict[str, tuple[float, SessionInfo | None]] = {}
        #: session → (last_visit_at, policy) of the last no-fold verdict seen
        self._verdicts: dict[str, tuple[datetime | None, FoldPolicy]] = {}
        self._next_sweep = 0.0
        self._flush_s = settings.scheduler_store_flush_ms / 1000
        #: session → the entry carrying its newest accepted value, not yet in the store
        self._unwritten: dict[str, StreamEntry] = {}
        self._unwritten_since: float | None = None

    # --- the loop ----------------------------------------------------------------------------
    def run_forever(self, stop: threading.Event) -> None:
        """Run batches until ``stop`` is set; survives Redis and store outages with backoff."""
        backoff = 0.0
        log.info("scheduler %s reading %s", self.consumer.name, self.consumer.stream)
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
        except Exception:  # the entries stay pending; another scheduler takes them over
            log.exception("could not write the last measured sizes before stopping")
        log.info("scheduler %s stopped", self.consumer.name)

    def run_once(self, stop: threading.Event | None = None) -> BatchStats:
        """One batch: sweep if due, read, measure, record, enqueue, acknowledge."""
        stats = BatchStats()
        if time.monotonic() >= self._next_sweep:
            self.sweep(stats)
        entries = self.consumer.read(stop)
        if entries:
            self.handle(entries, stats)
        elif self._unwritten:
            self.flush(stats)  # caught up: nothing more will coalesce with what waits
        return stats

    def handle(self, entries: Sequence[StreamEntry], stats: BatchStats | None = None
               ) -> BatchStats:
        """Act on a batch of entries and acknowledge them (see the module doc)."""
        stats = stats or BatchStats()
        latest = _latest_per_session(entries)
        known = [(e, info) for sid, e in latest.items()
                 if (info := self._cached_info(sid)) is not None]
        accepted = self._compare_and_set(known)
        superseded = len(entries) - len(latest) + len(known) - len(accepted)
        unknown = len(latest) - len(known)
        stats.events += len(entries)
        stats.accepted += len(accepted)
        stats.superseded += superseded
        stats.unknown += unknown
        self._metrics.count_usage_events("accepted", len(accepted))
        self._metrics.count_usage_events("superseded", superseded)
        self._metrics.count_usage_events("unknown-session", unknown)

        # An accepted entry "carries" its session's value until the value is in the store;
        # every other entry (older, unknown session, or carrying a value now replaced by a
        # newer one) is done with and acknowledged now.
        carriers = {id(e) for e in accepted}
        done = [e for e in entries if id(e) not in carriers]
        urgent: list[str] = []
        if self._unwritten_since is None and accepted:
            self._unwritten_since = time.monotonic()
        for entry in accepted:
            sid = entry.event.session_id
            replaced = self._unwritten.get(sid)
            if replaced is not None and replaced.entry_id != entry.entry_id:
                done.append(replaced)  # (the same id: our own entry reclaimed, still carrying)
            self._unwritten[sid] = entry
            info = self._cached_info(sid)
            if info is not None and self._may_be_over(info, entry.event):
                urgent.append(sid)
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
            self.store.record_usage_batch([_report(self._unwritten[sid].event) for sid in chunk])
            written = [self._unwritten.pop(sid) for sid in chunk]
            stats.written += len(written)
            failed: set[str] = set()
            for entry in written:
                ev = entry.event
                info = self._cached_info(ev.session_id)
                if info is not None and self._may_be_over(info, ev) and \
                        not self._try_enqueue(ev.session_id, "stream", stats, event=ev):
                    failed.add(ev.session_id)
            # A failed enqueue leaves its entry pending: it comes back through XAUTOCLAIM.
            self.consumer.ack([e for e in written if e.event.session_id not in failed])
        if not self._unwritten:
            self._unwritten_since = None
        return len(sids)

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
        self._next_sweep = time.monotonic() + self.settings.scheduler_sweep_interval_s
        stats.swept = True
        before = len(stats.enqueued)
        past_budget = 0
        for info in self.store.over_budget(limit=1000):
            self._infos[info.id] = (time.monotonic(), info)
            past_budget += info.current_tokens > info.policy.budget_tokens
            self._try_enqueue(info.id, "sweep", stats, fresh=info)
        self._metrics.set_sessions_over_budget(past_budget)
        try:
            self.consumer.prune_consumers(idle_ms=self.settings.scheduler_claim_idle_ms * 10)
        except SessionfoldError as exc:
            log.warning("could not prune dead scheduler consumers: %s", exc)
        self._prune_caches()
        return len(stats.enqueued) - before

    # --- steps -------------------------------------------------------------------------------
    def _compare_and_set(self, known: Sequence[tuple[StreamEntry, SessionInfo]]
                         ) -> list[StreamEntry]:
        if not known:
            return []
        keys: list[str] = []
        args: list[str | int] = []
        for entry, info in known:
            ev = entry.event
            keys.append(self.keys.measured(ev.session_id))
            args.append(f"{info.created_at.timestamp()!r} {ev.revision} {ev.seq} "
                        f"{ev.prompt_tokens}")
        args.append(self._measured_ttl_ms)
        with mapped_errors("recording measured sizes"):
            verdicts = bytes(self._cas(keys=keys, args=args))
        accepted = []
        for (entry, _), verdict in zip(known, verdicts, strict=True):
            if verdict == ord("1"):
                accepted.append(entry)
            elif verdict == ord("2"):
                self._infos.pop(entry.event.session_id, None)  # re-read it next time
        return accepted

    def _may_be_over(self, info: SessionInfo, ev: UsageEvent) -> bool:
        # Cheap filter on cached data; the decision itself is made on a fresh read.
        if info.paused:
            return False
        trigger = info.policy.trigger_tokens
        return ev.prompt_tokens > trigger or info.current_tokens > trigger

    def _try_enqueue(self, sid: str, source: str, stats: BatchStats, *,
                     event: UsageEvent | None = None, fresh: SessionInfo | None = None) -> bool:
        """Lock, re-check, enqueue. False only when the enqueue itself failed."""
        # The lock first: while a job is pending this costs one SET NX, not a store read.
        token = self.lock.acquire(sid)
        if token is None:
            stats.skipped[sid] = "job-pending"
            return True
        try:
            info = fresh or self.store.get_session(sid)
        except SessionNotFoundError:
            self.lock.release(sid, token)
            self._infos[sid] = (time.monotonic(), None)
            stats.skipped[sid] = "unknown-session"
            return True
        except BaseException:
            self.lock.release(sid, token)
            raise
        self._infos[sid] = (time.monotonic(), info)
        reason = skip_reason(info, self._verdict_policy(info))
        if reason is not None:
            self.lock.release(sid, token)
            stats.skipped[sid] = reason
            return True
        try:
            job_id = self._enqueue(sid, info.fold_epoch, "threshold", token)
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

    def _prune_caches(self, max_entries: int = 100_000) -> None:
        if len(self._infos) > max_entries:
            now = time.monotonic()
            self._infos = {k: v for k, v in self._infos.items() if now - v[0] <= self._cache_s}
        if len(self._verdicts) > max_entries:
            self._verdicts = {k: v for k, v in self._verdicts.items() if k in self._infos}


def _latest_per_session(entries: Sequence[StreamEntry]) -> dict[str, StreamEntry]:
    latest: dict[str, StreamEntry] = {}
    for entry in entries:
        sid = entry.event.session_id
        held = latest.get(sid)
        if held is None or entry.event.position > held.event.position:
            latest[sid] = entry
    return latest


def _report(ev: UsageEvent) -> UsageReport:
    usage = {"input_tokens": ev.input_tokens,
             "cache_read_input_tokens": ev.cache_read_input_tokens,
             "cache_creation_input_tokens": ev.cache_creation_input_tokens,
             "output_tokens": ev.output_tokens}
    return UsageReport(session_id=ev.session_id, usage=usage, seq=ev.seq, revision=ev.revision,
                       model=ev.model or None)


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop``: the loop finishes its batch and returns (main thread)."""
    def _handler(signum: int, frame: FrameType | None) -> None:
        log.info("received signal %d; stopping after this batch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)
