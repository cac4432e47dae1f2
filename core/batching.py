"""Folds through a provider's batch API: when a fold can wait for one, and what waiting saves.

Anthropic's Message Batches and OpenAI's Batch API bill a share of the list price
(:attr:`~.prices.ModelPrices.batch_multiplier`, half for both) for an answer that may take
minutes. :func:`~.economics.decide` sends a priced fold there when its
:class:`~.economics.FoldEconomics` carry :class:`BatchTerms` and the fold *can wait*:

- **the headroom covers the delay** (:func:`covers_delay`): growing g tokens a call, the window
  stays under the limit (the pre-send guard's line, else the budget) for the batch's expected
  delay in calls D and one call more, ``X + (D + 1)·g <= limit``; or the session is **idle
  with a cold cache** (an ``idle`` visit): it makes no calls while it waits, and its next call
  rewrites its cache anyway;
- **the discount pays for the wait** (:func:`batch_saving`): until the answer lands every call
  still reads what the fold removes, ``D·r·p·(X − W)``, while the batch saves ``(1 − m)·σ``
  (σ: the fold's summarizer dollars at the list price, ``(σ_in + σ_out)·s + σ_in·f·(X − W)``,
  the cost model's own terms). An idle visit counts no calls of waiting: a session that wakes
  before its answer lands reads the unfolded window meanwhile, the bet an idle batch makes
  (the workers stop waiting once such a session passes its trigger);
- **the fold pays at the batch rate**: priced with the batch's summarizer prices
  (:func:`batch_pricing`) and a ceiling lowered by the delay's growth, the cost model says
  ``pays`` (a ``ceiling`` fold cannot wait).

The choice then says ``batch`` and the planner asks its summary of the visit's batch
summarizer (:attr:`~.compact.FoldVisit.batch_summarizer`). :func:`request_key` names a
summarizer request by its material, so that the answer a batch brings back is matched to the
request the same visit, made again, asks for.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .cycles import FoldOption
from .errors import InvalidInputError
from .fold_cost import FoldPricing
from .messages import Message
from .policy import FoldPolicy
from .summarizers import render_transcript

__all__ = ["BatchTerms", "batch_pricing", "batch_saving", "covers_delay", "request_key",
           "summary_dollars"]


@dataclass(frozen=True, slots=True)
class BatchTerms:
    """A provider's batch API as a visit is priced with it: its answer is expected
    ``delay_calls`` calls of the session after the request (the batch's expected delay times
    the session's call rate; the runtime measures both)."""

    delay_calls: float

    def __post_init__(self) -> None:
        if isinstance(self.delay_calls, bool) or not isinstance(self.delay_calls, int | float) \
                or not math.isfinite(self.delay_calls) or self.delay_calls < 0:
            raise InvalidInputError(f"delay_calls must be a finite number >= 0, got "
                                    f"{self.delay_calls!r}")


def batch_pricing(pricing: FoldPricing) -> FoldPricing | None:
    """``pricing`` with the summarizer billed at its batch rate; None when its batch API gives
    no discount (or there is no summarizer to discount): nothing is worth waiting for."""
    summarizer = pricing.summarizer
    if summarizer is None or summarizer.batch_multiplier >= 1:
        return None
    return pricing.model_copy(update={"summarizer": summarizer.batched()})


def covers_delay(policy: FoldPolicy, window_tokens: float, growth_tokens: float,
                 delay_calls: float) -> bool:
    """Whether a window of ``window_tokens`` growing ``growth_tokens`` a call stays under the
    limit for ``delay_calls`` calls and one more: ``X + (D + 1)·g <= limit``."""
    limit = policy.guard_tokens if policy.guard else policy.budget_tokens
    return window_tokens + (delay_calls + 1) * growth_tokens <= limit


def summary_dollars(pricing: FoldPricing, option: FoldOption, window_tokens: float) -> float:
    """σ: what the summarizer calls of one fold of ``window_tokens`` to ``option`` cost at
    ``pricing``: ``(σ_in + σ_out)·s + σ_in·f·(X − W)`` (0 for an option that writes no
    summary)."""
    prices = pricing.summarizer
    if not option.calls_summarizer or prices is None:
        return 0.0
    removed = max(0.0, window_tokens - option.target_tokens)
    return ((prices.input_per_token + prices.output_per_token) * option.summary_tokens
            + prices.input_per_token * option.summarized_fraction * removed)


def batch_saving(pricing: FoldPricing, option: FoldOption, window_tokens: float,
                 delay_calls: float) -> float:
    """What a fold to ``option`` through the batch API saves against the same fold now, in
    dollars: the discount on its summary, less the reads of what it removes while the answer
    is awaited (``delay_calls`` calls; 0 for an idle session). ``pricing`` is at list price."""
    prices = pricing.summarizer
    if prices is None:
        return 0.0
    discount = (1 - prices.batch_multiplier) * summary_dollars(pricing, option, window_tokens)
    removed = max(0.0, window_tokens - option.target_tokens)
    waiting = delay_calls * pricing.read * pricing.agent.input_per_token * removed
    return discount - waiting


def request_key(messages: Sequence[Message], previous_summary: str | None = None,
                must_keep: Sequence[str] = ()) -> str:
    """A summarizer request named by what it asks (the transcript as the summarizer reads it,
    the summary rolled in, the identifiers to keep), never by a provider's wording or a
    per-call nonce: 64 hex digits, which both batch APIs take as a request's custom id."""
    material = json.dumps([render_transcript(messages), previous_summary or "",
                           list(must_keep)], ensure_ascii=False)
    return hashlib.sha256(material.encode()).hexdigest()
