"""Guards on the summarizer so that a storm of fold jobs does not become a bill.

- :class:`SummarizerSlots`: a global cap on summarizer calls in flight across every worker, a
  counting semaphore in Redis (a sorted set of holders scored by when their slot expires). A
  holder that dies without releasing loses its slot at expiry, so a crashed worker cannot shrink
  the cap for good. Acquiring and expiring happen in one Lua script: a get-then-set from two
  workers could both see a free slot.
- :class:`GatedSummarizer`: any summarizer, each call made while holding a slot. Fold jobs
  that find no free slot in time fail with :class:`TransientSummarizerError` and are retried
  by Celery with backoff, instead of queueing up inside workers.
- :class:`SpendCap`: what the summarizer spent on one session (USD, in Redis); past the cap the
  task folds with the free layers only (masking, dropping thinking) and says so.

Redis errors enter as :class:`RedisUnavailableError` (mapped in :mod:`.redis_conn`).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sessionfold.core.errors import TransientSummarizerError
from sessionfold.core.messages import Message
from sessionfold.core.summarizers import Summarizer, Summary
from sessionfold.core.window import SummarizerUsage

from .redis_conn import mapped_errors

if TYPE_CHECKING:
    import redis

__all__ = ["GatedSummarizer", "SpendCap", "SummarizerSlots", "summarizer_cost_usd"]

log = logging.getLogger(__name__)

# KEYS[1] the slots zset; ARGV: now_ms, expires_ms, limit, holder, key ttl ms.
# Drops expired holders, then takes a slot if one is free. Returns 1 on success.
_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return 1
end
return 0
"""

#: USD per million tokens: (input, output). Cache reads cost 0.1× input, 5-minute writes 1.25×.
_PRICES: tuple[tuple[str, float, float], ...] = (
    ("haiku", 1.0, 5.0),
    ("sonnet", 3.0, 15.0),
    ("opus", 15.0, 75.0),
)
_DEFAULT_PRICE = (1.0, 5.0)


def summarizer_cost_usd(usage: SummarizerUsage) -> float:
    """What ``usage`` costs at Anthropic's list prices for the model family (Haiku if unknown)."""
    name = usage.model.lower()
    price_in, price_out = next(((i, o) for family, i, o in _PRICES if family in name),
                               _DEFAULT_PRICE)
    tokens_in = (usage.input_tokens + 0.1 * usage.cache_read_input_tokens
                 + 1.25 * usage.cache_creation_input_tokens)
    return (tokens_in * price_in + usage.output_tokens * price_out) / 1e6


class SummarizerSlots:
    """At most ``limit`` summarizer calls in flight across all workers.

    ``ttl_s`` bounds how long one holder keeps its slot if it never releases (set it to the
    summarizer's timeout plus a margin). ``wait_s`` is how long :meth:`hold` waits for a slot
    before giving up with TransientSummarizerError (retry_after = ``retry_after_s``).
    """

    def __init__(self, client: redis.Redis, key: str, limit: int, *, ttl_s: float,
                 wait_s: float = 5.0, retry_after_s: float = 5.0) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._client = client
        self._key = key
        self.limit = limit
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self._acquire = client.register_script(_ACQUIRE)

    def try_acquire(self) -> str | None:
        """Take a slot now: its holder token, or None when all are taken."""
        holder = uuid.uuid4().hex
        now_ms = int(time.time() * 1000)
        # Scores are wall-clock milliseconds of the workers; hosts' clocks only need to agree
        # to well within ttl_s for expiry to be fair.
        with mapped_errors("taking a summarizer slot"):
            got = self._acquire(keys=[self._key], args=[
                now_ms, now_ms + int(self.ttl_s * 1000), self.limit, holder,
                int(self.ttl_s * 2000)])
        return holder if got == 1 else None

    def release(self, holder: str) -> None:
        with mapped_errors("releasing a summarizer slot"):
            self._client.zrem(self._key, holder)

    def in_flight(self) -> int:
        """Live holders now (expired ones not counted)."""
        with mapped_errors("counting summarizer slots"):
            return int(self._client.zcount(self._key, int(time.time() * 1000), "+inf"))

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold a slot for the block; TransientSummarizerError if none frees up in ``wait_s``."""
        deadline = time.monotonic() + self.wait_s
        holder = self.try_acquire()
        while holder is None:
            if time.monotonic() >= deadline:
                raise TransientSummarizerError(
                    f"all {self.limit} summarizer slots are busy; try again later",
                    retry_after=self.retry_after_s)
            time.sleep(random.uniform(0.02, 0.1))  # jitter: waiting workers do not poll in step
            holder = self.try_acquire()
        try:
            yield
        finally:
            try:
                self.release(holder)
            except Exception:  # the slot expires by itself; the summary is already paid for
                log.warning("could not release summarizer slot %s; it expires in %.0f s",
                            holder, self.ttl_s, exc_info=True)


class GatedSummarizer:
    """A summarizer whose every call holds one of the global :class:`SummarizerSlots`."""

    def __init__(self, inner: Summarizer, slots: SummarizerSlots) -> None:
        self.inner = inner
        self.slots = slots
        self.model = inner.model
        self.context_tokens = inner.context_tokens

    def __repr__(self) -> str:
        return f"GatedSummarizer({self.inner!r}, limit={self.slots.limit})"

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        with self.slots.hold():
            return self.inner.summarize(messages, previous_summary=previous_summary,
                                        must_keep=must_keep)


class SpendCap:
    """What the summarizer spent per session (USD), against an optional cap.

    Counted in Redis with ``INCRBYFLOAT``; the key expires ``ttl_s`` after the session's last
    paid fold, so an idle session's count does not stay for ever. With ``cap_usd`` None nothing
    is checked, but spend is still counted (operators can read it).
    """

    def __init__(self, client: redis.Redis, cap_usd: float | None, *, ttl_s: float) -> None:
        self._client = client
        self.cap_usd = cap_usd
        self.ttl_s = ttl_s

    def spent(self, key: str) -> float:
        with mapped_errors("reading a session's summarizer spend"):
            raw = self._client.get(key)
        return float(raw) if raw is not None else 0.0

    def exhausted(self, key: str) -> bool:
        return self.cap_usd is not None and self.spent(key) >= self.cap_usd

    def add(self, key: str, usage: SummarizerUsage) -> None:
        """Add what ``usage`` cost (nothing to write for a free summarizer)."""
        cost = summarizer_cost_usd(usage)
        if cost <= 0:
            return
        with mapped_errors("counting a session's summarizer spend"):
            pipe = self._client.pipeline()
            pipe.incrbyfloat(key, cost)
            pipe.expire(key, int(self.ttl_s))
            pipe.execute()
