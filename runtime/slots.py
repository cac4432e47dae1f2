"""The global cap on summarizer calls in flight: :class:`SummarizerSlots`, and
:class:`GatedSummarizer`, any summarizer whose every call holds one slot.

- :class:`SummarizerSlots`: a counting semaphore in Redis shared by every worker and every agent
  (a sorted set of holders scored by when their slot expires). A holder that dies without
  releasing loses its slot at expiry, so a crashed worker cannot shrink the cap for good.
  Acquiring and expiring happen in one Lua script: a get-then-set from two workers could both
  see a free slot.
- :class:`GatedSummarizer`: each call made while holding a slot. A call that finds no free slot
  within ``wait_s`` fails with :class:`TransientSummarizerError`: a fold job is then retried by
  Celery with backoff instead of queueing up inside workers, and an inline fold (``wait_s=0``:
  an agent never waits on the cap) records the refusal and folds with the cheap layers.

Which fold may call the summarizer at all is :mod:`.summarizer_guard`'s decision. Redis errors
enter as :class:`RedisUnavailableError` (mapped in :mod:`.redis_conn`).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sessionfold.core.errors import (
    InvalidInputError,
    RedisUnavailableError,
    TransientSummarizerError,
)
from sessionfold.core.messages import Message
from sessionfold.core.summarizers import Summarizer, Summary

from .redis_conn import RedisClient, mapped_errors

if TYPE_CHECKING:
    pass

__all__ = ["GatedSummarizer", "SummarizerSlots"]

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

class SummarizerSlots:
    """At most ``limit`` summarizer calls in flight across all workers and agents.

    ``ttl_s`` bounds how long one holder keeps its slot if it never releases (set it to the
    summarizer's timeout plus a margin). ``wait_s`` is how long :meth:`acquire` waits for a slot
    before giving up with TransientSummarizerError (retry_after = ``retry_after_s``); 0 never
    waits.
    """

    def __init__(self, client: RedisClient, key: str, limit: int, *, ttl_s: float,
                 wait_s: float = 5.0, retry_after_s: float = 5.0) -> None:
        if limit < 1:
            raise InvalidInputError(f"limit must be at least 1, got {limit}")
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

    def acquire(self) -> str:
        """Take a slot, waiting up to ``wait_s``; its holder token. TransientSummarizerError if
        none frees up in time (RedisUnavailableError if Redis cannot be asked)."""
        deadline = time.monotonic() + self.wait_s
        holder = self.try_acquire()
        while holder is None:
            if time.monotonic() >= deadline:
                raise TransientSummarizerError(
                    f"all {self.limit} summarizer slots are busy; try again later",
                    retry_after=self.retry_after_s)
            time.sleep(random.uniform(0.02, 0.1))  # jitter: waiting workers do not poll in step
            holder = self.try_acquire()
        return holder

    def release_quietly(self, holder: str) -> None:
        """Release ``holder``'s slot; a failure is logged (the slot expires by itself)."""
        try:
            self.release(holder)
        except Exception:  # the slot expires by itself; the summary is already paid for
            log.warning("could not release summarizer slot %s; it expires in %.0f s",
                        holder, self.ttl_s, exc_info=True)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold a slot for the block; TransientSummarizerError if none frees up in ``wait_s``."""
        holder = self.acquire()
        try:
            yield
        finally:
            self.release_quietly(holder)


class GatedSummarizer:
    """A summarizer whose every call holds one of the global :class:`SummarizerSlots`.

    ``unavailable_is_transient``: a slot that cannot be taken because Redis is away fails the
    call with :class:`TransientSummarizerError` (a recorded ``summarizer-failed`` refusal, the
    cheap layers kept) instead of :class:`RedisUnavailableError` (which ends the visit). The
    inline fallback sets it: an agent's call must not fail because the cap cannot be read.
    """

    def __init__(self, inner: Summarizer, slots: SummarizerSlots, *,
                 unavailable_is_transient: bool = False) -> None:
        self.inner = inner
        self.slots = slots
        self.unavailable_is_transient = unavailable_is_transient
        self.model = inner.model
        self.context_tokens = inner.context_tokens

    def __repr__(self) -> str:
        return f"GatedSummarizer({self.inner!r}, limit={self.slots.limit})"

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        try:
            holder = self.slots.acquire()
        except RedisUnavailableError as exc:
            if not self.unavailable_is_transient:
                raise
            # Never pay blind: without a slot the summarizer is not called.
            raise TransientSummarizerError(
                f"no summarizer slot could be taken ({exc}); the summarizer is not called "
                "without one") from exc
        try:
            return self.inner.summarize(messages, previous_summary=previous_summary,
                                        must_keep=must_keep)
        finally:
            self.slots.release_quietly(holder)
