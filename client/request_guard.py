"""The hard cap on every request of a call: :class:`RequestGuard`, the view one request sends.

Before each request (the first, each recall round's, the retry after an overflow) the stored
window goes through the pre-send guard (:mod:`sessionfold.core.guard`) with the call's plan.

Under ``over_budget="cap"`` (the default) or ``"fold"``, a request past the guard's line (the
budget less the margin) means the background fold is late (a slow summarizer, a long queue).
Shrinking that request alone would rewrite the prompt cache from an early item on this call,
again on each call while the shrink moves with the growing window, and once more when the late
fold lands. So:

1. while a background fold is on its way (a worker holds the session's claim, or the
   scheduler's fold lock says a job is queued), the request waits for it, at most the settings'
   ``guard_wait_s`` (15 s by default; counted in the handle's ``fold_waits`` and
   ``fold_wait_s``): its summary is being written already. One only expected (past the
   session's trigger, a scheduler owns its partition, no job queued yet: an agent faster than
   the pipeline) is waited for two seconds at most, to be queued;
2. if none is, or it does not land in time, the session is folded inline through the workers'
   claim and commit (the inline claim wins over a late one; counted in ``cap_folds``). The
   inline fold folds only the window the request was measured on (``if_revision``): a fold
   that landed just as the wait gave up on it is measured, not folded again;
3. the new window is guarded again: what is still over is shrunk on the request alone (a fold
   that just landed and left the window past the line folded what its protections allow: a
   second one now would find nothing more, and is made only if the request cannot fit).

B1, folds landing six calls late, 14 short task sessions at 16k: 1.10x of no compaction with
request-only shrinks, 0.91x folding inline (sessions above their own no-compaction cost: ten,
then four). An inline fold that changed nothing is not tried again by this handle until a fold
lands (its refusal is recorded once, not once a call); the request then goes out as the
guard's best shrink. A request still over after every stage raises
:class:`~sessionfold.core.errors.BudgetExceededError` naming what cannot fit, before anything is
sent.

Under ``"shrink"`` a request the guard's stages bring under goes out so, shrunk on its own (the
agent never waits for a summarizer while its request fits; the cache is rewritten as said
above); only one they cannot bring under waits or folds. Under ``"send"`` nothing waits or
folds here: the best shrink goes out, counted and logged once. The guard itself writes nothing:
the same window goes out as the same bytes.
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
                    measured_tokens: int | None = None,
                    if_revision: int | None = None) -> FoldReport: ...

    def await_background_fold(self, revision: int, tokens: int) -> bool: ...


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
        #: The session's fold revision when an inline fold of this handle last changed
        #: nothing: no inline fold for a shrinkable request until another fold lands.
        self._fruitless_at: int | None = None

    def view(self, plan: CallPlan) -> WindowView:
        """The view one request sends (see the module doc)."""
        store = self._session.store
        window = store.read_window(self._session.session_id)
        if not plan.policy.guard:
            return self._render(window, None, plan)
        guarded = self._guard(window, plan, "clip-protected")
        late = plan.over_budget != "send" and (guarded.outcome == "over-budget" or (
            guarded.outcome == "guarded" and self._folds_when_past(plan)))
        # Past the line: the background fold is late. While it is on its way, wait for it (its
        # summary is being written already) rather than write another.
        landed = late and self._session.await_background_fold(window.revision,
                                                              guarded.tokens_before)
        if landed:
            window = store.read_window(self._session.session_id)
            guarded = self._guard(window, plan, "clip-protected")
        folded = False
        if guarded.outcome == "guarded" and self._folds_when_past(plan) and not landed:
            # Still past it: fold on the agent's path (the inline claim wins over a stuck
            # background fold) rather than send a shrink of this request alone (module doc).
            # A fold that landed since the window was read is measured instead, not folded
            # again (``if_revision``).
            folded = not self._fold(guarded, window.revision)
            window = store.read_window(self._session.session_id)
            guarded = self._guard(window, plan, "clip-protected")
        if guarded.outcome == "over-budget" and plan.over_budget != "send":
            # Nothing cheap gets it under: fold inline (unless that was just done), then guard
            # the folded window with every stage.
            if not folded:
                if self._fold(guarded, window.revision):
                    # A fold landed first: measure its window, and fold that if it is over.
                    window = store.read_window(self._session.session_id)
                    guarded = self._guard(window, plan, "clip-protected")
                    if guarded.outcome == "over-budget":
                        self._fold(guarded, None)
                window = store.read_window(self._session.session_id)
            guarded = self._guard(window, plan, "drop-history")
            if guarded.outcome == "over-budget":
                raise self._too_large(guarded, plan)
        if guarded.outcome == "guarded":
            self._shrunk(guarded, window.revision)
        elif guarded.outcome == "over-budget":
            self._sent_over(guarded, plan)
        return self._render(window, guarded, plan)

    def _folds_when_past(self, plan: CallPlan) -> bool:
        """Whether a request the guard can shrink under the line has the session folded (or
        waits for the fold on its way) instead: ``cap`` and ``fold``, unless this handle's last
        inline fold changed nothing and no fold has landed since."""
        return plan.over_budget in ("cap", "fold") and not self._fruitless()

    def _fold(self, guarded: GuardResult, revision: int | None) -> bool:
        """Fold the session inline for a request past the line (measured on the window at
        ``revision``; None: whatever window it finds), counted; remember a fold that changed
        nothing (:meth:`_fruitless`). True: another fold had replaced that window (a
        background fold landed after the wait gave up on it), and nothing was folded: the
        caller measures the new window."""
        report = self._session.fold_inline(trigger="overflow",
                                           measured_tokens=guarded.tokens_before,
                                           if_revision=revision)
        if report.moved_from(revision):
            metrics().record_guard("waited")
            return True
        self.cap_folds += 1
        metrics().record_guard("folded-inline")
        if report.outcome not in ("refused", "nothing-to-fold"):
            self._fruitless_at = None  # folded, or lost its race to a fold that landed
        else:
            self._fruitless_at = self._fold_revision()
            log.info("session %s: an inline fold for a request of about %d tokens (limit %d) "
                     "changed nothing (%s); requests go out shrunk by the guard until a fold "
                     "lands", self._session.session_id, guarded.tokens_before,
                     guarded.limit_tokens, report.detail or report.outcome)
        return False

    def _fruitless(self) -> bool:
        """Whether this handle's last inline fold changed nothing and no fold has landed
        since (asked only for a request the guard shrinks)."""
        return self._fruitless_at is not None and self._fruitless_at == self._fold_revision()

    def _fold_revision(self) -> int:
        return self._session.store.get_session(self._session.session_id).fold_revision

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
        """Run the pre-send guard on ``window``."""
        return guard_window(window.items, plan.policy, plan.calibration,
                            system_tokens=plan.system_tokens, extra_tokens=plan.extra_tokens,
                            counter=self._session.store.counter, originals=self._original,
                            last_stage=last_stage, recall=plan.recall)

    def _shrunk(self, result: GuardResult, revision: int) -> None:
        """Count a request that goes out shrunk by the guard."""
        self.guarded_requests += 1
        metrics().record_guard("guarded")
        log.debug("session %s: guarded request at revision %d, %d -> %d tokens (limit %d; %s)",
                  self._session.session_id, revision, result.tokens_before,
                  result.tokens_after, result.limit_tokens, ", ".join(result.layers))

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
