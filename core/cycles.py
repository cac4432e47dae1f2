"""The cost rate of folding from a trigger T down to a target W, and the choice of fold.

Folding every ``n = (T − W)/g`` calls (g: the window's growth per call; the other letters as in
``docs/cost-model.md``) costs, per call::

    ρ(n) = a/n + b + c·n
    a = (w − r)·(W − H)·p + (σ_in + σ_out)·s        one fold's fixed price (s: summary tokens)
    b = (r·W + w·g − r·g/2)·p + σ_in·f·g            per call (f: share of S the summarizer reads)
    c = r·g·p / 2                                   the growing window, read once per call

The best cycle is ``n* = √(a/c)`` (the economic-order-quantity rule), clamped to what fits under
the ceiling: deep and rare beats shallow and frequent. :func:`choose_fold` picks the target with
the lowest rate and says whether folding now pays against folding later (``would-not-pay``
otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self

from pydantic import model_validator

from .errors import InvalidInputError
from .fold_cost import FoldPricing
from .prices import SettingsValue
from .usage import check_tokens

__all__ = [
    "ChoiceReason",
    "CycleRate",
    "FoldChoice",
    "FoldOption",
    "best_cycle",
    "calls_between_folds",
    "choose_fold",
    "cycle_rate",
]


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def calls_between_folds(*, trigger_tokens: float, target_tokens: float,
                        growth_tokens: float) -> float:
    """``(T − W)/g``: the calls a window takes to grow from the target back to the trigger."""
    g = _positive("growth_tokens", growth_tokens)
    if trigger_tokens < target_tokens:
        raise InvalidInputError(f"trigger_tokens ({trigger_tokens:,}) is below target_tokens "
                                f"({target_tokens:,})")
    return (trigger_tokens - target_tokens) / g


class FoldOption(SettingsValue):
    """One way to fold: the window it leaves, and what its summary costs.

    ``summary_tokens`` (s) is the summary the fold writes (part of the target); 0 means no
    summarizer call (masking, thinning, dropping: free). ``summarized_fraction`` (f) is the share
    of the removed tokens the summarizer reads (the rest is masked or dropped); its input is
    ``f·S + s`` (the span, and the previous summary rolled in) and its output ``s``::

        FoldOption(target_tokens=38_000, label="mask-tool-results")
        FoldOption(target_tokens=16_000, summary_tokens=2000, label="summarize")
    """

    target_tokens: int
    summary_tokens: int = 0
    summarized_fraction: float = 1.0
    label: str = ""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.target_tokens < 1:
            raise ValueError(f"target_tokens must be >= 1, got {self.target_tokens}")
        if not 0 <= self.summary_tokens <= self.target_tokens:
            raise ValueError("summary_tokens must be in [0, target_tokens] (the summary is part "
                             f"of the window), got {self.summary_tokens}")
        if not 0 <= self.summarized_fraction <= 1:
            raise ValueError(
                f"summarized_fraction must be in [0, 1], got {self.summarized_fraction}")
        return self

    @property
    def calls_summarizer(self) -> bool:
        return self.summary_tokens > 0


@dataclass(frozen=True, slots=True)
class CycleRate:
    """The cost rate of a policy: fold to ``option.target_tokens`` every ``calls`` calls.

    ``rate = a/calls + b + c·calls`` dollars per call (``fold_fixed`` = a, ``per_call`` = b,
    ``growth_cost`` = c; module doc). ``trigger_tokens = target + calls·growth``. ``feasible`` is
    False when not even one call of growth fits between the target and the ceiling (the figures
    are then those of folding after every call).
    """

    option: FoldOption
    trigger_tokens: float
    growth_tokens: float
    calls: float
    fold_fixed: float
    per_call: float
    growth_cost: float
    feasible: bool = True

    @property
    def rate(self) -> float:
        return self.fold_fixed / self.calls + self.per_call + self.growth_cost * self.calls

    @property
    def cycle_dollars(self) -> float:
        """One whole cycle: its calls' input and its fold."""
        return self.rate * self.calls

    def extra_cost(self, calls: float) -> float:
        """Dollars lost by ending one cycle after ``calls`` calls instead of ``self.calls``.

        ``E(n) = a + b·n + c·n² − rate·n``: the cost of an n-call cycle less what n calls cost at
        this rate. ``E(self.calls) = 0``; at the unclamped optimum ``E(n) = c·(n − n*)²``.
        """
        n = float(calls)
        return self.fold_fixed + self.per_call * n + self.growth_cost * n * n - self.rate * n

    def to_json(self) -> dict[str, Any]:
        return {"target_tokens": self.option.target_tokens, "label": self.option.label,
                "summary_tokens": self.option.summary_tokens,
                "trigger_tokens": self.trigger_tokens, "calls": self.calls,
                "rate": self.rate, "feasible": self.feasible}


