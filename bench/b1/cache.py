"""The prompt-cache model and the prices B1 bills with.

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
from dataclasses import dataclass

from .counting import Unit

__all__ = ["PRICES", "Prices", "common_prefix_tokens"]


@dataclass(frozen=True)
class Prices:
    """Published per-million-token prices (USD): the agent's model and the summarizer's."""

    model: str = "Claude Sonnet 4.5"
    input_per_mtok: float = 3.00
    cache_read_ratio: float = 0.10
    cache_write_ratio: float = 1.25
    summarizer_model: str = "Claude Haiku 4.5"
    summarizer_input_per_mtok: float = 1.00
    summarizer_output_per_mtok: float = 5.00

    def request_dollars(self, tokens: int, cached: int) -> float:
        """One agent request: ``cached`` tokens read from the cache, the rest written to it."""
        written = tokens - cached
        return (cached * self.cache_read_ratio + written * self.cache_write_ratio) \
            * self.input_per_mtok / 1e6

    def summarizer_dollars(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.summarizer_input_per_mtok
                + output_tokens * self.summarizer_output_per_mtok) / 1e6


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
