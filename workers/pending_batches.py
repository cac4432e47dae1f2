"""The batch folds waiting on a provider's batch API, per partition, for the scheduler to look at.

One sorted set per partition (:meth:`Keys.pending_batches
<sessionfold.runtime.keys.Keys.pending_batches>`): a member is a
:class:`~sessionfold.runtime.batch_folds.BatchTicket`, its score when the next look at it is
due. The fold job that sends a batch adds its ticket; the scheduler's sweep enqueues a
collection job for each ticket due and pushes its score on by the poll interval; the
collection job removes the ticket once the batch is over (collected, fallen back, dropped).

The session row's batch mark is the truth (:mod:`sessionfold.store.batches`); this set only
remembers where to look, and outlives the row: a batch whose session was deleted is still
looked at, and cancelled. The sweep adds back the ticket of every mark it finds, so a set lost
with Redis is rebuilt from the store.
"""

from __future__ import annotations

import logging

from sessionfold.core.errors import InvalidInputError
from sessionfold.runtime.batch_folds import BatchTicket
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import RedisClient, mapped_errors

__all__ = ["PendingBatches"]

log = logging.getLogger(__name__)


class PendingBatches:
    """The pending-batch sets of one deployment (see the module doc)."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self._client = client
        self.keys = keys

    def _key(self, ticket: BatchTicket) -> str:
        return self.keys.pending_batches(self.keys.partition_of(ticket.session_id))

    def add(self, ticket: BatchTicket, due: float, *, sooner: bool = False) -> None:
        """Remember ``ticket``, its first look due at ``due`` (unix seconds). A ticket already
        there keeps its score, unless ``sooner`` moves it earlier."""
        with mapped_errors("remembering a pending batch fold"):
            if sooner:
                self._client.zadd(self._key(ticket), {ticket.member(): due}, lt=True)
            else:
                self._client.zadd(self._key(ticket), {ticket.member(): due}, nx=True)

    def due(self, partition: int, now: float, limit: int) -> list[BatchTicket]:
        """The tickets of ``partition`` whose look is due at ``now``, soonest first (a member
        that is no ticket is dropped, with a warning)."""
        key = self.keys.pending_batches(partition)
        with mapped_errors("reading the pending batch folds"):
            raw = self._client.zrangebyscore(key, "-inf", now, start=0, num=limit)
        tickets: list[BatchTicket] = []
        for member in raw:
            text = member.decode() if isinstance(member, bytes) else str(member)
            try:
                tickets.append(BatchTicket.from_json(text))
            except (InvalidInputError, ValueError):
                log.warning("dropping a pending-batch member that is no ticket: %.200s", text)
                with mapped_errors("dropping a malformed pending batch member"):
                    self._client.zrem(key, text)
        return tickets

    def push_back(self, ticket: BatchTicket, due: float) -> None:
        """The next look at ``ticket`` is due at ``due`` (only if it is still pending)."""
        with mapped_errors("pushing back a pending batch fold"):
            self._client.zadd(self._key(ticket), {ticket.member(): due}, xx=True)

    def remove(self, ticket: BatchTicket) -> None:
        """The batch is over: forget ``ticket``."""
        with mapped_errors("forgetting a pending batch fold"):
            self._client.zrem(self._key(ticket), ticket.member())

    def count(self, partition: int) -> int:
        with mapped_errors("counting the pending batch folds"):
            return int(self._client.zcard(self.keys.pending_batches(partition)))
