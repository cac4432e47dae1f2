"""The schedulers' reader of the usage bus: one consumer group per partition's stream.

The events and their publisher are :mod:`sessionfold.runtime.usage`. A scheduler reads the
streams of the partitions it owns in a consumer group, so an entry is handled until
acknowledged, also across a change of owner::

    consumer = UsageConsumer(client, keys, batch_size=1000, block_ms=1000, claim_idle_ms=30_000)
    consumer.assign({0, 3, 7})                 # the partitions this scheduler owns now
    while not stop.is_set():
        entries = consumer.read(stop)          # [] after a timeout or while Redis is away
        act_on(entries)
        consumer.ack(entries)                  # only after acting

:meth:`UsageConsumer.read` first reclaims (``XAUTOCLAIM``) entries another consumer read and
has not acknowledged for ``claim_idle_ms`` (a dead scheduler), then reads new ones
(``XREADGROUP``, ``BLOCK``). It re-creates the group when Redis lost it (``NOGROUP`` after a
restart) and backs off, without raising, while Redis is unreachable. Malformed entries are
acknowledged and skipped (they would otherwise be redelivered forever). Inline fold events and
nudges go to the ``on_fold`` and ``on_nudge`` callbacks and are acknowledged at once: a
scheduler dying between the two could count a fold twice, and a lost nudge is covered by the
sweep.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any

import redis
from sessionfold.core.errors import InvalidInputError
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import (
    RedisClient,
    is_cluster,
    is_connection_error,
    mapped_errors,
)
from sessionfold.runtime.usage import (
    FIELD,
    FOLD_FIELD,
    NUDGE_FIELD,
    FoldEvent,
    NudgeEvent,
    UsageEvent,
)

if TYPE_CHECKING:
    from sessionfold.runtime.settings import Settings

__all__ = ["StreamEntry", "UsageConsumer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One usage event read from a partition's stream, with the id to acknowledge it by."""

    entry_id: bytes
    event: UsageEvent
    #: The partition whose stream it was read from (it is acknowledged there).
    partition: int = 0


_new_object = object.__new__
_s_entry_id, _s_entry_event, _s_entry_partition = (
    StreamEntry.__dict__[f.name].__set__ for f in dataclass_fields(StreamEntry))


def _stream_entry(entry_id: bytes, payload: bytes, partition: int) -> StreamEntry:
    """``StreamEntry(entry_id, UsageEvent.from_payload(payload), partition)``, built by the
    slots' setters (the frozen dataclass's ``__init__`` goes through ``object.__setattr__``)."""
    entry = _new_object(StreamEntry)
    _s_entry_id(entry, entry_id)
    _s_entry_event(entry, UsageEvent.from_payload(payload))
    _s_entry_partition(entry, partition)
    return entry


