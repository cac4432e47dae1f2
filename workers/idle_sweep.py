"""The idle sweep: an ``idle`` fold for each session whose prompt cache has gone cold.

The compare-and-set of a usage report (:mod:`.measured_sizes`) also keeps each session's last
call time (the usage event's ``time``) in its partition's ``last_calls`` sorted set, and the
sweep takes the sessions idle longer than ``Settings.cache_cold_after_s`` (``cache_ttl``'s
lifetime, 300 s by default) and enqueues an ``idle`` fold for each one past its policy's idle
trigger (:meth:`FoldPolicy.over_idle_trigger
<sessionfold.core.policy.FoldPolicy.over_idle_trigger>`: ``economics="dollars"`` only). Its next
call rewrites the whole cache anyway, so a fold made now costs no cache break; the job prices it
with a cold cache and folds only if that pays (``would-not-pay`` otherwise). Each session leaves
the set when the sweep has looked at it, and comes back with its next call: one idle visit per
idle gap.
"""

from __future__ import annotations

from collections.abc import Callable

from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import RedisClient, mapped_errors
from sessionfold.runtime.settings import Settings

from .batch_stats import BatchStats
from .fold_enqueue import FoldEnqueue, skip_reason

__all__ = ["IDLE_SWEEP_LIMIT", "IdleSweep"]

#: Idle sessions one sweep looks at per partition (the rest wait for the next sweep).
IDLE_SWEEP_LIMIT = 1000


class IdleSweep(FoldEnqueue):
    """The sweep's look at idle sessions (a mixin of :class:`~.scheduler.Scheduler`, which
    sets up what it reads)."""

    settings: Settings
    keys: Keys
    _client: RedisClient
    _clock: Callable[[], float]

    def _sweep_idle(self, owned: frozenset[int], stats: BatchStats) -> None:
        """Enqueue an ``idle`` fold for each session idle past its cache's lifetime and past
        its idle trigger (see the module doc)."""
        cutoff = self._clock() - self.settings.cache_cold_after_s
        for partition in sorted(owned):
            key = self.keys.last_calls(partition)
            with mapped_errors("reading the sessions' last calls"):
                raw = self._client.zrangebyscore(key, "-inf", cutoff, start=0,
                                                 num=IDLE_SWEEP_LIMIT)
            seen: list[str] = []
            for member in raw:
                sid = member.decode() if isinstance(member, bytes) else str(member)
                info = self._cached_info(sid)
                if info is None or skip_reason(info, trigger="idle") is not None:
                    seen.append(sid)  # gone, paused or small: its next call brings it back
                elif self._try_enqueue(sid, "idle", stats, trigger="idle"):
                    seen.append(sid)  # (a failed enqueue stays for the next sweep)
            if seen:
                with mapped_errors("forgetting the idle sessions seen"):
                    self._client.zrem(key, *seen)
