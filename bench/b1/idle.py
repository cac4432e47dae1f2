"""The idle-gap scenario: a standing agent's day, bursts of calls separated by idle gaps.

``idle_gaps(transcript_id, calls)`` cuts a transcript's calls into bursts of 10–30 calls and
puts 10–60 minutes of model time before each burst but the first (deterministic per transcript:
every system sees the same day). The replay bills every system with the same TTL-aware cache:
a call made more than ``CACHE_TTL_S`` (Anthropic's 5 minutes) of model time after the session's
previous call finds its cache expired and writes its whole prompt (1.25×), whatever it shares
with the previous request.

Only the background pipeline depends on the clock (its scheduler folds sessions idle past their
cache's lifetime, ``SESSIONFOLD_CACHE_LIFETIME_S``): its replay sleeps through each gap on the
scaled clock (gap × time scale), with the cache lifetime and the scheduler's sweep scaled the
same way. The other systems do nothing in a gap, so their replays only advance the model clock.
"""

from __future__ import annotations

import random

__all__ = ["BURST_CALLS", "CACHE_TTL_S", "GAP_S", "SWEEP_INTERVAL_S", "idle_gaps"]

#: The prompt cache's lifetime, model seconds (Anthropic's default 5-minute cache).
CACHE_TTL_S = 300.0
#: The scheduler's sweep interval the pipeline's is scaled from (its default, seconds).
SWEEP_INTERVAL_S = 30.0
#: Calls in one burst, inclusive range.
BURST_CALLS = (10, 30)
#: Model seconds of idle time between two bursts, inclusive range (10–60 minutes).
GAP_S = (600.0, 3600.0)


def idle_gaps(transcript_id: str, calls: int) -> dict[int, float]:
    """Call index -> model seconds idle before it (the first call of every burst but the
    first). The same transcript always gets the same day."""
    rng = random.Random(f"b1-idle-gaps:{transcript_id}")
    gaps: dict[int, float] = {}
    at = rng.randint(*BURST_CALLS)
    while at < calls:
        gaps[at] = round(rng.uniform(*GAP_S), 1)
        at += rng.randint(*BURST_CALLS)
    return gaps