def _coefficients(pricing: FoldPricing, option: FoldOption, growth: float,
                  head: int) -> tuple[float, float, float]:
    """(a, b, c) of ``ρ(n) = a/n + b + c·n`` for ``option`` at ``growth`` tokens per call."""
    if head > option.target_tokens:
        raise InvalidInputError(
            f"stable_prefix_tokens ({head:,}) is part of every window: it cannot exceed the "
            f"target ({option.target_tokens:,}{_label(option)})")
    p, r, w = pricing.agent.input_per_token, pricing.read, pricing.write
    target = option.target_tokens
    a = (w - r) * (target - head) * p
    b = (r * target + w * growth - r * growth / 2) * p
    c = r * growth * p / 2
    if option.calls_summarizer:
        if pricing.summarizer is None:
            raise InvalidInputError(f"the option{_label(option)} writes a summary: "
                                    "FoldPricing.summarizer is needed to price it")
        s_in = pricing.summarizer.input_per_token
        a += (s_in + pricing.summarizer.output_per_token) * option.summary_tokens
        b += s_in * option.summarized_fraction * growth
    return a, b, c


def _label(option: FoldOption) -> str:
    return f" {option.label!r}" if option.label else ""


def _option(option: FoldOption | int) -> FoldOption:
    if isinstance(option, FoldOption):
        return option
    if isinstance(option, bool) or not isinstance(option, int):
        raise InvalidInputError(f"a fold option is a FoldOption or a target in tokens, got "
                                f"{option!r}")
    return FoldOption(target_tokens=option)


def cycle_rate(pricing: FoldPricing, option: FoldOption | int, *, trigger_tokens: float,
               growth_tokens: float, stable_prefix_tokens: int = 0) -> CycleRate:
    """The cost rate of folding from ``trigger_tokens`` (T) down to the option's target (W).

    ``n = (T − W)/g`` calls per cycle must be at least 1. Hand-checked example (Sonnet 4.5,
    5 minutes, W = 10k, T = 20k, g = 1k, no summarizer): a cycle costs
    ``(1.25·10k + 0.1·9·10k + 1.25·1k·10 + 0.1·1k·45)·3e-6 = $0.1155``, a rate of $0.01155.
    """
    opt = _option(option)
    g = _positive("growth_tokens", growth_tokens)
    head = check_tokens("stable_prefix_tokens", stable_prefix_tokens)
    n = calls_between_folds(trigger_tokens=trigger_tokens, target_tokens=opt.target_tokens,
                            growth_tokens=g)
    if n < 1 - 1e-9:  # (the tolerance: a trigger of target + growth, rounded, is one call)
        raise InvalidInputError(
            f"trigger_tokens ({trigger_tokens:,}) leaves less than one call of growth ({g:,}) "
            f"above the target ({opt.target_tokens:,})")
    n = max(n, 1.0)
    a, b, c = _coefficients(pricing, opt, g, head)
    return CycleRate(option=opt, trigger_tokens=opt.target_tokens + n * g, growth_tokens=g,
                     calls=n, fold_fixed=a, per_call=b, growth_cost=c)


