"""The prompt cache's answer to a request: what it reads and what it writes.

A request reads from the cache the prefix it shares with the previous one and writes the rest,
unless that prefix went unused for longer than the cache's lifetime: then it is cold and the
whole request is written again. Benchmarks bill replayed requests with it
(``docs/cost-model.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import InvalidInputError
from .usage import TTL_SECONDS, CacheTTL, CallTokens, check_tokens, check_ttl

__all__ = ["PrefixCache", "cache_is_cold", "simulate_prefix_cache"]


def cache_is_cold(seconds_since_use: float | None, ttl: CacheTTL = "5m") -> bool:
    """Whether a prefix last used ``seconds_since_use`` ago has expired (None: never cached).

    A prefix unused for longer than the TTL is cold; at exactly the TTL it is still warm. The
    scheduler passes the time since the session's last call (each call refreshes the lifetime).
    """
    limit = TTL_SECONDS[check_ttl(ttl)]
    if seconds_since_use is None:
        return True
    if isinstance(seconds_since_use, bool) or not isinstance(seconds_since_use, int | float) \
            or not math.isfinite(seconds_since_use) or seconds_since_use < 0:
        raise InvalidInputError("seconds_since_use must be a finite number of seconds >= 0 (or "
                                f"None: never cached), got {seconds_since_use!r}")
    return seconds_since_use > limit


@dataclass(frozen=True, slots=True)
class PrefixCache:
    """What a request reads from the prompt cache and what it writes to it."""

    read: int
    written: int
    cold: bool
    ttl: CacheTTL

    def call_tokens(self, *, output: int = 0) -> CallTokens:
        """The request as billed tokens (the writes at this simulation's lifetime)."""
        return CallTokens.predicted(read=self.read, written=self.written, output=output,
                                    ttl=self.ttl)


def simulate_prefix_cache(*, previous_tokens: int, request_tokens: int,
                          common_prefix_tokens: int, seconds_since_use: float | None,
                          ttl: CacheTTL = "5m") -> PrefixCache:
    """The cache's answer to a request, given the previous request of the same session.

    The previous request (``previous_tokens`` long, cached up to its end) was last used
    ``seconds_since_use`` ago (None: there was none). The new request is ``request_tokens`` long
    and shares its first ``common_prefix_tokens`` with it. Warm: the shared prefix is read and the
    rest written. Cold (unused for longer than the TTL, or nothing cached): the whole request is
    written again::

        simulate_prefix_cache(previous_tokens=40_000, request_tokens=41_000,
                              common_prefix_tokens=40_000, seconds_since_use=10)
        # read 40_000, written 1000
        simulate_prefix_cache(previous_tokens=40_000, request_tokens=41_000,
                              common_prefix_tokens=40_000, seconds_since_use=301)
        # read 0, written 41_000
    """
    previous = check_tokens("previous_tokens", previous_tokens)
    request = check_tokens("request_tokens", request_tokens)
    common = check_tokens("common_prefix_tokens", common_prefix_tokens)
    if common > min(previous, request):
        raise InvalidInputError(
            f"common_prefix_tokens ({common:,}) cannot exceed the previous request "
            f"({previous:,}) or the new one ({request:,})")
    ttl = check_ttl(ttl)
    cold = previous == 0 or cache_is_cold(seconds_since_use, ttl)
    read = 0 if cold else common
    return PrefixCache(read=read, written=request - read, cold=cold, ttl=ttl)
