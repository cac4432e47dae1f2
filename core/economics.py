"""Whether a planned fold pays, and how deep it goes: the planner's use of :mod:`.cycles`.

A policy with ``economics="dollars"`` has each background visit priced before anything is
changed. The planner measures what the visit *could* do (:class:`FoldShape`: the window X, what
the cheap layers alone would leave, what folding every foldable run would leave, the stable
head H and the growth per call g) and :func:`decide` turns that into
:func:`~.cycles.choose_fold` options:

- ``cheap-layers``: the window the free layers leave (mask, thin, drop recall), no summary;
- ``summarize`` (or ``drop-oldest``): the deepest fold the protections allow, every foldable
  run replaced by one summary (notice), the cheap layers batched into the same rewrite.

Only options at or under the policy's target are offered (the target stays a promise; dollars
only ever fold deeper), unless none reaches it. The option with the lowest long-run rate wins
(deep and rare beats shallow and frequent), and the visit folds to *its* target when
``choose_fold`` says ``ceiling`` or ``pays``, or is refused as ``would-not-pay``.

**The budget always wins.** The ceiling passed to the cost model is
``max(trigger, limit − g)``, the limit being the pre-send guard's line (budget less its margin;
the budget itself when the policy does not guard): a window whose next call would pass it
(``X + g > ceiling``, i.e. the call after next would pass the limit) folds whatever it costs,
leaving one call of growth for the background fold to land (:func:`ceiling_tokens`).
Overflow and forced visits are never priced (the planner does not call :func:`decide` for
them).

``cold`` (an idle visit: the session was idle longer than its cache's lifetime) prices the fold
without a write premium: its next call rewrites the prefix anyway.

**Through a batch API.** Given :class:`~.batching.BatchTerms` (the runtime offers a provider's
batch API), a fold that can wait for one (:mod:`.batching`: the headroom covers the delay, or
the session is idle; the discount pays for the wait; the fold pays at the batch rate) is
chosen at the batch rate instead, and the choice says ``batch``.

**When the next visit comes.** A priced visit also says when the session is next worth a visit
(:func:`next_trigger_tokens`): the trigger T* of the cycle it chose, the size at which a fold
back to that cycle's target is cheapest per call (after a fold: when to fold next; after
``would-not-pay``: when the fold starts to pay). The store keeps that as the session's trigger,
never above the policy's, so a session whose cost-optimal cycle is shorter than
trigger-to-target (a large budget: waiting for 54 k of a 64 k window costs more in cache reads
than folding at ~20 k costs in cache writes) is folded earlier, and a fold refused as not paying
is not tried again until it would pay. A new session (or one whose policy changed) is first
visited at half the policy's target (:func:`opening_trigger_tokens`): nothing is priced yet,
and that first priced visit names T*; one that finds nothing it could fold yet (its figures say
``nothing-to-price``) sets the next visit at twice its window, up to the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .batching import BatchTerms, batch_pricing, batch_saving, covers_delay
from .cycles import FoldChoice, FoldOption, choose_fold
from .errors import InvalidInputError
from .fold_cost import FoldPricing
from .policy import FoldPolicy
from .window import CompactionRecord

__all__ = ["MIN_HORIZON_CALLS", "NOTHING_TO_PRICE", "BatchTerms", "FoldEconomics", "FoldShape",
           "ceiling_tokens", "decide", "expected_calls_left", "next_trigger_tokens",
           "nothing_to_price", "opening_trigger_tokens"]

#: The ``why`` of a priced visit's figures when no fold was on offer (nothing could fold yet):
#: the record's ``economics`` is then ``{"why": NOTHING_TO_PRICE, "fold": False,
#: "window_tokens": …}``.
NOTHING_TO_PRICE = "nothing-to-price"
#: The fewest calls the age prior expects a session to make from now on (a session's first
#: calls say little about its length).
MIN_HORIZON_CALLS = 8
#: The share of its age a session is expected to live on, for pricing a fold. A session that
#: has lived n calls lives about n more as often as not (the median), but a fold priced on the
#: median loses money on every session that ends sooner; priced on a share q of it, the fold
#: pays back before the session ends with probability about 1/(1 + q) under that prior: 0.33,
#: three times in four. B1 short task sessions (14), sessionfold-sim at 16k/32k/64k: sessions
#: above their own no-compaction cost 3/2/4 at q = 0.5, 2/0/2 at 0.33, 2/0/4 at 0.25 (the
#: totals 0.769/0.856/0.913, 0.763/0.844/0.911, 0.763/0.847/0.947); four standing days at
#: 16k/32k 0.287/0.322 at 0.5, 0.283/0.318 at 0.33.
HORIZON_SHARE = 0.33


def nothing_to_price(window_tokens: float) -> dict[str, object]:
    """The figures of a priced visit that had no fold on offer (see :data:`NOTHING_TO_PRICE`)."""
    return {"why": NOTHING_TO_PRICE, "fold": False, "window_tokens": round(window_tokens)}


@dataclass(frozen=True, slots=True)
class FoldEconomics:
    """What a visit is priced with (given to :func:`~.compact.fold_window`).

    ``cold``: the session's cache has expired (an idle visit). ``growth_tokens``: the window's
    growth per call when the caller knows it; None: the planner takes the mean size of the
    window's most recent turns (one turn is about one call's growth). ``pricing.summarizer`` is
    needed when the policy summarizes (a free summarizer has prices of 0).
    """

    pricing: FoldPricing
    cold: bool = False
    growth_tokens: float | None = None
    #: The calls the session is expected to make from now on (None: unbounded, the long-run
    #: rate decides alone) and how that moves per call (+1 for the age prior, −1 for a count
    #: the agent gave): see :func:`expected_calls_left`.
    remaining_calls: float | None = None
    horizon_growth: float = 1.0
    #: Calls the session makes while one of its background folds runs, from the claim to the
    #: commit (the store's running measure): 1 when a fold lands by the next call, and when
    #: not known yet. The ceiling leaves room for them.
    lag_calls: float = 1.0
    #: A provider's batch API the fold may go through, at its rate, when it can wait for the
    #: answer (:mod:`.batching`); None: the summarizer is called now.
    batch: BatchTerms | None = None


@dataclass(frozen=True, slots=True)
class FoldShape:
    """What one visit could do, in the provider's tokens (the planner measures it).

    ``cheap_tokens``: the window after every cheap layer of the policy (None: none applies).
    ``folded_tokens``: after those and folding every foldable run (None: no folding layer, or
    nothing to fold). ``summary_tokens``: the summaries that fold writes (0: notices, free).
    ``summarized_fraction``: the share of the removed tokens the summarizer reads.
    """

    window_tokens: int
    head_tokens: int
    growth_tokens: float
    cheap_tokens: int | None = None
    folded_tokens: int | None = None
    summary_tokens: int = 0
    summarized_fraction: float = 1.0
    fold_label: str = "summarize"


def ceiling_tokens(policy: FoldPolicy, growth_tokens: float, lag_calls: float = 1.0) -> int:
    """The largest window a background fold may wait for: ``limit − lag·g``, at least the
    policy's trigger when folds land by the next call (``lag_calls`` at most 1: the call whose
    report asked for the fold is appended while it runs) and at least its target otherwise.

    A fold decided at X lands ``lag`` calls later, when the window has grown to about
    ``X + lag·g``: it must still be under the limit then, or the requests in between go out
    guarded (B1, folds landing six calls late: the guard's shrinks rewrote the cache on nearly
    every call until the fold landed).

    The limit is the pre-send guard's line (:attr:`~.policy.FoldPolicy.guard_tokens`, the
    budget less its margin) when the policy guards requests, else the budget. A request past
    the guard's line goes out with the cheap layers applied to it alone: its prefix differs from
    the request before, so the whole window is written to the cache again, and the fold that
    lands a call later rewrites it once more. Waiting past that line is never cheaper (B1 at
    16k: 12 of 55 cache breaks were guarded requests just before a fold landed).
    """
    limit = policy.guard_tokens if policy.guard else policy.budget_tokens
    lag = max(1.0, lag_calls) if math.isfinite(lag_calls) else 1.0
    floor = policy.trigger_tokens if lag <= 1.5 else policy.target_tokens
    return max(floor, limit - math.ceil(lag * growth_tokens))


def _options(policy: FoldPolicy, shape: FoldShape) -> list[FoldOption]:
    x = shape.window_tokens
    found: list[FoldOption] = []
    if shape.cheap_tokens is not None and shape.cheap_tokens < x:
        found.append(FoldOption(target_tokens=max(1, shape.cheap_tokens), label="cheap-layers"))
    if shape.folded_tokens is not None and shape.folded_tokens < x:
        target = max(1, shape.folded_tokens)
        found.append(FoldOption(target_tokens=target,
                                summary_tokens=min(shape.summary_tokens, target),
                                summarized_fraction=min(1.0, max(0.0,
                                                                 shape.summarized_fraction)),
                                label=shape.fold_label))
    within = [o for o in found if o.target_tokens <= policy.target_tokens]
    if within:
        return within
    # Nothing reaches the target: the deepest fold there is (the planner does what it can).
    return sorted(found, key=lambda o: o.target_tokens)[:1]


def decide(policy: FoldPolicy, economics: FoldEconomics, shape: FoldShape) -> FoldChoice | None:
    """The cost model's choice for this visit (module doc); None when nothing can be folded."""
    options = _options(policy, shape)
    if not options:
        return None
    if shape.growth_tokens <= 0 or not math.isfinite(shape.growth_tokens):
        raise InvalidInputError(f"growth_tokens must be > 0, got {shape.growth_tokens!r}")
    # The stable head is part of every window the fold leaves (clamped: the shape's figures
    # are estimates, and the cost model refuses a head larger than a target).
    head = max(0, min(shape.head_tokens, shape.window_tokens,
                      *(o.target_tokens for o in options)))
    live = _choose(policy, economics, shape, options, head)
    return _through_batch(policy, economics, shape, options, head, live) or live


