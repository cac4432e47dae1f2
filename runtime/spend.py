"""What the summarizer spent on each session, against an optional cap: :class:`SpendCap`.

Counted in Redis (USD) under a key per session *incarnation* (:meth:`Keys.summarizer_spend`),
so a session deleted and created again starts at 0. Whether a visit may pay is decided by
:mod:`.summarizer_guard`; what a call costs by :mod:`.prices`. Redis errors enter as
:class:`RedisUnavailableError` (mapped in :mod:`.redis_conn`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sessionfold.core.prices import DEFAULT_PRICES, ModelPrices
from sessionfold.core.window import SummarizerUsage

from .prices import summarizer_cost_usd
from .redis_conn import RedisClient, mapped_errors

if TYPE_CHECKING:
    pass

__all__ = ["SpendCap"]


class SpendCap:
    """What the summarizer spent per session (USD), against an optional cap.

    Counted in Redis with ``INCRBYFLOAT``; the key expires ``ttl_s`` after the session's last
    paid fold, so an idle session's count does not stay for ever. With ``cap_usd`` None nothing
    is checked, but spend is still counted (operators can read it). ``prices``: the settings'
    price table (:meth:`Settings.price_table`).
    """

    def __init__(self, client: RedisClient, cap_usd: float | None, *, ttl_s: float,
                 prices: Mapping[str, ModelPrices] = DEFAULT_PRICES) -> None:
        self._client = client
        self.cap_usd = cap_usd
        self.ttl_s = ttl_s
        self.prices = prices

    def spent(self, key: str) -> float:
        with mapped_errors("reading a session's summarizer spend"):
            raw = self._client.get(key)
        return float(raw) if raw is not None else 0.0

    def exhausted(self, key: str) -> bool:
        return self.cap_usd is not None and self.spent(key) >= self.cap_usd

    def add(self, key: str, usage: SummarizerUsage) -> None:
        """Add what ``usage`` cost (nothing to write for a free summarizer)."""
        cost = summarizer_cost_usd(usage, self.prices)
        if cost <= 0:
            return
        with mapped_errors("counting a session's summarizer spend"):
            pipe = self._client.pipeline()
            pipe.incrbyfloat(key, cost)
            pipe.expire(key, int(self.ttl_s))
            pipe.execute()
