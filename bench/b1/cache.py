"""The prompt-cache model B1 bills with (the prices are in :mod:`b1.prices`).

A standing agent marks the end of every request for caching (Anthropic's 5-minute cache), so the
next request reads from the cache whatever prefix it shares, byte for byte, with the previous one
and writes the rest. B1 therefore bills each request as:

- ``cached`` = the longest common prefix, in tokens, with the previous request of the same
  session (the system prompt, then message after message, then -- inside the first block that
  differs -- the tokens they still share): read at 0.1x the input price;
- the rest: written to the cache at 1.25x the input price.

A fold that rewrites the head of the window therefore turns the next request into a cache
write from the first changed byte on. The 5-minute lifetime runs out only in the idle-gap
scenario (:mod:`b1.idle`; otherwise calls are 4 s apart in model time), and the 1024-token
minimum and the 20-block lookback of the real cache are not modelled: every system is billed by
the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence

from .counting import Unit

__all__ = ["common_prefix_tokens"]


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