def _choose(policy: FoldPolicy, economics: FoldEconomics, shape: FoldShape,
            options: list[FoldOption], head: int, *, lag_calls: float | None = None,
            pricing: FoldPricing | None = None) -> FoldChoice:
    lag = economics.lag_calls if lag_calls is None else lag_calls
    return choose_fold(pricing or economics.pricing, options,
                       window_tokens=max(0, shape.window_tokens),
                       ceiling_tokens=ceiling_tokens(policy, shape.growth_tokens, lag),
                       growth_tokens=shape.growth_tokens, cold=economics.cold,
                       stable_prefix_tokens=head, horizon_calls=economics.remaining_calls,
                       horizon_growth=economics.horizon_growth)


def _through_batch(policy: FoldPolicy, economics: FoldEconomics, shape: FoldShape,
                   options: list[FoldOption], head: int,
                   live: FoldChoice) -> FoldChoice | None:
    """The choice at the batch rate when the fold can wait for a batch API (:mod:`.batching`),
    else None."""
    terms = economics.batch
    pricing = None if terms is None else batch_pricing(economics.pricing)
    if terms is None or pricing is None:
        return None
    x, g = shape.window_tokens, shape.growth_tokens
    # An idle session makes no calls while it waits; a busy one makes the delay's, and the
    # background lag's if that is longer.
    delay = 0.0 if economics.cold else max(terms.delay_calls, economics.lag_calls)
    if not economics.cold and not covers_delay(policy, x, g, delay):
        return None
    batched = _choose(policy, economics, shape, options, head, pricing=pricing,
                      lag_calls=max(delay, economics.lag_calls))
    if batched.why != "pays":
        return None
    saving = batch_saving(economics.pricing, batched.option, x, delay)
    if saving <= 0:
        return None
    if not live.fold and batched.saving_now <= _waiting_reads(economics, batched, x, delay):
        return None  # the cost model would not fold now, and the wait eats what folding saves
    return replace(batched, batch=True, batch_saving=saving,
                   live_trigger_tokens=live.chosen.trigger_tokens)


