"""The scheduler's usage path: stream entries to measured sizes, store writes and fold jobs.

One batch of entries, top to bottom (:meth:`UsageIntake.handle`, :meth:`UsageIntake.flush`):

1. Read up to ``scheduler_batch_size`` usage events from the stream's consumer group (entries a
   dead scheduler left pending are reclaimed first; see :mod:`.usage_consumer`).
2. Keep the newest event per session, by ``(revision, seq)``
   (:func:`~sessionfold.core.tokens.supersedes`), and check it against the session's *gate*
   (:class:`~sessionfold.store.results.SessionGate`: paused, trigger, size, incarnation; read
   from the store in one query for a batch's sessions, see :mod:`.session_cache`).
   A report **deferred** (step 3) stops here: it only moves the session's last call time
   forward. Every other report is compare-and-set into the session's ``measured`` hash in
   Redis, so that an event older than the one stored never overwrites it, however schedulers
   interleave (:mod:`.measured_sizes`).
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
   writes every report. The store write hands back each written session's gate as it left the
   row (``apply_usage_batch``), and the decision of step 4 and the next reports are checked
   against that (how long a gate serves: :mod:`.session_cache`).
4. For each session whose report passes its trigger (by its gate): take the session's fold
   lock, re-read the session from the store and enqueue one job if it still needs one
   (:mod:`.fold_enqueue`, :func:`~.fold_enqueue.skip_reason`).
5. Acknowledge the entries. A failure before this point leaves them pending: they are reclaimed
   and acted on again, which is harmless (steps 2–4 are idempotent).

The stream also carries agents' inline folds (:class:`~sessionfold.runtime.usage.FoldEvent`):
the scheduler that reads one counts it into its metrics (``folds_total{trigger="overflow"}``…)
and acknowledges it at once, so each is counted by exactly one scheduler.

It also carries nudges (:class:`~sessionfold.runtime.usage.NudgeEvent`): an agent's append
took a session past its trigger, or its policy or pause changed. After the batch's usage
events, the scheduler takes each nudged session once (nudges are deduplicated per batch)
through the same step 4 as a report past the trigger: the fold lock, one fresh read of the
session from the store, and a job if :func:`~.fold_enqueue.skip_reason` finds none needed. A
nudge changes nothing of the measured state (no compare-and-set, no store write): it only
makes the scheduler look now rather than at the next usage report or sweep, and drops the
session's gate, which the next report reads again.

When the scheduler is behind (a read comes back full) the store is the slow part: step 3 then
waits, up to ``scheduler_store_flush_ms``, for the next batches, so each session's newest value
is written once rather than once per batch. Sessions past their trigger are never held back
(steps 3–4 run for them at once), and an entry is acknowledged only when the value it carries,
or a newer one, is in the store. When caught up every batch is written as it is read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sessionfold.core.tokens import supersedes
from sessionfold.runtime.usage import FoldEvent, NudgeEvent, UsageEvent
from sessionfold.store.results import SessionGate, UsageReport

from .batch_stats import BatchStats
from .fold_enqueue import FoldEnqueue
from .measured_sizes import MeasuredSizes
from .partitions import PartitionLeases
from .usage_consumer import StreamEntry, UsageConsumer

__all__ = ["UsageIntake"]


class UsageIntake(MeasuredSizes, FoldEnqueue):
    """The usage path of one batch (a mixin of :class:`~.scheduler.Scheduler`, which reads the
    stream and sets up what it reads)."""

    consumer: UsageConsumer
    leases: PartitionLeases
    #: ``scheduler_store_flush_ms`` in seconds: how long values may wait to coalesce.
    _flush_s: float
    #: session → the entry carrying its newest accepted value, not yet in the store
    _unwritten: dict[str, StreamEntry]
    #: When (monotonic) values began waiting in ``_unwritten``; None once a flush empties it.
    _unwritten_since: float | None
    #: session → its newest nudge read since the last batch (see _act_on_nudges)
    _nudges: dict[str, NudgeEvent]

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
