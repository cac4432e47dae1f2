"""Each session's measured size in Redis, compare-and-set by the scheduler (:class:`MeasuredSizes`).

Step 2 of a batch (:mod:`.usage_intake`): every report that is not deferred is compare-and-set
into the session's ``measured`` hash (``born``, ``revision``, ``seq``, ``tokens``) with a Lua
script that mirrors :func:`~sessionfold.core.tokens.supersedes`: an event older than the one
stored never overwrites it, however schedulers interleave (two may briefly read one partition
while its lease changes hands). The same script keeps each session's last call time (the usage
event's ``time``) in its partition's ``last_calls`` sorted set, which the idle sweep reads
(:mod:`.idle_sweep`). One script call per partition: on Redis Cluster a partition's keys share
one hash slot, and a script may not touch keys of two slots. A deferred report only moves its
session's last call time forward (``ZADD GT``, one command per partition).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import RedisClient, mapped_errors
from sessionfold.store.results import SessionGate

from .session_cache import SessionCache
from .usage_consumer import StreamEntry

if TYPE_CHECKING:
    from redis.commands.core import Script

__all__ = ["MEASURED_CAS", "MeasuredSizes"]

# Compare-and-set of the measured size of every session of a batch, in one call. KEYS: the
# sessions' hashes, then the partition's last_calls sorted set. ARGV: one "born revision seq
# tokens time session" string per hash (born: the session's creation time; tokens: the prompt
# size; time: when the call returned; the session id last, as it may hold spaces), then the ttl
# in ms. One string per hash because the client's cost is per argument. The last call's time is kept
# for every event not judged against a stale session ("0" included: an older report is still a
# call), never moved back (ZADD GT). Returns one character per hash:
#   "1"  stored: the event is not older (by revision, then seq) than what the hash holds, or the
#        hash belongs to an earlier session of the same id (deleted and created again: its
#        revisions start over). An equal position counts on purpose: an entry redelivered
#        because its store write failed must reach the store the second time.
#   "0"  older than what the hash holds: ignored.
#   "2"  judged with a creation time older than the hash's: the caller's copy of the session
#        is stale (re-read it); ignored.
# In Lua so each compare and its write are one step however many schedulers race; one call per
# batch because the client's cost is per command, not per key. The ordering is the mirror of
# sessionfold.core.tokens.supersedes (not older by (revision, seq): accepted); change both.
MEASURED_CAS = """
local ttl = ARGV[#ARGV]
local n = #KEYS - 1
local calls = KEYS[#KEYS]
local out = {}
for i = 1, n do
  local key = KEYS[i]
  local sborn, srev, sseq, stok, stime, sid = string.match(ARGV[i],
    '^(%S+) (%d+) (%d+) (%d+) (%S+) (.+)$')
  local born, rev, seq = tonumber(sborn), tonumber(srev), tonumber(sseq)
  local cur = redis.call('HMGET', key, 'born', 'revision', 'seq')
  local verdict = '1'
  if cur[1] then
    local cborn, crev, cseq = tonumber(cur[1]), tonumber(cur[2]), tonumber(cur[3])
    if born < cborn then
      verdict = '2'
    elseif born == cborn and (rev < crev or (rev == crev and seq < cseq)) then
      verdict = '0'
    end
  end
  if verdict == '1' then
    redis.call('HSET', key, 'born', sborn, 'revision', srev, 'seq', sseq, 'tokens', stok)
    redis.call('PEXPIRE', key, ttl)
  end
  if verdict ~= '2' then
    redis.call('ZADD', calls, 'GT', stime, sid)
  end
  out[i] = verdict
end
redis.call('PEXPIRE', calls, ttl)
return table.concat(out)
"""


class MeasuredSizes(SessionCache):
    """The compare-and-set of a batch's measured sizes and the last call times of deferred
    reports (a mixin of :class:`~.scheduler.Scheduler`, which sets up what it reads)."""

    keys: Keys
    _client: RedisClient
    #: Whether ``_client`` is a Redis Cluster client (no pipelined script calls).
    _cluster: bool
    #: :data:`MEASURED_CAS`, registered with ``_client``.
    _cas: Script
    _measured_ttl_ms: int

    def _compare_and_set(self, known: Sequence[tuple[StreamEntry, SessionGate]]
                         ) -> list[StreamEntry]:
        if not known:
            return []
        # One script call per partition: a partition's keys share one Redis Cluster slot.
        groups: dict[int, list[tuple[StreamEntry, SessionGate]]] = {}
        for pair in known:
            groups.setdefault(pair[0].partition, []).append(pair)
        calls: list[tuple[list[str], list[str | int]]] = []
        for group in groups.values():
            keys: list[str] = []
            args: list[str | int] = []
            for entry, info in group:
                ev = entry.event
                keys.append(self.keys.measured(ev.session_id))
                args.append(f"{info.created_at.timestamp()!r} {ev.revision} {ev.seq} "
                            f"{ev.prompt_tokens} {float(ev.time)!r} {ev.session_id}")
            keys.append(self.keys.last_calls(group[0][0].partition))
            args.append(self._measured_ttl_ms)
            calls.append((keys, args))
        with mapped_errors("recording measured sizes"):
            replies = self._run_cas(calls)
        verdicts = b"".join(bytes(r) for r in replies)
        ordered = [pair for group in groups.values() for pair in group]
        accepted = []
        for (entry, _), verdict in zip(ordered, verdicts, strict=True):
            if verdict == ord("1"):
                accepted.append(entry)
            elif verdict == ord("2"):
                self._forget(entry.event.session_id)  # re-read it next time
        return accepted

    def _run_cas(self, calls: Sequence[tuple[list[str], list[str | int]]]) -> list[bytes]:
        if len(calls) == 1 or self._cluster:
            # A cluster pipeline does not load scripts on the nodes it reaches (a restarted
            # node has none): direct calls reload on NOSCRIPT.
            return [self._cas(keys=k, args=a) for k, a in calls]
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            self._cas(keys=keys, args=args, client=pipe)
        return list(pipe.execute())

    def _note_calls(self, entries: Sequence[StreamEntry]) -> None:
        """Move the last call time of deferred reports' sessions forward (``ZADD GT``, one
        command per partition, pipelined): what the idle sweep reads. No compare-and-set: a
        deferred report reaches neither the store nor the session's ``measured`` hash."""
        if not entries:
            return
        calls: dict[int, dict[str, float]] = {}
        for entry in entries:
            calls.setdefault(entry.partition, {})[entry.event.session_id] = float(entry.event.time)
        with mapped_errors("recording the sessions' last calls"):
            pipe = self._client.pipeline(transaction=False)
            for partition, mapping in calls.items():
                pipe.zadd(self.keys.last_calls(partition), mapping, gt=True)
            pipe.execute()
