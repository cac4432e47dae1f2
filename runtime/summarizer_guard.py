"""The summarizer of a fold, behind the guards every fold meets: background and inline alike.

A storm of fold jobs (or of agents overflowing at once) must not become a bill, so no fold calls
the summarizer bare. Each visit asks the guard, once its claim names the session incarnation::

    choice = guard.choose(session_id, incarnation)   # the summarizer, or why not this visit
    result = fold_window(..., choice.summarizer, summarizer_skipped=choice.skipped)
    guard.charge(session_id, incarnation, result.record.summarizer_usage)

- **Global slots** (:class:`~.slots.SummarizerSlots`): at most ``summarizer_max_concurrency``
  summarizer calls in flight across every worker and every agent. A background fold waits a
  little for a slot; with none free it fails with a transient error, which Celery retries with
  backoff (instead of queueing up inside workers). An inline fold never waits, since an agent is
  waiting on it: with no slot free it folds with the cheap layers only (masking old tool output,
  dropping thinking), and its record says the summarizer was skipped and why.
- **Spend cap** (:class:`~.spend.SpendCap`): what the summarizer spent on this session
  incarnation (a session deleted and created again starts at 0). Past the cap a visit folds with
  the free layers only and its record says so.
- **Never pay blind**: when Redis cannot say whether the cap is reached (or, for an inline fold,
  whether a slot is free), the visit folds with the free layers only and says so.

Which visits pay is decided here; what they cost is :func:`~.prices.summarizer_cost_usd`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sessionfold.core.errors import RedisUnavailableError
from sessionfold.core.summarizers import Summarizer
from sessionfold.core.window import SummarizerUsage

from .keys import Keys
from .slots import GatedSummarizer, SummarizerSlots
from .spend import SpendCap

__all__ = ["SummarizerChoice", "SummarizerGuard"]

log = logging.getLogger(__name__)

_FREE_ONLY = "folded with the free layers only"


@dataclass(frozen=True)
class SummarizerChoice:
    """The summarizer one visit may call (None: none), and why not when it may not."""

    summarizer: Summarizer | None
    #: Why the summarizer is skipped this visit (None when it is not): goes into the record.
    skipped: str | None = None


class SummarizerGuard:
    """``summarizer`` behind the global slots and the per-session spend cap (see module doc).

    ``wait_for_slot``: a background fold waits for a slot (``slots.wait_s``); an inline one
    never does.
    """

    def __init__(self, summarizer: Summarizer, slots: SummarizerSlots, spend: SpendCap,
                 keys: Keys, *, wait_for_slot: bool) -> None:
        self.inner = summarizer
        self.slots = slots
        self.spend = spend
        self.keys = keys
        self.wait_for_slot = wait_for_slot
        #: Each call holds a slot. An inline fold that finds a slot taken between its check and
        #: its call records a ``summarizer-failed`` refusal naming the busy slots, never waits.
        self.gated = GatedSummarizer(summarizer, slots, unavailable_is_transient=not wait_for_slot)

    def __repr__(self) -> str:
        kind = "background" if self.wait_for_slot else "inline"
        return f"SummarizerGuard({self.inner!r}, {kind}, limit={self.slots.limit})"

    def choose(self, session_id: str, incarnation: int) -> SummarizerChoice:
        """The summarizer of one visit to this session incarnation, or why it goes without."""
        skipped = self._spend_note(self.keys.summarizer_spend(session_id, incarnation))
        if skipped is None and not self.wait_for_slot:
            skipped = self._slot_note()
        if skipped is not None:
            return SummarizerChoice(None, skipped)
        return SummarizerChoice(self.gated)

    def charge(self, session_id: str, incarnation: int, usage: SummarizerUsage) -> None:
        """Count what a visit's summarizer calls cost against the session's spend.

        The fold has landed by now: a count lost to a Redis outage is logged, never raised
        (the cap may then let the session spend a little more; the fold is not undone).
        """
        if not usage.calls:
            return
        key = self.keys.summarizer_spend(session_id, incarnation)
        try:
            self.spend.add(key, usage)
        except RedisUnavailableError as exc:
            log.warning("summarizer spend of %s not counted: %s", key, exc)

    def _spend_note(self, spend_key: str) -> str | None:
        try:
            capped = self.spend.exhausted(spend_key)
        except RedisUnavailableError as exc:
            # The claim is held: fold what is free rather than fail and block the session for a
            # lease, and never pay blind.
            log.warning("summarizer spend of %s unreadable: %s", spend_key, exc)
            return ("the session's summarizer spend could not be read (Redis unavailable): "
                    + _FREE_ONLY)
        if not capped:
            return None
        return f"summarizer spend cap of ${self.spend.cap_usd:g} reached for this session: " \
               + _FREE_ONLY

    def _slot_note(self) -> str | None:
        """An inline fold's look at the slots before it plans: it never waits for one."""
        try:
            busy = self.slots.in_flight() >= self.slots.limit
        except RedisUnavailableError as exc:
            log.warning("summarizer slots unreadable for an inline fold: %s", exc)
            return ("the global summarizer slots could not be read (Redis unavailable): "
                    + _FREE_ONLY)
        if not busy:
            return None
        return (f"all {self.slots.limit} global summarizer slots are busy, and an inline fold "
                "never waits for one: " + _FREE_ONLY)
