"""What the scheduler keeps of each session between batches (:class:`SessionCache`).

Four caches, each by session id: the full :class:`~sessionfold.store.results.SessionInfo` (the
sweeps read it), the session's *gate* (:class:`~sessionfold.store.results.SessionGate`:
paused, trigger, size, incarnation; what the usage path checks each report against), this
scheduler's last write of the session's measured size, and the policy of the last no-fold
verdict seen (:mod:`.fold_enqueue`).

The store write of a batch hands back each written session's gate as it left the row
(``apply_usage_batch``), and the decision of step 4 (:mod:`.usage_intake`) and the next reports
are checked against that: a session reporting steadily is read by its writes alone, with no
query of its own. So a gate is renewed whenever the session's size is next due in the store (or
read again after ``scheduler_policy_cache_s`` for a session not written by this scheduler), and
is never much older than ``scheduler_store_refresh_s``. A report older than the one written (the
first report of a session deleted and created again under the same id looks like that) has its
gate read again at once. Changes made through sessionfold (a policy changed by the client, a
pause or resume through the service) nudge the scheduler, which drops its gate; a change made
around it (``sessionfold pause`` on the command line, a direct database update) is seen within
``scheduler_store_refresh_s``, or at the next sweep for a session the store finds past its
trigger. The fold decision itself never uses the gate (:mod:`.fold_enqueue` reads the session
fresh).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime

from sessionfold.core.errors import SessionNotFoundError
from sessionfold.core.policy import FoldPolicy
from sessionfold.store.results import SessionGate, SessionInfo
from sessionfold.store.store import SessionStore

from .usage_consumer import StreamEntry

__all__ = ["SessionCache"]


class SessionCache:
    """The scheduler's caches of what it read and wrote of each session (a mixin of
    :class:`~.scheduler.Scheduler`, which sets them up)."""

    store: SessionStore
    #: ``scheduler_policy_cache_s``: how long a read serves.
    _cache_s: float
    #: ``scheduler_store_refresh_s``: how long a write of a session's size serves.
    _refresh_s: float
    #: session → (monotonic time read, info or None for unknown)
    _infos: dict[str, tuple[float, SessionInfo | None]]
    #: session → (monotonic time read, its gate or None for unknown): the usage path's
    #: cache, a few fields a session (the full info above serves the sweep)
    _gates: dict[str, tuple[float, SessionGate | None]]
    #: session → (last_visit_at, policy) of the last no-fold verdict seen
    _verdicts: dict[str, tuple[datetime | None, FoldPolicy]]
    #: session → (its incarnation, when (monotonic) this scheduler last wrote its measured
    #: size to the store, the report's position): see _fresh_in_store
    _written_at: dict[str, tuple[int, float, tuple[int, int]]]

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
        size (:meth:`~.usage_intake.UsageIntake.flush`: the write hands back the row's gate).
        It serves for ``scheduler_policy_cache_s`` after it was read, and for as long as this
        scheduler has written that incarnation's size and the entry's report is not older than
        the written one (:meth:`_written`). A report that is not deferred is written, and its
        write brings the gate up to date before anything is decided on it (flush), so a gate
        is never much older than ``scheduler_store_refresh_s``; until then it only says whether
        the report is written at once (past the trigger) or with the batch. Policy changes,
        pauses and resumes made through sessionfold nudge the scheduler, which drops the gate
        at once (``_act_on_nudges``).
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
