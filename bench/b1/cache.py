"""The prompt-cache model and the prices B1 bills with (``sessionfold.core.cost``'s).

A standing agent marks the end of every request for caching (Anthropic's 5-minute cache), so the
next request reads from the cache whatever prefix it shares, byte for byte, with the previous one
and writes the rest. B1 therefore bills each request as:

- ``cached`` = the longest common prefix, in tokens, with the previous request of the same
  session (the system prompt, then message after message, then -- inside the first block that
  differs -- the tokens they still share): read at 0.1x the input price;
- the rest: written to the cache at 1.25x the input price.

A fold that rewrites the head of the window therefore turns the next request into a cache
write from the first changed byte on. The 5-minute lifetime never runs out in a replay (calls are
4 s apart in model time), and the 1024-token minimum and the 20-block lookback of the real cache
are not modelled: every system is billed by the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sessionfold.core.cost import CallTokens, ModelPrices, prices_for, summarizer_dollars

from .counting import Unit

__all__ = ["PRICES", "Prices", "common_prefix_tokens"]


@dataclass(frozen=True)
class Prices:
    """What B1 bills with: the agent's model and the summarizer's, as ``sessionfold.core.cost``
    prices them (the one table the planner and the spend cap use: ``DEFAULT_PRICES``).

    ``agent`` / ``summarizer`` are :class:`~sessionfold.core.cost.ModelPrices`; ``model`` and
    ``summarizer_model`` are the names the report prints.
    """

    agent: ModelPrices = field(default_factory=lambda: prices_for("claude-sonnet-4-5"))
    summarizer: ModelPrices = field(default_factory=lambda: prices_for("claude-haiku-4-5"))
    model: str = "Claude Sonnet 4.5"
    summarizer_model: str = "Claude Haiku 4.5"

    @property
    def input_per_mtok(self) -> float:
        return self.agent.input_per_mtok

    @property
    def cache_read_ratio(self) -> float:
        return self.agent.cache_read_multiplier

    @property
    def cache_write_ratio(self) -> float:
        return self.agent.cache_write_5m_multiplier

    def request_dollars(self, tokens: int, cached: int) -> float:
        """One agent request: ``cached`` tokens read from the cache, the rest written to it
        (5-minute lifetime)."""
        return self.agent.cost(CallTokens.predicted(read=cached, written=tokens - cached)).total

    def summarizer_dollars(self, input_tokens: int, output_tokens: int) -> float:
        return summarizer_dollars(self.summarizer, input_tokens=input_tokens,
                                  output_tokens=output_tokens)


PRICES = Prices()


def _shared_ids(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def common_prefix_tokens(previous: Sequence[Unit], current: Sequence[Unit]) -> int:
    """Tokens of ``current`` that repeat ``previous`` from the first byte on.

    Whole units count while their bytes are equal; in the first unit that differs, the token ids
    the two still share from its start count too, and nothing after it.
    """
    total = 0
    for before, now in zip(previous, current, strict=False):
        if before.key == now.key:
            total += now.count
            continue
        total += _shared_ids(before.ids, now.ids)
        break
    return total