def _default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class UsageConsumer:
    """One member of the schedulers' consumer group on the streams of some partitions.

    Reads the partitions it is given (:meth:`assign`; by default all of them: one scheduler
    alone). Not thread-safe. ``claim_idle_ms`` must be far longer than it takes to act on one
    batch: entries pending longer than that are taken over from their consumer, which is then
    presumed dead.

    On one Redis server a read is one ``XREADGROUP`` naming every owned stream. On a Redis
    Cluster each partition's stream lives in its own slot and one command may not span slots,
    so the streams are read with one non-blocking ``XREADGROUP`` each, sent in one pipeline
    (redis-py groups it by node), and an idle read waits a short poll interval instead of
    blocking on the server.
    """

    #: Longest wait of an idle read on a cluster (no server-side BLOCK across slots).
    CLUSTER_POLL_S = 0.05

    def __init__(self, client: RedisClient, keys: Keys, *, group: str = "schedulers",
                 consumer: str | None = None, batch_size: int = 1000, block_ms: int = 1000,
                 claim_idle_ms: int = 30_000, claim_every_s: float | None = None,
                 reconnect_max_s: float = 5.0,
                 on_fold: Callable[[FoldEvent], None] | None = None,
                 on_nudge: Callable[[NudgeEvent], None] | None = None,
                 partitions: Iterable[int] | None = None) -> None:
        self._client = client
        self._cluster = is_cluster(client)
        self._reader = _raw_stream_reader(client)
        self._keys = keys
        self._on_fold = on_fold
        self._on_nudge = on_nudge
        self.group = group
        self.name = consumer or _default_consumer_name()
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self._claim_every_s = (claim_idle_ms / 2000 if claim_every_s is None else claim_every_s)
        self._reconnect_max_s = reconnect_max_s
        self._backoff_s = 0.0
        self._outage_logged = False
        #: owned partition → its stream name
        self._streams: dict[int, str] = {}
        self._partition_of_stream: dict[bytes, int] = {}
        self._next_claim: dict[int, float] = {}
        self._claim_cursor: dict[int, bytes] = {}
        self._ready: set[int] = set()
        self.assign(range(keys.partitions) if partitions is None else partitions)
        #: Malformed entries acknowledged and skipped since start.
        self.malformed = 0
        #: Times the streams' Redis was found reset (a consumer group gone) or reachable again
        #: after an outage: what it held (the scheduler's partition leases too) may be gone.
        self.resets = 0
        #: Entries taken over from other consumers since start.
        self.claimed = 0
        #: Inline fold events handed to ``on_fold`` (and acknowledged) since start.
        self.folds = 0
        #: Nudges handed to ``on_nudge`` (and acknowledged) since start.
        self.nudges = 0

    @classmethod
    def from_settings(cls, settings: Settings, client: RedisClient,
                      consumer: str | None = None, *,
                      on_fold: Callable[[FoldEvent], None] | None = None,
                      on_nudge: Callable[[NudgeEvent], None] | None = None,
                      partitions: Iterable[int] | None = None) -> UsageConsumer:
        return cls(client, Keys.from_settings(settings), group=settings.scheduler_group,
                   consumer=consumer, batch_size=settings.scheduler_batch_size,
                   block_ms=settings.scheduler_block_ms,
                   claim_idle_ms=settings.scheduler_claim_idle_ms, on_fold=on_fold,
                   on_nudge=on_nudge, partitions=partitions)

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions read now."""
        return frozenset(self._streams)

    @property
    def streams(self) -> list[str]:
        """The streams read now, in partition order."""
        return [self._streams[p] for p in sorted(self._streams)]

    def assign(self, partitions: Iterable[int]) -> None:
        """Read these partitions from now on. A partition newly given is scanned for entries
        another consumer left pending (a dead or departed owner) at the next read."""
        wanted = set(partitions)
        for partition in wanted - set(self._streams):
            stream = self._keys.usage_stream(partition)
            self._streams[partition] = stream
            self._partition_of_stream[stream.encode()] = partition
            self._next_claim[partition] = 0.0
            self._claim_cursor[partition] = b"0-0"
        for partition in set(self._streams) - wanted:
            stream = self._streams.pop(partition)
            self._partition_of_stream.pop(stream.encode(), None)
            self._next_claim.pop(partition, None)
            self._claim_cursor.pop(partition, None)
            self._ready.discard(partition)

    def ensure_group(self) -> None:
        """Create the group (and the stream) of every owned partition if missing. Raises
        RedisUnavailableError."""
        for partition in sorted(set(self._streams) - self._ready):
            with mapped_errors("creating the schedulers' consumer group"):
                try:
                    # From id 0: events published before the first scheduler started count too.
                    self._client.xgroup_create(self._streams[partition], self.group, id="0",
                                               mkstream=True)
                except redis.ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise
            self._ready.add(partition)

    def read(self, stop: threading.Event | None = None) -> list[StreamEntry]:
        """The next batch: reclaimed entries of dead consumers first, then new ones.

        Blocks up to ``block_ms`` when there is nothing to do (or while no partition is owned).
        Returns [] after waiting out a backoff when Redis is unreachable (the wait ends early
        when ``stop`` is set).
        """
        if not self._streams:
            self._wait(self.block_ms / 1000, stop)
            return []
        try:
            self.ensure_group()
            entries = self._claim()
            room = self.batch_size - len(entries)
            if room > 0:
                # BLOCK only when there is nothing in hand: a claimed batch should go at once.
                entries += self._read_new(room, block=None if entries else self.block_ms,
                                          stop=stop)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):
                # Redis restarted (or someone deleted the stream): the group is gone with it.
                log.warning("usage stream consumer group missing (Redis restarted?); recreating")
                self.resets += 1
                self._ready.clear()
                self._claim_cursor = dict.fromkeys(self._streams, b"0-0")
                return []
            raise
        except Exception as exc:
            if not (is_connection_error(exc) or _caused_by_connection_error(exc)):
                raise
            self._wait_after_outage(exc, stop)
            return []
        if self._outage_logged:
            log.warning("usage stream reachable again")
            self.resets += 1
        self._outage_logged = False
        self._backoff_s = 0.0
        return entries

    def ack(self, entries: Sequence[StreamEntry]) -> int:
        """Acknowledge entries the caller has acted on; returns how many were.

        An ack lost to an outage is not an error: the entry comes back, and acting on a usage
        event twice is harmless (the measured size only moves forward).
        """
        if not entries:
            return 0
        by_partition: dict[int, list[bytes]] = {}
        for entry in entries:
            by_partition.setdefault(entry.partition, []).append(entry.entry_id)
        return self._ack_ids(by_partition)

    def _ack_ids(self, by_partition: Mapping[int, Sequence[bytes]]) -> int:
        try:
            if len(by_partition) == 1:
                ((partition, ids),) = by_partition.items()
                return int(self._client.xack(self._keys.usage_stream(partition), self.group,
                                             *ids))
            pipe = self._client.pipeline(transaction=False)
            for partition, ids in by_partition.items():
                pipe.xack(self._keys.usage_stream(partition), self.group, *ids)
            return sum(int(n) for n in pipe.execute())
        except redis.RedisError as exc:
            log.warning("could not acknowledge %d usage entries (%s); they will be redelivered",
                        sum(len(v) for v in by_partition.values()), exc)
            return 0

    def prune_consumers(self, idle_ms: int) -> int:
        """Remove group members idle longer than ``idle_ms`` that hold no pending entries.

        Schedulers get a fresh consumer name per process, so dead ones would pile up. A member
        with pending entries is kept (deleting it would drop them); a live one removed by
        mistake is re-created by its next read.
        """
        removed = 0
        for stream in self.streams:
            with mapped_errors("pruning dead usage consumers"):
                try:
                    members = self._client.xinfo_consumers(stream, self.group)
                except redis.ResponseError as exc:
                    if "NOGROUP" in str(exc) or "no such key" in str(exc).lower():
                        continue  # no group yet (or Redis lost it): nobody to prune
                    raise
                for info in members:
                    name = info["name"]
                    name = name.decode() if isinstance(name, bytes) else name
                    if name != self.name and info["pending"] == 0 and info["idle"] > idle_ms:
                        # The reply is the count of pending entries it dropped: 0, by design.
                        self._client.xgroup_delconsumer(stream, self.group, name)
                        removed += 1
        return removed

    def _claim(self) -> list[StreamEntry]:
        entries: list[StreamEntry] = []
        now = time.monotonic()
        for partition in sorted(self._streams):
            room = self.batch_size - len(entries)
            if room <= 0 or now < self._next_claim[partition]:
                continue
            reply = self._client.xautoclaim(self._streams[partition], self.group, self.name,
                                            self.claim_idle_ms,
                                            start_id=self._claim_cursor[partition], count=room)
            cursor, raw = reply[0], reply[1]
            cursor = cursor if isinstance(cursor, bytes) else str(cursor).encode()
            self._claim_cursor[partition] = cursor
            if cursor == b"0-0":  # scanned the whole pending list: rest a while
                self._next_claim[partition] = now + self._claim_every_s
            entries += self._decode(partition, raw)
        self.claimed += len(entries)
        if entries:
            log.info("took over %d usage entries from dead schedulers", len(entries))
        return entries

    def _read_new(self, count: int, *, block: int | None,
                  stop: threading.Event | None = None) -> list[StreamEntry]:
        if self._cluster:
            return self._read_new_cluster(count, block=block, stop=stop)
        # COUNT is per stream: a backlog spread over many partitions gives a larger batch,
        # which is the cheaper way to catch up.
        reply: Any = (self._reader or self._client).xreadgroup(
            self.group, self.name, {s: ">" for s in self.streams}, count=count, block=block)
        entries: list[StreamEntry] = []
        # RESP2: [[stream, [[id, [field, value, …]], …]], …] (redis-py's parsing: (id, dict))
        for stream, raw in reply or ():
            entries += self._decode(self._partition_of_stream[stream], raw)
        return entries

    def _read_new_cluster(self, count: int, *, block: int | None,
                          stop: threading.Event | None) -> list[StreamEntry]:
        pipe = self._client.pipeline(transaction=False)
        order = sorted(self._streams)
        for partition in order:
            pipe.xreadgroup(self.group, self.name, {self._streams[partition]: ">"}, count=count)
        entries: list[StreamEntry] = []
        for partition, reply in zip(order, pipe.execute(), strict=True):
            for _, raw in reply or ():
                entries += self._decode(partition, raw)
        if not entries and block:
            self._wait(min(block / 1000, self.CLUSTER_POLL_S), stop)
        return entries

    def _decode(self, partition: int,
                raw: Sequence[Sequence[Any]]) -> list[StreamEntry]:
        """The entries of one partition's reply: ``(id, fields)`` pairs, the fields a mapping
        (redis-py's parsing) or the server's flat ``[field, value, …]`` list (the raw reader's
        replies)."""
        entries: list[StreamEntry] = []
        bad: list[bytes] = []
        counted: list[bytes] = []
        for entry_id, fields in raw:
            if entry_id is None or fields is None:
                continue  # deleted from the stream (trimmed) while pending: nothing to act on
            try:
                if type(fields) is list:
                    if len(fields) == 2 and fields[0] == FIELD:  # a usage event: the usual
                        entries.append(_stream_entry(entry_id, fields[1], partition))
                        continue
                    fields = dict(zip(fields[::2], fields[1::2], strict=False))
                payload = fields.get(FIELD)
                if payload is not None:
                    entries.append(_stream_entry(entry_id, payload, partition))
                elif FOLD_FIELD in fields:
                    self._fold(FoldEvent.from_fields(fields))
                    counted.append(entry_id)
                elif NUDGE_FIELD in fields:
                    self._nudge(NudgeEvent.from_fields(fields))
                    counted.append(entry_id)
                else:
                    UsageEvent.from_fields(fields)  # raises: says which field is missing
            except InvalidInputError as exc:
                log.warning("skipping malformed usage entry %s: %s", entry_id.decode(), exc)
                bad.append(entry_id)
        if bad:
            self.malformed += len(bad)
        if bad or counted:
            # Counted fold events are done with at once: redelivered, they would count twice.
            # Nudges too: the callback has taken them, and the sweep covers one lost after it.
            self._ack_ids({partition: bad + counted})
        return entries

    def _fold(self, event: FoldEvent) -> None:
        if self._on_fold is not None:
            self._on_fold(event)
        self.folds += 1

    def _nudge(self, event: NudgeEvent) -> None:
        if self._on_nudge is not None:
            self._on_nudge(event)
        self.nudges += 1

    def _wait(self, seconds: float, stop: threading.Event | None) -> None:
        if stop is not None:
            stop.wait(seconds)
        else:
            time.sleep(seconds)

    def _wait_after_outage(self, exc: BaseException, stop: threading.Event | None) -> None:
        self._backoff_s = min(max(self._backoff_s * 2, 0.05), self._reconnect_max_s)
        if not self._outage_logged:
            log.warning("usage stream unreachable (%s); retrying with backoff up to %.1fs",
                        exc, self._reconnect_max_s)
            self._outage_logged = True
        # After a restart the groups must be re-made: try the cheap path first next time.
        self._ready.clear()
        self._wait(self._backoff_s, stop)


def _raw_stream_reader(client: RedisClient) -> redis.Redis | None:
    """A client on ``client``'s connection pool whose ``XREADGROUP`` replies are left as the
    server sent them (RESP2's nested lists), for :meth:`UsageConsumer._decode`: redis-py's
    reshaping of every entry into a tuple and a dict was about a quarter of a scheduler's read.
    None for a cluster, a client of another kind, or a RESP3 connection: their replies keep
    redis-py's parsing."""
    if not isinstance(client, redis.Redis) or \
            client.connection_pool.connection_kwargs.get("protocol") not in (None, 2, "2"):
        return None
    reader = redis.Redis(connection_pool=client.connection_pool)
    reader.set_response_callback("XREADGROUP", _unparsed)
    return reader


def _unparsed(response: Any, **options: Any) -> Any:
    return response


def _caused_by_connection_error(exc: BaseException) -> bool:
    cause = exc.__cause__
    return cause is not None and is_connection_error(cause)
