"""The cost model's old import path, kept for ``runtime/`` and ``workers/`` while they move.

The cost model lives in modules of one idea each: :mod:`.usage` (a call's tokens and the one
reader of a provider's usage), :mod:`.prices` (what models charge, one call's cost),
:mod:`.prefix_cache`, :mod:`.fold_cost` (one fold) and :mod:`.cycles` (the rate of folding and
the choice of fold); ``docs/cost-model.md`` walks through them. Only the names the runtime and
the workers import from here are kept; once their move lands they import the new modules and
this one goes.
"""

from __future__ import annotations

from .fold_cost import FoldPricing
from .prices import DEFAULT_PRICES, ModelPrices, price_table, prices_for
from .usage import TTL_SECONDS, CacheTTL, CallTokens, read_usage

__all__ = [
    "DEFAULT_PRICES",
    "TTL_SECONDS",
    "CacheTTL",
    "CallTokens",
    "FoldPricing",
    "ModelPrices",
    "price_table",
    "prices_for",
    "read_usage",
]