def best_cycle(pricing: FoldPricing, option: FoldOption | int, *, ceiling_tokens: int,
               growth_tokens: float, stable_prefix_tokens: int = 0) -> CycleRate:
    """The cheapest cycle for ``option``: the trigger that minimises its rate, up to the ceiling.

    ``n* = √(a/c)`` clamped to ``[1, (ceiling − W)/g]`` (``n_max`` when reads are free, c = 0).
    ``ceiling_tokens`` is the largest window a call may send: the policy's trigger when folds run
    in the background (so they land before the budget), else the budget.
    """
    opt = _option(option)
    g = _positive("growth_tokens", growth_tokens)
    ceiling = check_tokens("ceiling_tokens", ceiling_tokens)
    head = check_tokens("stable_prefix_tokens", stable_prefix_tokens)
    a, b, c = _coefficients(pricing, opt, g, head)
    most = (ceiling - opt.target_tokens) / g
    if most < 1:
        n = 1.0
    elif c <= 0:
        n = most
    else:
        n = min(max(math.sqrt(a / c), 1.0), most)
    return CycleRate(option=opt, trigger_tokens=opt.target_tokens + n * g, growth_tokens=g,
                     calls=n, fold_fixed=a, per_call=b, growth_cost=c, feasible=most >= 1)


#: Why :func:`choose_fold` decided as it did. ``ceiling``: fold, the next call would pass the
#: ceiling. ``pays``: fold, now is cheaper than later. ``would-not-pay``: wait, folding later is
#: cheaper (record it as a refusal). ``at-target``: wait, the window is already at or under the
#: chosen target.
ChoiceReason = Literal["ceiling", "pays", "would-not-pay", "at-target"]


@dataclass(frozen=True, slots=True)
class FoldChoice:
    """The planner's cost answer: which option, fold now or wait, and the figures behind it.

    ``chosen`` is the candidate with the lowest long-run rate (its cost-optimal cycle);
    ``saving_now`` the dollars folding now saves against folding at ``chosen.trigger_tokens``
    (at least one call later), cold-cache bonus included — negative: it would not pay.
    """

    why: ChoiceReason
    window_tokens: int
    cold: bool
    chosen: CycleRate
    saving_now: float
    candidates: tuple[CycleRate, ...]
    #: The calls the session is expected to make from now on (None: not bounded, the long-run
    #: rate decides); when it is shorter than the chosen cycle, the fold is priced over it.
    horizon_calls: float | None = None
    #: ``would-not-pay`` only: the window at which folding is next worth a look (None: at the
    #: chosen cycle's trigger).
    revisit_tokens: float | None = None
    #: The fold goes through the provider's batch API (priced at its rate; see
    #: :mod:`.batching`), and :attr:`batch_saving` is what that saves against folding now.
    batch: bool = False
    batch_saving: float | None = None
    #: A batch fold's: the trigger of the cycle priced at the list price, where the session's
    #: next fold (most likely a live one) is due (:func:`~.economics.next_trigger_tokens`).
    live_trigger_tokens: float | None = None

    @property
    def fold(self) -> bool:
        return self.why in ("ceiling", "pays")

    @property
    def option(self) -> FoldOption:
        return self.chosen.option

    @property
    def refusal(self) -> Literal["would-not-pay"] | None:
        """The refusal reason to record when the choice is not to fold for money."""
        return "would-not-pay" if self.why == "would-not-pay" else None

    @property
    def short_horizon(self) -> bool:
        """The session is expected to end before the chosen cycle would complete."""
        return self.horizon_calls is not None and self.horizon_calls < self.chosen.calls

    def explain(self) -> str:
        """One sentence with the numbers, for the record and the logs."""
        said = self._explain()
        if self.batch and self.batch_saving is not None:
            said += (f"; through the batch API, which saves {_usd(self.batch_saving)} against "
                     "calling the summarizer now")
        return said

    def _explain(self) -> str:
        c, x = self.chosen, self.window_tokens
        target = f"{c.option.target_tokens:,}{_label(c.option)}"
        cycle = (f"best rate {_usd(c.rate)}/call folding at {c.trigger_tokens:,.0f} every "
                 f"{c.calls:.1f} calls; cache {'cold' if self.cold else 'warm'}")
        if self.short_horizon:
            cycle += f"; about {self.horizon_calls:.0f} calls left in the session"
            if self.why == "would-not-pay":
                return (f"would-not-pay: folding the {x:,}-token window to {target} costs "
                        f"{_usd(-self.saving_now)} more than it saves before the session "
                        f"ends ({cycle})")
            if self.why == "pays":
                return (f"pays: folding the {x:,}-token window to {target} saves "
                        f"{_usd(self.saving_now)} before the session ends ({cycle})")
        if self.why == "at-target":
            return f"at-target: the window ({x:,}) is at or under the target {target} ({cycle})"
        if self.why == "ceiling":
            return (f"ceiling: the next call ({x:,} + {c.growth_tokens:,.0f}) would pass the "
                    f"ceiling; fold to {target} ({cycle})")
        if self.why == "pays":
            return (f"pays: folding the {x:,}-token window to {target} now saves "
                    f"{_usd(self.saving_now)} against folding later ({cycle})")
        return (f"would-not-pay: folding the {x:,}-token window to {target} now costs "
                f"{_usd(-self.saving_now)} more than folding at {c.trigger_tokens:,.0f} "
                f"({cycle})")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "why": self.why, "fold": self.fold, "window_tokens": self.window_tokens,
            "cold": self.cold, "saving_now": self.saving_now, "chosen": self.chosen.to_json(),
            "candidates": [c.to_json() for c in self.candidates], "explain": self.explain()}
        if self.horizon_calls is not None:
            data["horizon_calls"] = self.horizon_calls
        if self.revisit_tokens is not None:
            data["revisit_tokens"] = self.revisit_tokens
        if self.batch:
            data["batch"] = True
            data["batch_saving"] = self.batch_saving
            data["live_trigger_tokens"] = self.live_trigger_tokens
        return data


