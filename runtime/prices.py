"""What summarizer calls cost, and what folds are priced with: both from one price table.

The table is :data:`sessionfold.core.prices.DEFAULT_PRICES` with the settings' overrides applied
(``SESSIONFOLD_PRICES``, :meth:`Settings.price_table
<sessionfold.runtime.settings.Settings.price_table>`). The spend cap (:mod:`.spend`) and the
metrics (``summarizer_cost_usd_total``) count with :func:`summarizer_cost_usd`; the fold
procedure prices a fold's cache break with :func:`fold_pricing`.

A summarizer model the table does not name (exactly, or as a dated snapshot id) is priced as
its family's entry (``haiku`` → ``claude-haiku-4-5``, ``sonnet`` → ``claude-sonnet-4-5``,
``opus`` → ``claude-opus-4-1``), else as Haiku: the spend cap must keep counting when a new
snapshot name appears. Add the model to ``SESSIONFOLD_PRICES`` to price it exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sessionfold.core.errors import InvalidPolicyError
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.core.prices import DEFAULT_PRICES, ModelPrices, prices_for
from sessionfold.core.usage import CallTokens
from sessionfold.core.window import SummarizerUsage

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["fold_pricing", "summarizer_cost_usd", "summarizer_prices"]

#: Model family (a part of the id) → the table entry that prices an unlisted model of it.
_FAMILIES: tuple[tuple[str, str], ...] = (
    ("haiku", "claude-haiku-4-5"),
    ("sonnet", "claude-sonnet-4-5"),
    ("opus", "claude-opus-4-1"),
)
_FALLBACK = "claude-haiku-4-5"


def summarizer_prices(model: str,
                      table: Mapping[str, ModelPrices] = DEFAULT_PRICES) -> ModelPrices:
    """The prices of a summarizer ``model``: its own entry, else its family's (module doc)."""
    try:
        return prices_for(model, table)
    except InvalidPolicyError:
        pass
    name = model.lower()
    entry = next((alias for family, alias in _FAMILIES if family in name), _FALLBACK)
    return table.get(entry) or DEFAULT_PRICES[entry]


def summarizer_cost_usd(usage: SummarizerUsage,
                        table: Mapping[str, ModelPrices] = DEFAULT_PRICES) -> float:
    """What ``usage`` costs at its model's prices in ``table``.

    A summarizer's usage is in Anthropic's shape whatever the model (``input_tokens`` exclude
    cache reads and writes); cache writes are priced at the 5-minute lifetime.
    """
    prices = summarizer_prices(usage.model, table)
    return prices.cost(CallTokens(
        uncached=usage.input_tokens, cache_read=usage.cache_read_input_tokens,
        cache_write_5m=usage.cache_creation_input_tokens, output=usage.output_tokens)).total


def fold_pricing(settings: Settings) -> FoldPricing:
    """What background folds are priced with (policy ``economics="dollars"``): the agents'
    model, the summarizer's (free when it is the offline one) and the cache's lifetime, all
    from the settings' one price table."""
    table = settings.price_table()
    summarizer = (summarizer_prices(settings.summarizer_model, table)
                  if settings.summarizer_kind == "anthropic"
                  else ModelPrices(input_per_mtok=0, output_per_mtok=0))
    return FoldPricing(agent=prices_for(settings.agent_model, table), summarizer=summarizer,
                       ttl=settings.cache_ttl)
