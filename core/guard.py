"""The pre-send guard: the budget is a hard cap on every request.

A background fold lands between calls; until it does, one large tool output can take the
window past the budget. Before each request the client asks :func:`guard_window` about the
window it is about to send. The request's size is the session's calibrated estimate
(``a × estimate + b``, :class:`~.tokens.Calibration`) of the system prompt and the items, plus
``extra_tokens`` (what else is sent that the calibration does not include: the recall tool's
definition). The line is :attr:`FoldPolicy.guard_tokens
<sessionfold.core.policy.FoldPolicy.guard_tokens>`, the budget less a safety margin for the
estimate's error. At or under it the items go as they are (``"under"``). Over it, *stages* run
on a copy, each only if the ones before it left the request over the line, and the best shrink
reached is what goes out:

1. ``cheap``: the planner's own cheap steps over every unprotected turn (``clip-oversized`` and
   ``drop-recall`` always, then the policy's ``mask-tool-results`` and ``drop-thinking``) —
   every unprotected item they can shrink, not just enough to get under: a cut that stopped
   "just under" would move on every call while the window grows, each move rewriting the prompt
   cache from an early item to the end, while the cut at the protected recent turns moves only
   as turns leave them, near the end of the request;
2. ``clip-protected``: the user messages inside the protected turns clipped (their head and tail
   kept, the ledger seq named), oldest first, then the task, the newest message last, each to
   the largest size of a fixed ladder (the policy's per-item cap, its half, its quarter...)
   that the request needs, so the clip stays put while the window grows; and only if that is
   not enough, the model's own replies
   there (their text and tool-call inputs: a model that wrote a 200 k-character thought), on
   this request alone;
3. ``drop-history`` (asked for only after an inline fold could not help): what is left of the
   unprotected history replaced by one notice naming its ledger range, on the request alone.

Never the summarizer: a fold on the agent's path is the client's decision (``call()`` folds
inline between stage 2 and stage 3, through the workers' commit path). When every stage asked
for leaves the request over the line, the result is ``"over-budget"`` with the best shrink and
the largest item left (:attr:`GuardResult.largest_seq`), for the caller's error or its choice to
send anyway.

The stages are :func:`~.compact.fold_window`'s own steps and :func:`~.clip.clip_oversized`
(one owner of what a cheap fold may do), so the stubs name ledger seqs as the store's do and
recall hints work on them. Pure and deterministic: the same items, policy and calibration give
the same items, so a request sent again is byte-identical and its cached prefix holds. Nothing
here is written anywhere; the stored window changes only through folds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .clip import clip_oversized, clip_own_words
from .compact import FoldVisit, fold_window
from .policy import FoldPolicy
from .recall_hints import as_sent
from .tokens import Calibration, TokenCounter, default_counter
from .turns import group_turns, protect, turn_reasons
from .window import Originals, WindowItem

__all__ = ["GUARD_LAYERS", "MIN_CLIP_TOKENS", "GuardOutcome", "GuardResult", "GuardStage",
           "guard_window"]

#: The policy layers the ``cheap`` stage may run (the rest call the summarizer or drop turns).
GUARD_LAYERS = ("mask-tool-results", "drop-thinking")

#: ``under``: sent as it is; ``guarded``: a stage brought it under; ``over-budget``: the stages
#: asked for could not (the items are then the best shrink).
GuardOutcome = Literal["under", "guarded", "over-budget"]

#: The stages, in the order they run (see the module doc).
GuardStage = Literal["cheap", "clip-protected", "drop-history"]
STAGES: tuple[GuardStage, ...] = ("cheap", "clip-protected", "drop-history")

#: A protected message is never clipped below this many tokens: its head and tail stay
#: readable, and the clip line names where the rest is.
MIN_CLIP_TOKENS = 200


@dataclass(frozen=True)
class GuardResult:
    """What the guard decided for one request. Sizes are calibrated estimates, in tokens."""

    outcome: GuardOutcome
    #: The items to send: the input list itself when ``under``, else the best shrink.
    items: list[WindowItem]
    #: The request as read, and as the guard leaves it.
    tokens_before: int
    tokens_after: int
    #: The line: the budget less the safety margin.
    limit_tokens: int
    #: The layers and stages that changed something (``clip-protected``, ``drop-history``
    #: named as such).
    layers: tuple[str, ...] = ()
    #: ``over-budget`` only: the largest item left in the best shrink (its start seq and
    #: calibrated tokens); None when the items are empty (the system prompt alone is over).
    largest_seq: int | None = None
    largest_tokens: int = 0

    @property
    def unsent_tokens(self) -> int:
        """Tokens of the stored window the request leaves out (0 unless shrunk)."""
        return self.tokens_before - self.tokens_after

    @property
    def best_tokens(self) -> int:
        """What the stages could reach (``tokens_after``; kept for the log line)."""
        return self.tokens_after


class _Request:
    """The request being shrunk: its items and calibrated size."""

    def __init__(self, items: list[WindowItem], calibration: Calibration, counter: TokenCounter,
                 fixed_tokens: int, recall: bool) -> None:
        self.items = items
        self.calibration = calibration
        self.counter = counter
        self.fixed = fixed_tokens
        self.recall = recall
        #: Edited items as sent (with their recall hints), counted once each.
        self._sent: dict[int, tuple[WindowItem, int]] = {}

    def item_tokens(self, item: WindowItem) -> int:
        """The item as it goes out: a stub, seam or frame with its recall hint when the request
        carries the tool (the hint is tokens too), a plain message as stored."""
        if item.kind == "message" and not item.edits:
            return item.tokens if item.tokens is not None else self.counter.message(item.message)
        hit = self._sent.get(id(item))
        if hit is None or hit[0] is not item:
            hit = (item, self.counter.message(as_sent(item, recall=self.recall)))
            self._sent[id(item)] = hit
        return hit[1]

    def tokens(self) -> int:
        return self.calibration.predict(self.fixed + sum(self.item_tokens(i)
                                                         for i in self.items))

    @property
    def slope(self) -> float:
        return self.calibration.a if self.calibration.samples > 0 else 1.0


def guard_window(items: Sequence[WindowItem], policy: FoldPolicy, calibration: Calibration, *,
                 system_tokens: int, extra_tokens: int = 0,
                 counter: TokenCounter | None = None,
                 originals: Originals | None = None,
                 last_stage: GuardStage = "clip-protected",
                 recall: bool = False) -> GuardResult:
    """Decide what one request sends (see the module doc).

    ``system_tokens`` is the system prompt's estimate (the store keeps it), ``extra_tokens`` the
    estimate of what else goes out that the calibration does not include; ``originals`` looks
    up a clipped item's ledger message, so a stub or clip written over it names the original's
    size. ``last_stage``: the last stage that may run (``drop-history`` only after an inline
    fold could not bring the window under). ``recall``: the request carries the recall tool, so
    its stubs, seams and frames go out with their hints (:func:`~.recall_hints.as_sent`),
    measured so.
    """
    c = counter or default_counter()
    request = _Request(list(items), calibration, c, system_tokens + extra_tokens, recall)
    before = request.tokens()
    limit = policy.guard_tokens
    if before <= limit:
        return GuardResult("under", request.items, before, before, limit)
    layers: list[str] = []
    for stage in STAGES[:STAGES.index(last_stage) + 1]:
        if stage == "cheap":
            layers += _cheap(request, policy, before, limit, originals)
        elif stage == "clip-protected":
            layers += _clip_protected(request, policy, limit, originals)
        else:
            layers += _drop_history(request, policy, originals)
        if request.tokens() <= limit:
            return GuardResult("guarded", request.items, before, request.tokens(), limit,
                               layers=tuple(layers))
    after = request.tokens()
    largest = max(request.items, key=request.item_tokens, default=None)
    return GuardResult(
        "over-budget", request.items, before, after, limit, layers=tuple(layers),
        largest_seq=largest.start_seq if largest is not None else None,
        largest_tokens=(round(request.slope * request.item_tokens(largest))
                        if largest is not None else 0))


def _cheap(request: _Request, policy: FoldPolicy, before: int, limit: int,
           originals: Originals | None) -> list[str]:
    """Stage 1: the planner's cheap steps over every unprotected turn (target 0), the cut
    placed where it stays put for several calls (:func:`_steady_keep`) when that is enough."""
    # The planner's steps, its summarizer and drop-oldest left out: the policy's own cheap
    # layers only. model_copy skips validation on purpose: "no layer" is a valid ask here.
    cheap = policy.model_copy(update={"layers": tuple(
        layer for layer in policy.layers if layer in GUARD_LAYERS)})
    steady = _steady_keep(request.items, policy.keep_recent_turns)
    tries = [steady, policy.keep_recent_turns] if steady != policy.keep_recent_turns else [
        policy.keep_recent_turns]
    for keep in tries:
        result = fold_window(request.items, FoldVisit(
                cheap.model_copy(update={"keep_recent_turns": keep}),
                None, measured_tokens=before, calibration=request.calibration,
                trigger="overflow", force=True, target_tokens=0,
                counter=request.counter, originals=originals))
        if result.edit.empty:
            continue
        shrunk = _Request(list(result.window), request.calibration, request.counter,
                          request.fixed, request.recall)
        if shrunk.tokens() <= limit or keep == tries[-1]:
            request.items = shrunk.items
            return list(result.record.layers_run)
    return []


def _steady_keep(items: Sequence[WindowItem], keep: int) -> int:
    """The turns to keep whole so that the cut sits at a multiple of ``keep`` turns from the
    window's start: between ``keep`` and ``2·keep − 1``.

    The cut at exactly the last ``keep`` turns moves on every call (one turn leaves the kept
    ones each time), and each move rewrites the prompt cache from the newly shrunk turn to the
    end. A cut that moves ``keep`` turns at a time is rewritten once every ``keep`` calls:
    while a background fold is still on its way (a slow summarizer), the guarded requests
    between two moves share their prefix. Counted as the planner counts the keep window:
    assistant messages, leaving summaries and recall exchanges out."""
    if keep < 2:
        return keep
    turns = sum(1 for item in items
                if item.kind == "message" and item.message.role == "assistant")
    if turns <= keep:
        return keep
    return keep + (turns - keep) % keep


def stable_cap(room: int, ceiling: int) -> int:
    """The size a protected message is clipped to when ``room`` tokens are left for it: the
    largest of ``ceiling`` (the policy's per-item cap), its half, its quarter... that fits,
    never under :data:`MIN_CLIP_TOKENS`.

    A clip sized to exactly what the request needs moves with every call while the window
    grows: each call's request differs from the last from that message on, and the cache is
    written again from there (B1: a 54k-token reply in the protected turns of a 64k session,
    clipped anew on five calls in a row, 55k tokens written each time). A size from a fixed
    ladder stays put until the window has grown past a whole step."""
    cap = max(MIN_CLIP_TOKENS, ceiling)
    while cap > room and cap > MIN_CLIP_TOKENS:
        cap = max(MIN_CLIP_TOKENS, cap // 2)
    return cap


def _clip_protected(request: _Request, policy: FoldPolicy, limit: int,
                    originals: Originals | None) -> list[str]:
    """Stage 2: clip the user messages inside the protected turns, oldest first, then the
    task, the newest message last; each to the largest size of a fixed ladder that gets the
    request under (:func:`stable_cap`), so the clip stays put over the calls that follow."""
    items = request.items
    turns = group_turns(items)
    protection = protect(items, policy, turns=turns)
    protected = [pos for turn, reason in zip(turns, turn_reasons(turns, protection),
                                             strict=True)
                 if reason is not None for pos in range(turn.index, turn.stop)]
    task = next((pos for pos in protected if items[pos].start_seq == protection.first_user_seq),
                None)
    newest = len(items) - 1
    order = [pos for pos in protected if pos not in (task, newest)]
    order += [pos for pos in (task, newest) if pos is not None and pos in protected]
    changed = False
    # The user's side first (tool outputs, the task, the newest last); only then the model's
    # own replies, which a request carries clipped only when nothing else gets it under.
    for role in ("user", "assistant"):
        for pos in order if role == "user" else protected:
            need = request.tokens() - limit
            if need <= 0:
                return ["clip-protected"] if changed else []
            item = items[pos]
            if item.kind != "message" or item.message.role != role:
                continue
            size = request.item_tokens(item)
            cap = stable_cap(size - math.ceil(need / request.slope), policy.max_item_tokens)
            if cap >= size:
                continue
            if role == "assistant":
                clipped = clip_own_words(item, cap, request.counter)
            else:
                original = (originals(item.start_seq)
                            if originals is not None and "clipped" in item.edits else None)
                clipped = clip_oversized(item, None, cap, request.counter, original=original)
            if clipped is not item and request.item_tokens(clipped) < size:
                items[pos] = clipped
                changed = True
    return ["clip-protected"] if changed else []


def _drop_history(request: _Request, policy: FoldPolicy,
                  originals: Originals | None) -> list[str]:
    """Stage 3: the unprotected history left as one notice per run (on the request only)."""
    notices = policy.model_copy(update={"layers": ("drop-oldest",)})
    result = fold_window(request.items, FoldVisit(notices, None, calibration=request.calibration,
                         trigger="overflow", force=True, target_tokens=0,
                         counter=request.counter, originals=originals))
    if result.edit.empty:
        return []
    request.items = list(result.window)
    return ["drop-history"]
