"""What summarizer calls cost, and what folds are priced with: both from one price table.

The table is :data:`sessionfold.core.prices.DEFAULT_PRICES` with the settings' overrides applied
(``SESSIONFOLD_PRICES``, :meth:`Settings.price_table
<sessionfold.runtime.settings.Settings.price_table>`). The spend cap (:mod:`.spend`) and the
metrics (``summarizer_cost_usd_total``) count with :func:`summarizer_cost_usd`; the fold
procedure prices a fold's cache break with :func:`fold_pricing`.

A summarizer model is priced by its own entry, else by its family's
(:func:`~sessionfold.core.prices.summarizer_prices`); the settings refuse any other at start.
A model that still arrives unpriced (a summarizer passed in code, a provider answering with a
name of its own) is counted at the dearest entry of the table, with a warning: a spend cap that
over-counts stops early, one that under-counts lets spend through.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sessionfold.core.errors import InvalidPolicyError
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.core.prices import DEFAULT_PRICES, ModelPrices, prices_for, summarizer_prices
from sessionfold.core.usage import CallTokens
from sessionfold.core.window import SummarizerUsage

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["fold_pricing", "summarizer_cost_usd", "summarizer_prices"]

log = logging.getLogger(__name__)

#: Unpriced models already warned about in this process (once each, not once per fold).
_warned: set[str] = set()


def summarizer_cost_usd(usage: SummarizerUsage,
                        table: Mapping[str, ModelPrices] = DEFAULT_PRICES) -> float:
    """What ``usage`` costs at its model's prices in ``table``.

    A summarizer's usage is in Anthropic's shape whatever the model (``input_tokens`` exclude
    cache reads and writes); cache writes are priced at the 5-minute lifetime. The part of it
    answered through a batch API (``batch_input_tokens``, ``batch_output_tokens``) is priced at
    the model's batch rate (:meth:`~sessionfold.core.prices.ModelPrices.batched`). Usage of no
    tokens (the offline summarizer's) costs nothing, whatever its model.
    """
    batch_in = min(usage.batch_input_tokens, usage.input_tokens)
    batch_out = min(usage.batch_output_tokens, usage.output_tokens)
    tokens = CallTokens(
        uncached=usage.input_tokens - batch_in, cache_read=usage.cache_read_input_tokens,
        cache_write_5m=usage.cache_creation_input_tokens,
        output=usage.output_tokens - batch_out)
    batched = CallTokens(uncached=batch_in, output=batch_out)
    if not (tokens.prompt or tokens.output or batched.prompt or batched.output):
        return 0.0
    prices = _prices_counted(usage.model, table)
    return prices.cost(tokens).total + prices.batched().cost(batched).total


def _prices_counted(model: str, table: Mapping[str, ModelPrices]) -> ModelPrices:
    try:
        return summarizer_prices(model, table)
    except InvalidPolicyError:
        dearest = max(table.values(), key=lambda p: (p.output_per_mtok, p.input_per_mtok))
        if model not in _warned:
            _warned.add(model)
            log.warning("summarizer model %r has no prices: counted at the dearest in the table "
                        "($%g in, $%g out per million tokens); add it to SESSIONFOLD_PRICES",
                        model, dearest.input_per_mtok, dearest.output_per_mtok)
        return dearest


def fold_pricing(settings: Settings) -> FoldPricing:
    """What background folds are priced with (policy ``economics="dollars"``): the agents'
    model, the summarizer's (its entry or its family's; free when it is the offline one) and
    the cache's lifetime, all from the settings' one price table."""
    table = settings.price_table()
    summarizer = (ModelPrices(input_per_mtok=0, output_per_mtok=0)
                  if settings.summarizer_kind == "offline"
                  else summarizer_prices(settings.summarizer_model, table))
    return FoldPricing(agent=prices_for(settings.agent_model, table), summarizer=summarizer,
                       ttl=settings.cache_ttl)
