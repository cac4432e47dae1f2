"""The prices B1 bills with: ``sessionfold.core.prices``' table, the one the planner uses.

Kept apart from :mod:`b1.cache` and the replay: the peers replay in virtualenvs of their own,
without sessionfold installed, and record tokens only; every system is priced here, in the
project's process, when the report is made.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sessionfold.core.prices import ModelPrices, prices_for, summarizer_dollars
from sessionfold.core.usage import CallTokens

__all__ = ["PRICES", "Prices"]


@dataclass(frozen=True)
class Prices:
    """What B1 bills with: the agent's model and the summarizer's, as ``sessionfold.core.prices``
    prices them (the one table the planner and the spend cap use: ``DEFAULT_PRICES``).

    ``agent`` / ``summarizer`` are :class:`~sessionfold.core.prices.ModelPrices`; ``model`` and
    ``summarizer_model`` are the names the report prints.
    """

    agent: ModelPrices = field(default_factory=lambda: prices_for("claude-sonnet-4-5"))
    summarizer: ModelPrices = field(default_factory=lambda: prices_for("claude-haiku-4-5"))
    model: str = "Claude Sonnet 4.5"
    summarizer_model: str = "Claude Haiku 4.5"

    def request_dollars(self, tokens: int, cached: int) -> float:
        """One agent request: ``cached`` tokens read from the cache, the rest written to it
        (5-minute lifetime)."""
        return self.agent.cost(CallTokens.predicted(read=cached, written=tokens - cached)).total

    def summarizer_dollars(self, input_tokens: int, output_tokens: int, *,
                           batch: bool = False) -> float:
        """Summarizer calls of these tokens; ``batch``: answered through the provider's batch
        API, at its batch rate (half, for Haiku)."""
        prices = self.summarizer.batched() if batch else self.summarizer
        return summarizer_dollars(prices, input_tokens=input_tokens, output_tokens=output_tokens)

    def calls_dollars(self, calls: Iterable[Mapping[str, Any]]) -> float:
        """The summarizer calls a run recorded (``SystemRun.summarizer_calls``), each at its
        rate."""
        return sum(self.summarizer_dollars(int(c["input_tokens"]), int(c["output_tokens"]),
                                           batch=bool(c.get("batch", False))) for c in calls)


PRICES = Prices()
