"""The hard cap on every request of a call: :class:`RequestGuard`, the view one request sends.

Before each request (the first, each recall round's, the retry after an overflow) the stored
window goes through the pre-send guard (:mod:`sessionfold.core.guard`) with the call's plan.
Past the budget less the margin, the best shrink of the outgoing request alone goes out; under
``over_budget="cap"`` or ``"fold"``, a request the cheap stages cannot bring under has the
session folded inline (through the workers' claim and commit) and is guarded again with every
stage, and one still over raises :class:`~sessionfold.core.errors.BudgetExceededError` naming
what cannot fit, before anything is sent. Under ``"send"`` the best shrink goes out, counted and
logged once. The stored window is left alone: no claim, no commit, so it never races a
background fold; the guard is deterministic, so the same window goes out as the same bytes.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol

from sessionfold.core.errors import BudgetExceededError
from sessionfold.core.guard import GuardResult, GuardStage, guard_window
from sessionfold.core.messages import Message
from sessionfold.core.window import Trigger
from sessionfold.runtime.fold_procedure import FoldReport
from sessionfold.runtime.metrics import metrics
from sessionfold.store import SessionStore, Window

from .call_plan import CallPlan
from .window_view import WindowView, view_of

__all__ = ["GuardedSession", "RequestGuard"]

log = logging.getLogger(__name__)


class GuardedSession(Protocol):
    """What the guard needs of its session (a
    :class:`~sessionfold.client.session.SessionHandle` is one)."""

    session_id: str

    @property
    def store(self) -> SessionStore: ...

    def fold_inline(self, *, trigger: Trigger = "overflow", target_tokens: int | None = None,
                    measured_tokens: int | None = None) -> FoldReport: ...


class RequestGuard:
    """The pre-send guard and the hard cap of one handle's requests, and their counts."""

    def __init__(self, session: GuardedSession) -> None:
        self._session = session
        #: Requests the guard shrank; those it could not bring under the budget (sent over
        #: only with ``over_budget="send"``); inline folds the hard cap made.
        self.guarded_requests = 0
        self.guard_over_budget = 0
        self.cap_folds = 0
        self._told_over_budget = False

    def view(self, plan: CallPlan) -> WindowView:
        """The view one request sends (see the module doc)."""
        store = self._session.store
        window = store.read_window(self._session.session_id)
        if not plan.policy.guard:
            return self._render(window, None, plan)
        guarded = self._guard(window, plan, "clip-protected")
        if guarded.outcome == "over-budget" and plan.over_budget != "send":
            # Nothing cheap gets it under: fold on the agent's path, through the workers'
            # claim and commit (the inline claim wins over a background fold in flight), then
            # guard the folded window with every stage.
            self.cap_folds += 1
            metrics().record_guard("folded-inline")
            self._session.fold_inline(trigger="overflow", measured_tokens=guarded.tokens_before)
            window = store.read_window(self._session.session_id)
            guarded = self._guard(window, plan, "drop-history")
            if guarded.outcome == "over-budget":
                raise self._too_large(guarded, plan)
        if guarded.outcome == "over-budget":
            self._sent_over(guarded, plan)
        return self._render(window, guarded, plan)

    @staticmethod
    def _render(window: Window, guarded: GuardResult | None, plan: CallPlan) -> WindowView:
        if guarded is None or guarded.outcome == "under":
            view = view_of(window, cache_breakpoints=plan.cache_breakpoints, recall=plan.recall)
            return dataclasses.replace(view, tool_tokens=plan.extra_tokens)
        view = view_of(dataclasses.replace(window, items=guarded.items, chars=[]),
                       cache_breakpoints=plan.cache_breakpoints, recall=plan.recall)
        return dataclasses.replace(view, unsent_tokens=guarded.unsent_tokens,
                                   tool_tokens=plan.extra_tokens)

    def _guard(self, window: Window, plan: CallPlan, last_stage: GuardStage) -> GuardResult:
        """Run the pre-send guard on ``window`` and count what it did."""
        result = guard_window(window.items, plan.policy, plan.calibration,
                              system_tokens=plan.system_tokens, extra_tokens=plan.extra_tokens,
                              counter=self._session.store.counter, originals=self._original,
                              last_stage=last_stage, recall=plan.recall)
        if result.outcome == "guarded":
            self.guarded_requests += 1
            metrics().record_guard("guarded")
            log.debug("session %s: guarded request at revision %d, %d -> %d tokens (limit %d; "
                      "%s)", self._session.session_id, window.revision, result.tokens_before,
                      result.tokens_after, result.limit_tokens, ", ".join(result.layers))
        return result

    def _sent_over(self, result: GuardResult, plan: CallPlan) -> None:
        """Count (and log once) a request sent over the budget under ``over_budget="send"``."""
        self.guard_over_budget += 1
        metrics().record_guard("over-budget")
        if self._told_over_budget:
            return
        self._told_over_budget = True
        log.warning("session %s: a request of about %d tokens goes out over its guard limit of "
                    "%d (budget %d, margin %.0f%%): shrunk as far as the guard may (%s), it is "
                    "still %d tokens, the largest item left #%s at %d tokens; sent so because "
                    "over_budget='send' (logged once per handle; counted in guard_over_budget)",
                    self._session.session_id, result.tokens_before, result.limit_tokens,
                    plan.policy.budget_tokens, plan.policy.guard_margin_ratio * 100,
                    ", ".join(result.layers) or "nothing applied", result.tokens_after,
                    result.largest_seq, result.largest_tokens)

    def _too_large(self, result: GuardResult, plan: CallPlan) -> BudgetExceededError:
        """The error of a request no shrink gets under the budget (nothing was sent)."""
        system = plan.calibration.predict(plan.system_tokens) if plan.system_tokens else 0
        if result.largest_seq is None or system >= result.largest_tokens:
            what = f"the system prompt alone is about {system} tokens"
            seq = None
        else:
            what = (f"message #{result.largest_seq} alone is about {result.largest_tokens} "
                    "tokens even clipped (assistant messages, images and binary documents "
                    "are never cut)")
            seq = result.largest_seq
        metrics().record_guard("over-budget")
        return BudgetExceededError(
            f"session {self._session.session_id!r}: the request is about "
            f"{result.tokens_after} tokens after every shrink the guard may make and an inline "
            f"fold, over the budget of {plan.policy.budget_tokens} (limit "
            f"{result.limit_tokens}): {what}. Nothing was sent; raise budget_tokens, or pass "
            "over_budget='send' to send it anyway",
            tokens=result.tokens_after, budget_tokens=plan.policy.budget_tokens, seq=seq)

    def _original(self, seq: int) -> Message | None:
        """The ledger message at ``seq`` (None once discarded): read only when the guard masks
        or re-clips an output clipped before, so its stub names the original's size."""
        rows = self._session.store.read_ledger(self._session.session_id, seq, seq + 1)
        return rows[0].message if rows else None
