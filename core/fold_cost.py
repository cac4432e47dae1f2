"""What one fold costs and saves in dollars, against not folding.

A fold breaks the prompt cache: the next call writes the kept window (W) instead of reading it,
and from then on no call reads the removed tokens (S)::

    break premium       (w − r)·(W − H)·p      the cache break on what the fold keeps
    first-call saving   r·S·p                  the removed tokens are not read on the next call
    per-call saving     r·S·p                  ... nor on any later one
    net cost            break premium + σ − first-call saving
    payback             net cost / per-call saving   calls after the first

With a cold cache (idle past its lifetime) the break premium is 0 and the first call saves a
write of S (``w·S·p``): the next call rewrites its prefix anyway. Notation and worked numbers:
``docs/cost-model.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInputError
from .prices import ModelPrices, SettingsValue
from .usage import CacheTTL, check_tokens

__all__ = ["FoldCost", "FoldPricing", "fold_cost"]


class FoldPricing(SettingsValue):
    """What fold economics are priced with: the agent's model, the summarizer's, the cache TTL.

    Built once from settings, e.g.::

        FoldPricing(agent=prices_for("claude-sonnet-4-5"),
                    summarizer=prices_for("claude-haiku-4-5"))

    ``summarizer`` may be None when no option calls one (masking and dropping are free).
    """

    agent: ModelPrices
    summarizer: ModelPrices | None = None
    ttl: CacheTTL = "5m"

    @property
    def read(self) -> float:
        """r: the agent's cache-read multiplier."""
        return self.agent.cache_read_multiplier

    @property
    def write(self) -> float:
        """w: the agent's cache-write multiplier at this TTL (1 without a write premium)."""
        return self.agent.write_multiplier(self.ttl)


@dataclass(frozen=True, slots=True)
class FoldCost:
    """What one fold costs and saves, in dollars, against not folding (see the module doc).

    ``payback_calls`` counts the calls after the first one until the fold has paid for itself
    (0 if its first call already did, ``inf`` if it never does). The issue's example::

        fold_cost(FoldPricing(agent=prices_for("claude-sonnet-4-5")), kept_tokens=38_000,
                  removed_tokens=16_000).payback_calls        # 11.5·38/16 − 1 = 26.3125
    """

    kept_tokens: int
    removed_tokens: int
    cold: bool
    break_premium: float
    first_call_saving: float
    per_call_saving: float
    summarizer: float

    @property
    def net_cost(self) -> float:
        """What the fold costs up to and including its first call: premium + σ − first saving."""
        return self.break_premium + self.summarizer - self.first_call_saving

    @property
    def payback_calls(self) -> float:
        if self.net_cost <= 0:
            return 0.0
        if self.per_call_saving <= 0:
            return math.inf
        return self.net_cost / self.per_call_saving

    def net_saving(self, calls: int) -> float:
        """Dollars saved over ``calls`` calls after the fold (negative: it cost more).

        0 calls: only the summarizer was paid. From the first call on:
        ``(calls − 1)·per_call_saving − net_cost`` (the cache assumed warm after the first).
        """
        n = check_tokens("calls", calls)
        if n == 0:
            return -self.summarizer
        return (n - 1) * self.per_call_saving - self.net_cost


def fold_cost(pricing: FoldPricing, *, kept_tokens: int, removed_tokens: int,
              stable_prefix_tokens: int = 0, cold: bool = False,
              summarizer_dollars: float = 0.0) -> FoldCost:
    """The economics of a fold that leaves ``kept_tokens`` (W) and removes ``removed_tokens`` (S).

    ``stable_prefix_tokens`` (H <= W) stay cached across the fold (the system prompt, tools and
    the items before the fold). ``cold``: the cache expired before the next call (the session was
    idle longer than the TTL), so the break premium is 0 and the first call saves a write of S.
    ``summarizer_dollars`` is σ (see :func:`summarizer_dollars`: input ≈ the folded tokens,
    output ≈ the summary). Formulas in the module doc.
    """
    kept = check_tokens("kept_tokens", kept_tokens)
    removed = check_tokens("removed_tokens", removed_tokens)
    head = check_tokens("stable_prefix_tokens", stable_prefix_tokens)
    if head > kept:
        raise InvalidInputError(f"stable_prefix_tokens ({head:,}) is part of what the fold "
                                f"keeps: it cannot exceed kept_tokens ({kept:,})")
    sigma = _dollars("summarizer_dollars", summarizer_dollars)
    p, r, w = pricing.agent.input_per_token, pricing.read, pricing.write
    return FoldCost(
        kept_tokens=kept, removed_tokens=removed, cold=bool(cold),
        break_premium=0.0 if cold else (w - r) * (kept - head) * p,
        first_call_saving=(w if cold else r) * removed * p,
        per_call_saving=r * removed * p,
        summarizer=sigma,
    )


def _dollars(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"{name} must be a finite number of dollars >= 0, got {value!r}")
    return float(value)