def _waiting_reads(economics: FoldEconomics, choice: FoldChoice, window: float,
                   delay: float) -> float:
    """What the calls made while a batch answer is awaited read of what the fold removes."""
    removed = max(0.0, window - choice.option.target_tokens)
    return delay * economics.pricing.read * economics.pricing.agent.input_per_token * removed


def expected_calls_left(policy: FoldPolicy, calls: int) -> tuple[float, float]:
    """``(L, growth)``: the calls a session that has made ``calls`` is expected to make from
    now on, and how that moves per call.

    The policy's ``expected_calls`` when the agent gave one (counting down: at least one call
    is left); otherwise the session's own age (a session that has lived n calls is likely to
    live about n more: the usual prior for lifetimes nothing else is known of) times
    :data:`HORIZON_SHARE`, at least :data:`MIN_HORIZON_CALLS`, growing by that share a call."""
    if policy.expected_calls is not None:
        return max(1.0, float(policy.expected_calls - calls)), -1.0
    return max(float(MIN_HORIZON_CALLS), HORIZON_SHARE * calls), HORIZON_SHARE


def opening_trigger_tokens(policy: FoldPolicy) -> int:
    """The trigger of a new session, or of one whose policy just changed.

    ``economics="window"``: the policy's trigger. ``"dollars"``: half the policy's target.
    Nothing has been priced yet, and the cost-optimal cycle is not known before a visit prices
    one: at a large budget it folds far below the target (B1 at 64k: most cycles near 20k, a
    target of 38,400), so waiting for the target, let alone the trigger, leaves a session
    reading up to that much more from the cache on every call until its first fold. A visit
    that is too early costs no summarizer call: the first one is priced like any, folds if that
    pays, and is otherwise refused as ``would-not-pay`` and sets the next visit where the fold
    will (:func:`next_trigger_tokens`); one that finds nothing it could fold yet (everything
    protected) sets the next at twice the window, up to the target.
    """
    if policy.economics != "dollars":
        return policy.trigger_tokens
    return max(1, min(policy.target_tokens, policy.trigger_tokens) // 2)


def next_trigger_tokens(policy: FoldPolicy, record: CompactionRecord) -> int | None:
    """The session's trigger after the visit ``record`` tells of (module doc, "When the next
    visit comes"); None: leave it as it is.

    - a visit that lost its race (``stale``): None, it judged a window that is gone;
    - not priced (``economics="window"``, a forced or overflow visit, no prices): the policy's
      trigger;
    - priced, folded (``pays`` or ``ceiling``): T*, the trigger of the cycle the fold chose
      (the size at which folding back to its target is cheapest per call);
    - priced, ``would-not-pay``: T*, where folding starts to pay;
    - a fold through a batch API (priced at its rate): T* of the cycle at the list price, as
      the next fold is most likely a live one.

    T* is kept as the plan priced it, not moved with the window the fold really left: the next
    visit is priced by the same estimates, so a trigger carried over to a fold that went deeper
    than planned would only bring a visit that is refused as too early. A visit below the
    target that had nothing to price (nothing could fold yet: the window is the protected
    recent turns, or a small head) probes again at twice its window, at most the target, so a
    young session's visits grow geometrically (a few at most). Otherwise (``at-target``,
    nothing could fold) the policy's trigger.

    Always at most the policy's trigger (the budget's promise) and above the size the visit left
    (a session is never due again without growing).
    """
    if record.outcome == "stale":
        return None
    trigger = policy.trigger_tokens
    choice = record.economics
    if policy.economics != "dollars" or not choice:
        return trigger
    if choice.get("why") == NOTHING_TO_PRICE:
        if record.measured_tokens >= policy.target_tokens:
            return trigger
        return min(trigger, policy.target_tokens, max(2 * record.measured_tokens,
                                                      record.measured_tokens + 1))
    chosen = choice.get("chosen") or {}
    why = choice.get("why")
    revisit = choice.get("revisit_tokens")
    if why == "would-not-pay" and isinstance(revisit, int | float) and math.isfinite(revisit):
        # Priced over the session's remaining life: the next look is where the fold would pay
        # before the end, or one call short of the ceiling.
        return min(trigger, max(math.ceil(revisit), record.measured_tokens + 1))
    try:
        cycle_trigger = float(chosen["trigger_tokens"])
        cycle_target = float(chosen["target_tokens"])
    except (KeyError, TypeError, ValueError):
        return trigger
    live = choice.get("live_trigger_tokens")
    if choice.get("batch") and isinstance(live, int | float) and math.isfinite(live):
        # A batch fold was priced at the batch rate; the next fold is most likely a live one,
        # due where the list price puts it.
        cycle_trigger = float(live)
    if not (math.isfinite(cycle_trigger) and math.isfinite(cycle_target)):
        return trigger
    if why in ("pays", "ceiling") and record.outcome == "folded" and cycle_trigger > cycle_target:
        left = record.tokens_after
    elif why == "would-not-pay":
        left = record.measured_tokens
    else:
        return trigger
    return min(trigger, max(math.ceil(cycle_trigger), left + 1))