def _usd(dollars: float) -> str:
    return f"${dollars:.3g}"


def choose_fold(pricing: FoldPricing, options: Sequence[FoldOption | int], *, window_tokens: int,
                ceiling_tokens: int, growth_tokens: float, cold: bool = False,
                stable_prefix_tokens: int = 0, horizon_calls: float | None = None,
                horizon_growth: float = 1.0) -> FoldChoice:
    """Choose the fold target with the lowest cost, and whether to fold now.

    Each option gets its cost-optimal cycle (:func:`best_cycle`); the lowest rate among those
    that fit under the ceiling wins (ties: the first listed; if none fits, the lowest of all).
    Then, with the window at X and ``n = (X − W)/g`` calls of growth above the target:

    - ``X <= W``: ``at-target``;
    - ``X + g > ceiling``: ``ceiling`` (fold whatever it costs);
    - else fold now iff ``saving_now = E(max(n*, n + 1)) − E(n) + cold bonus > 0`` (``pays``),
      where the cold bonus ``(w − r)·(X − H)·p`` is the prefix the next call rewrites anyway;
      otherwise ``would-not-pay``.

    **A short life.** ``horizon_calls`` (L) is the calls the session is expected to make from
    now on; when L is shorter than the chosen cycle, a fold is priced over the calls left, not
    over a long run of cycles: the options are compared by one fold and L calls after it
    (``a + b·L + c·L²``), and when waiting L calls would not reach the ceiling, the fold is made
    only if it saves more than it costs before the session ends,
    ``saving_now = L·r·(X − W)·p − a − σ_in·f·g·L`` (plus the cold bonus): a session about to end
    is not folded to save reads it will never make. (When the ceiling comes first, a fold is
    coming anyway and the long-run timing rule above decides.) ``horizon_growth`` is how L
    moves per call from here: +1 when L is the session's age (a session that has lived n calls
    is expected to live about n more), −1 when it counts down to a number the agent gave; it
    sets where a refused fold is next worth a look (:attr:`FoldChoice.revisit_tokens`).

    With a warm cache a window at least one call below the optimal trigger never pays; a cold
    one usually does (fold idle sessions before they wake). For a continuous range of targets
    with the same summary terms pass its low end: the rate never falls as the target rises
    (``a``, ``b`` grow with W and the room for cycles shrinks).
    """
    if isinstance(options, str | bytes) or not isinstance(options, Sequence) or not options:
        raise InvalidInputError("choose_fold needs at least one fold option (a FoldOption or a "
                                "target in tokens)")
    window = check_tokens("window_tokens", window_tokens)
    head = check_tokens("stable_prefix_tokens", stable_prefix_tokens)
    ceiling = check_tokens("ceiling_tokens", ceiling_tokens)
    g = _positive("growth_tokens", growth_tokens)
    horizon = None if horizon_calls is None else _positive("horizon_calls", horizon_calls)
    if head > window:
        raise InvalidInputError(f"stable_prefix_tokens ({head:,}) cannot exceed the window "
                                f"({window:,})")
    candidates = tuple(best_cycle(pricing, _option(o), ceiling_tokens=ceiling, growth_tokens=g,
                                  stable_prefix_tokens=head) for o in options)
    fitting = [c for c in candidates if c.feasible]
    chosen = min(fitting or candidates, key=lambda c: c.rate)
    short = horizon is not None and horizon < chosen.calls
    if short:
        assert horizon is not None
        life = horizon
        chosen = min(fitting or candidates, key=lambda c: _served(c, life))
    target = chosen.option.target_tokens
    bonus = ((pricing.write - pricing.read) * (window - head) * pricing.agent.input_per_token
             if cold else 0.0)
    if window <= target:
        return FoldChoice("at-target", window, bool(cold), chosen, 0.0, candidates, horizon)
    if window + g > ceiling:
        return FoldChoice("ceiling", window, bool(cold), chosen, 0.0, candidates, horizon)
    if short and horizon is not None and window + horizon * g <= ceiling:
        saving = _saving_by_end(pricing, chosen, window, horizon) + bonus
        revisit = None
        if saving <= 0:
            revisit = _revisit(pricing, chosen, window, horizon, horizon_growth, ceiling)
        return FoldChoice("pays" if saving > 0 else "would-not-pay", window, bool(cold), chosen,
                          saving, candidates, horizon, revisit)
    now = (window - target) / g
    saving = chosen.extra_cost(max(chosen.calls, now + 1)) - chosen.extra_cost(now) + bonus
    why: ChoiceReason = "pays" if saving > 0 else "would-not-pay"
    return FoldChoice(why, window, bool(cold), chosen, saving, candidates, horizon)


