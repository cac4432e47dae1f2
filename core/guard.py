"""The pre-send guard: a request never goes out over its session's budget if the cheap layers
can bring it under.

A background fold lands between calls; until it does, one large tool output can take the
window past the budget. Before each request the client asks :func:`guard_window` about the
window it is about to send:

- the request's size is the session's calibrated estimate (``a × estimate + b``,
  :class:`~.tokens.Calibration`) of the system prompt and the items, plus ``extra_tokens`` (what
  else is sent that the calibration has not seen: the recall tool's definition on a session
  never measured — once measured, the offset ``b`` holds the tool definitions already);
- at or under :attr:`FoldPolicy.guard_tokens <sessionfold.core.policy.FoldPolicy.guard_tokens>`
  (the budget less the safety margin) the items are returned as they are (``"under"``);
- over it, the planner's cheap steps run on a copy over every unprotected turn (not only until
  the estimate is just under: see below): ``clip-oversized`` and ``drop-recall`` (always on),
  then the policy's ``mask-tool-results`` and ``drop-thinking`` layers. A cut that stopped just
  under would move on every call while the window grows, each move rewriting the prompt cache
  from an early item to the end; the cut at the protected recent turns moves only as turns
  leave them, near the end of the request. Never the summarizer, never
  ``drop-oldest``. They are :func:`~.compact.fold_window`'s own steps (one owner of what a cheap
  fold may do), so the stubs name ledger seqs as the store's do and recall hints work on them;
- when that gets under, the edited items are returned (``"guarded"``); when it cannot (the
  protected turns alone are too large) the items are returned as they are (``"over-budget"``):
  the request is sent unchanged, the provider's rejection, if any, meeting the overflow fallback.

Pure and deterministic: the same items, policy and calibration give the same items, so a
request sent again is byte-identical and its cached prefix holds. Nothing here is written
anywhere; the stored window changes only through folds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .compact import fold_window
from .policy import FoldPolicy
from .tokens import Calibration, TokenCounter, default_counter
from .window import Originals, WindowItem

__all__ = ["GUARD_LAYERS", "GuardOutcome", "GuardResult", "guard_window"]

#: The policy layers the guard may run (the rest call the summarizer or drop turns).
GUARD_LAYERS = ("mask-tool-results", "drop-thinking")

#: ``under``: sent as it is; ``guarded``: the cheap layers brought it under;
#: ``over-budget``: they could not, sent as it is.
GuardOutcome = Literal["under", "guarded", "over-budget"]


@dataclass(frozen=True)
class GuardResult:
    """What the guard decided for one request. Sizes are calibrated estimates, in tokens."""

    outcome: GuardOutcome
    #: The items to send: the input list itself unless ``outcome == "guarded"``.
    items: list[WindowItem]
    #: The request as read, and as the guard leaves it (equal unless guarded).
    tokens_before: int
    tokens_after: int
    #: The line: the budget less the safety margin.
    limit_tokens: int
    #: The layers that changed something (``guarded`` only).
    layers: tuple[str, ...] = ()
    #: What the cheap layers could reach when they could not get under (``over-budget`` only).
    best_tokens: int | None = None

    @property
    def unsent_tokens(self) -> int:
        """Tokens of the stored window the request leaves out (0 unless guarded)."""
        return self.tokens_before - self.tokens_after


def guard_window(items: Sequence[WindowItem], policy: FoldPolicy, calibration: Calibration, *,
                 system_tokens: int, extra_tokens: int = 0,
                 counter: TokenCounter | None = None,
                 originals: Originals | None = None) -> GuardResult:
    """Decide what one request sends (see the module doc).

    ``system_tokens`` is the system prompt's estimate (the store keeps it), ``extra_tokens`` the
    estimate of what else goes out uncalibrated; ``originals`` looks up a clipped item's ledger
    message, so a stub written over it names the original's size.
    """
    c = counter or default_counter()
    window = list(items)
    estimate = system_tokens + sum(i.tokens if i.tokens is not None else c.message(i.message)
                                   for i in window) + extra_tokens
    before = calibration.predict(estimate)
    limit = policy.guard_tokens
    if before <= limit:
        return GuardResult("under", window, before, before, limit)
    # The planner's steps, its summarizer and drop-oldest left out: the policy's own cheap
    # layers only. model_copy skips validation on purpose: "no layer" is a valid ask here.
    cheap = policy.model_copy(update={"layers": tuple(
        layer for layer in policy.layers if layer in GUARD_LAYERS)})
    # Target 0: every unprotected item the cheap layers can shrink is shrunk, not just enough
    # to get under. The cut then sits at the protected recent turns and moves only as turns
    # leave them, so the next requests keep this one's prefix (and its prompt cache); a cut
    # that stopped "just under" would move on every call while the window grows, and each
    # move rewrites the cache from an early item to the end.
    result = fold_window(window, cheap, None, measured_tokens=before, calibration=calibration,
                         trigger="overflow", force=True, target_tokens=0, counter=c,
                         originals=originals)
    after = result.record.tokens_after
    if after > limit or result.edit.empty:
        return GuardResult("over-budget", window, before, before, limit, best_tokens=after)
    return GuardResult("guarded", result.window, before, after, limit,
                       layers=result.record.layers_run)
