"""Which scheduler owns which partition: membership, rendezvous assignment and leases in Redis.

Sessions are split into ``Settings.partitions`` partitions (:mod:`sessionfold.runtime.keys`);
each partition's usage stream and sessions are watched by exactly one scheduler at a time, so
that several schedulers share the work instead of repeating it::

    leases = PartitionLeases(client, keys, member="host-1234-ab12", ttl_ms=10_000)
    change = leases.refresh()          # heartbeat, re-assign, take and renew leases
    change.owned                       # frozenset({0, 3, 7, …}): read these streams
    change.lost                        # write out what is pending for these, then release()

How it holds together:

- **Membership.** Each scheduler keeps itself in a sorted set (``keys.schedulers()``) scored
  by the time its heartbeat runs out; every refresh removes members whose time has passed. A
  scheduler that dies simply stops refreshing.
- **Assignment by rendezvous hashing.** Every member computes, for each partition, the member
  with the highest hash of ``(member, partition)``; that member is the partition's *intended*
  owner. All members compute the same answer from the same set, and a member joining or
  leaving moves only the partitions it wins or held (about 1/n of them), not a reshuffle.
- **Leases decide, not the assignment.** A member reads a partition only while it holds that
  partition's lease: ``SET lease member NX PX ttl``, renewed by a compare-and-expire script.
  Two members with different views of the set (one has not seen a join yet) can both *want* a
  partition, but only one holds its lease; the other waits until the holder lets it go
  (:meth:`PartitionLeases.release`, after writing out its pending work) or dies and the lease
  expires. A lease lost to expiry is noticed at the next refresh (its renewal fails).
- **What is never lost.** A scheduler acknowledges a usage entry only once its value is in the
  store; entries it read but did not acknowledge (killed mid-batch) stay pending in the
  partition's consumer group and the next owner takes them over with ``XAUTOCLAIM``.

The lease only keeps schedulers from doing the same work twice; correctness still comes from
the compare-and-set of measured sizes, the fold lock and the store's claim, as before.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from sessionfold.core.errors import InvalidInputError
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import RedisClient, mapped_errors

__all__ = ["LeaseChange", "PartitionLeases", "rendezvous_owner"]

# Renew only if we still hold it; returns 1 when renewed.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Release only if we still hold it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def rendezvous_owner(partition: int, members: list[str]) -> str | None:
    """The member with the highest hash of ``(member, partition)``: highest random weight.

    Deterministic across processes (BLAKE2b, not Python's salted ``hash``).
    """
    best: tuple[bytes, str] | None = None
    for member in members:
        weight = hashlib.blake2b(f"{partition}\x00{member}".encode(), digest_size=8).digest()
        if best is None or (weight, member) > best:
            best = (weight, member)
    return None if best is None else best[1]


@dataclass(frozen=True, slots=True)
class LeaseChange:
    """What one :meth:`PartitionLeases.refresh` found."""

    #: Partitions this member holds the lease of now.
    owned: frozenset[int]
    #: Partitions newly held since the last refresh (take over their pending entries).
    gained: frozenset[int]
    #: Partitions held before and not now: assigned to another member (write out their work,
    #: then :meth:`PartitionLeases.release`) or lost to expiry (already another's).
    lost: frozenset[int]
    #: The live members seen, sorted.
    members: tuple[str, ...]


class PartitionLeases:
    """One scheduler's membership and partition leases. Not thread-safe."""

    def __init__(self, client: RedisClient, keys: Keys, *, member: str, ttl_ms: int,
                 clock: Callable[[], float] = time.time) -> None:
        if ttl_ms <= 0:
            raise InvalidInputError(f"the lease time must be positive, got {ttl_ms} ms")
        self._client = client
        self._keys = keys
        self.member = member
        self.ttl_ms = ttl_ms
        self._clock = clock
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self.owned: frozenset[int] = frozenset()
        self._next_refresh = 0.0

    def due(self) -> bool:
        """True when a refresh is due (every third of the lease time)."""
        return time.monotonic() >= self._next_refresh

    def refresh_soon(self) -> None:
        """Make the next :meth:`due` true: Redis lost what it held (a restart), so the leases
        are taken again at once rather than a third of the lease time later (until then no
        agent can tell that a scheduler reads the partitions, and none waits for its fold)."""
        self._next_refresh = 0.0

    def refresh(self) -> LeaseChange:
        """Heartbeat, compute the assignment, take free assigned leases, renew held ones.

        Partitions held but no longer assigned to this member stay held (and in
        :attr:`LeaseChange.lost` only once released): the caller writes out their pending work
        first and then calls :meth:`release`. Raises RedisUnavailableError.
        """
        self._next_refresh = time.monotonic() + self.ttl_ms / 3000
        members = self._heartbeat()
        wanted = {p for p in range(self._keys.partitions)
                  if rendezvous_owner(p, list(members)) == self.member}
        held: set[int] = set()
        with mapped_errors("renewing partition leases"):
            for partition in sorted(self.owned | wanted):
                if self._hold(partition, renew=partition in self.owned,
                              take=partition in wanted):
                    held.add(partition)
        before = self.owned
        self.owned = frozenset(held)
        return LeaseChange(owned=self.owned, gained=self.owned - before,
                           lost=before - self.owned, members=members)

    def _hold(self, partition: int, *, renew: bool, take: bool) -> bool:
        key = self._keys.partition_lease(partition)
        if renew and self._renew(keys=[key], args=[self.member, self.ttl_ms]):
            return True
        # Renewal failed (expired, or Redis lost it): take it again if it is still ours to take.
        return take and bool(self._client.set(key, self.member, nx=True, px=self.ttl_ms))

    def surplus(self, members: tuple[str, ...]) -> frozenset[int]:
        """Held partitions the assignment now gives to another member (to hand over)."""
        return frozenset(p for p in self.owned
                         if rendezvous_owner(p, list(members)) != self.member)

    def release(self, partitions: frozenset[int] | set[int]) -> None:
        """Let go of ``partitions`` (after their pending work is written out)."""
        with mapped_errors("releasing partition leases"):
            for partition in sorted(partitions):
                self._release(keys=[self._keys.partition_lease(partition)], args=[self.member])
        self.owned = self.owned - frozenset(partitions)

    def leave(self) -> None:
        """Release every lease and leave the membership (a clean stop)."""
        self.release(self.owned)
        with mapped_errors("leaving the schedulers' membership"):
            self._client.zrem(self._keys.schedulers(), self.member)

    def _heartbeat(self) -> tuple[str, ...]:
        now_ms = int(self._clock() * 1000)
        key = self._keys.schedulers()
        with mapped_errors("refreshing the schedulers' membership"):
            # One key, so one slot on a cluster: a transaction is allowed.
            pipe = self._client.pipeline(transaction=True)
            pipe.zadd(key, {self.member: now_ms + self.ttl_ms})
            pipe.zremrangebyscore(key, "-inf", now_ms)
            pipe.zrange(key, 0, -1)
            _, _, raw = pipe.execute()
        return tuple(sorted(m.decode() if isinstance(m, bytes) else str(m) for m in raw))