def _served(cycle: CycleRate, calls: float) -> float:
    """One fold to the cycle's target and ``calls`` calls after it: ``a + b·L + c·L²``."""
    return cycle.fold_fixed + cycle.per_call * calls + cycle.growth_cost * calls * calls


def _saving_by_end(pricing: FoldPricing, cycle: CycleRate, window: float,
                   calls: float) -> float:
    """What folding ``window`` to the cycle's target now saves over the ``calls`` left, against
    never folding: the reads of what it removes, less the fold's fixed price and the
    summarizer's per-call share (the ``a`` and the summarizer part of ``b`` of the cycle)."""
    p, r = pricing.agent.input_per_token, pricing.read
    option = cycle.option
    reads = calls * r * (window - option.target_tokens) * p
    summarizer_per_call = 0.0
    if option.calls_summarizer and pricing.summarizer is not None:
        summarizer_per_call = (pricing.summarizer.input_per_token * option.summarized_fraction
                               * cycle.growth_tokens)
    return reads - cycle.fold_fixed - summarizer_per_call * calls


def _revisit(pricing: FoldPricing, cycle: CycleRate, window: float, horizon: float,
             horizon_growth: float, ceiling: int) -> float:
    """The smallest window, growing by the cycle's g a call (and the horizon by
    ``horizon_growth``), at which :func:`_saving_by_end` turns positive or the ceiling is one
    call away; at most that."""
    g = cycle.growth_tokens
    last = max(window + 1.0, ceiling - g)
    k = 1
    while window + k * g < last:
        left = horizon + horizon_growth * k
        if left <= 0:
            break
        if _saving_by_end(pricing, cycle, window + k * g, left) > 0:
            return window + k * g
        k += 1
    return last
