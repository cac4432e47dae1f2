"""The usage bus: agents report each model call's usage on a Redis Stream; schedulers read it.

An agent publishes one :class:`UsageEvent` per provider call: the provider's own token counts,
and the highest ledger seq and window revision the request was built from (so a report on a
window that a fold has since replaced is recognised as old)::

    publisher = UsagePublisher.from_settings(settings, url)
    publisher.publish(UsageEvent.from_usage("s1", response.usage, seq=41, revision=7,
                                            model=response.model))

On the stream an event is one entry with one field, ``usage.v1``, holding a JSON array
``[session, seq, revision, input, cache_read, cache_creation, output, model, time]``: one
field, not nine, because a reader pays per field to parse a reply (about five times slower
with nine fields in redis-py's own parser).

Publishing never blocks the agent for long and never raises: the publisher's connection has
short socket timeouts and no retries, and while Redis is unreachable events wait in a small
in-memory buffer (the oldest dropped beyond ``buffer_max``), a warning is logged once per outage
and the buffer is flushed, in order, by the first publish that gets through. What is dropped is
not lost for good: the scheduler's periodic store sweep finds over-budget sessions regardless.

Schedulers read the stream in a consumer group, so several can share the work and an entry is
handled until acknowledged::

    consumer = UsageConsumer(client, keys, batch_size=1000, block_ms=1000, claim_idle_ms=30_000)
    while not stop.is_set():
        entries = consumer.read(stop)          # [] after a timeout or while Redis is away
        act_on(entries)
        consumer.ack(entries)                  # only after acting

:meth:`UsageConsumer.read` first reclaims (``XAUTOCLAIM``) entries that another consumer read
and has not acknowledged for ``claim_idle_ms`` (a dead scheduler), then reads new ones
(``XREADGROUP``, ``BLOCK``). It re-creates the group when Redis lost it (``NOGROUP`` after a
restart) and backs off, without raising, while Redis is unreachable. Malformed entries are
acknowledged and skipped (they would otherwise be redelivered forever).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from sessionfold.core.errors import InvalidInputError

from .keys import Keys
from .redis_conn import is_connection_error, mapped_errors, redis_client

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["FIELD", "StreamEntry", "UsageConsumer", "UsageEvent", "UsagePublisher"]

log = logging.getLogger(__name__)

#: The one field of a stream entry; the version names the payload's layout.
FIELD = b"usage.v1"
_JSON = json.JSONDecoder()
_INT_FIELDS = ("seq", "revision", "input_tokens", "cache_read_input_tokens",
               "cache_creation_input_tokens", "output_tokens")


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """The usage of one provider call, as the provider counted it.

    ``seq`` is the highest ledger seq the request carried, ``revision`` the window revision it
    was read at. The prompt size is :attr:`prompt_tokens` (``input_tokens`` excludes cache reads
    and writes). ``time`` is when the call returned (unix seconds).
    """

    session_id: str
    seq: int
    revision: int
    input_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    time: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        # Runs for every event a scheduler reads: the common case is one cheap pass.
        if not (type(self.session_id) is str and self.session_id
                and type(self.seq) is int and self.seq >= 0
                and type(self.revision) is int and self.revision >= 0
                and type(self.input_tokens) is int and self.input_tokens >= 0
                and type(self.cache_read_input_tokens) is int
                and self.cache_read_input_tokens >= 0
                and type(self.cache_creation_input_tokens) is int
                and self.cache_creation_input_tokens >= 0
                and type(self.output_tokens) is int and self.output_tokens >= 0
                and type(self.model) is str
                and type(self.time) in (int, float) and math.isfinite(self.time)):
            self._explain_invalid()

    def _explain_invalid(self) -> None:
        if not isinstance(self.session_id, str) or not self.session_id:
            raise InvalidInputError(
                f"usage event: session_id must be a non-empty string, got {self.session_id!r}")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise InvalidInputError(
                    f"usage event: {name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.model, str):
            raise InvalidInputError(f"usage event: model must be a string, got {self.model!r}")
        raise InvalidInputError(f"usage event: time must be a finite number, got {self.time!r}")

    @property
    def prompt_tokens(self) -> int:
        """The request's size as the provider measured it (input + cache read + cache write)."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    @property
    def position(self) -> tuple[int, int]:
        """``(revision, seq)``: a report with a larger position is the newer measurement."""
        return (self.revision, self.seq)

    @classmethod
    def from_usage(cls, session_id: str, usage: Any, *, seq: int, revision: int,
                   model: str | None = None, time_s: float | None = None) -> UsageEvent:
        """An event from an anthropic ``Usage`` object or a dict with the same fields.

        Missing or None counts read as 0 (anthropic leaves the cache fields None when unused).
        """
        def count(name: str) -> int:
            value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)
            return 0 if value is None else int(value)

        return cls(
            session_id=session_id, seq=seq, revision=revision,
            input_tokens=count("input_tokens"),
            cache_read_input_tokens=count("cache_read_input_tokens"),
            cache_creation_input_tokens=count("cache_creation_input_tokens"),
            output_tokens=count("output_tokens"),
            model=model or "",
            time=time.time() if time_s is None else time_s,
        )

    def to_payload(self) -> bytes:
        """The event as the stream carries it: one JSON array in the field ``usage.v1``."""
        return json.dumps([self.session_id, self.seq, self.revision, self.input_tokens,
                           self.cache_read_input_tokens, self.cache_creation_input_tokens,
                           self.output_tokens, self.model, self.time],
                          ensure_ascii=False, separators=(",", ":")).encode()

    def to_fields(self) -> dict[bytes, bytes]:
        """The stream entry's fields (``XADD stream * usage.v1 <payload>``)."""
        return {FIELD: self.to_payload()}

    @classmethod
    def from_payload(cls, payload: bytes) -> UsageEvent:
        """Parse :meth:`to_payload`'s output; :class:`InvalidInputError` says what is wrong."""
        try:
            # raw_decode on str: a third of json.loads(bytes)'s cost, paid per event read.
            text = payload.decode()
            values, end = _JSON.raw_decode(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"usage entry is not JSON: {exc}") from None
        if end != len(text):
            raise InvalidInputError("usage entry has data after its JSON array")
        if type(values) is not list or len(values) != 9:
            raise InvalidInputError(f"usage entry must be a JSON array of 9 values: {values!r}")
        return cls(*values)

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> UsageEvent:
        """Parse a stream entry's fields; :class:`InvalidInputError` says what is wrong."""
        payload = fields.get(FIELD)
        if payload is None:
            raise InvalidInputError(f"usage entry lacks the field {FIELD.decode()!r}")
        return cls.from_payload(payload)


# --------------------------------------------------------------------------------------------
# publishing (inside agents)


class UsagePublisher:
    """Appends usage events to the stream (``XADD … MAXLEN ~ n``); never raises, never stalls.

    Thread-safe: one publisher may serve all the agent threads of a process. ``client`` should
    have short socket timeouts and no retries (:meth:`from_settings` builds one).
    """

    def __init__(self, client: redis.Redis, keys: Keys, *, maxlen: int,
                 buffer_max: int = 1000, retry_initial_s: float = 0.5,
                 retry_max_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        if buffer_max < 0:
            raise InvalidInputError(f"buffer_max must be >= 0, got {buffer_max}")
        self._client = client
        self._stream = keys.usage_stream()
        self._maxlen = maxlen
        self._buffer: deque[UsageEvent] = deque(maxlen=buffer_max)
        self._buffer_max = buffer_max
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None  # None while Redis answers
        self._retry_delay_s = retry_initial_s
        self._next_try = 0.0
        self._dropped_this_outage = 0
        #: Events dropped because the buffer was full, since the publisher was made.
        self.dropped = 0

    @classmethod
    def from_settings(cls, settings: Settings, url: str) -> UsagePublisher:
        """A publisher on its own connection: short timeouts, no retries (``url``: resolved)."""
        timeout = settings.usage_socket_timeout_s
        client = redis_client(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                              retries=0, health_check_interval=0)
        return cls(client, Keys.from_settings(settings), maxlen=settings.usage_stream_maxlen,
                   buffer_max=settings.usage_buffer_max)

    @property
    def buffered(self) -> int:
        """Events waiting in memory for Redis to come back."""
        return len(self._buffer)

    def publish(self, event: UsageEvent) -> bool:
        """Send ``event`` (after any buffered ones). True if it reached Redis now.

        False means Redis is away and the event was buffered (or dropped, when the buffer is
        full: the oldest go first, or with ``buffer_max=0`` this one).
        """
        with self._lock:
            if self._down_since is not None and self._clock() < self._next_try:
                self._hold([event])  # known outage: do not pay a timeout on every call
                return False
            return self._send([*self._buffer, event])

    def flush(self) -> bool:
        """Try to send the buffered events now. True when nothing is left buffered."""
        with self._lock:
            return self._send(list(self._buffer)) if self._buffer else True

    def close(self) -> None:
        """Flush what can be flushed and close the connection."""
        self.flush()
        self._client.close()

    def _hold(self, events: Sequence[UsageEvent]) -> None:
        for ev in events:
            if len(self._buffer) == self._buffer_max:
                self.dropped += 1  # deque(maxlen) drops the oldest (maxlen 0: this one)
                self._dropped_this_outage += 1
            self._buffer.append(ev)

    def _send(self, events: list[UsageEvent]) -> bool:
        self._buffer.clear()
        try:
            if len(events) == 1:
                self._client.xadd(self._stream, events[0].to_fields(),  # type: ignore[arg-type]
                                  maxlen=self._maxlen, approximate=True)
            else:
                pipe = self._client.pipeline(transaction=False)
                for ev in events:
                    pipe.xadd(self._stream, ev.to_fields(),  # type: ignore[arg-type]
                              maxlen=self._maxlen, approximate=True)
                pipe.execute()
        except (redis.RedisError, OSError) as exc:
            # A pipeline cut short may have written a prefix of the events; sending those again
            # later only repeats a measurement, which the scheduler ignores (same position).
            self._failed(exc)
            self._hold(events)
            return False
        if self._down_since is not None:
            log.warning("usage bus reachable again after %.1fs: sent %d buffered events, "
                        "dropped %d", self._clock() - self._down_since, len(events) - 1,
                        self._dropped_this_outage)
            self._down_since = None
            self._retry_delay_s = self._retry_initial_s
            self._dropped_this_outage = 0
        return True

    def _failed(self, exc: BaseException) -> None:
        now = self._clock()
        if self._down_since is None:
            self._down_since = now
            log.warning("usage bus unreachable (%s); buffering up to %d usage events in memory, "
                        "the store sweep covers what is dropped", exc, self._buffer_max)
        else:
            self._retry_delay_s = min(self._retry_delay_s * 2, self._retry_max_s)
        self._next_try = now + self._retry_delay_s


# --------------------------------------------------------------------------------------------
# consuming (the scheduler)


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One usage event read from the stream, with the id to acknowledge it by."""

    entry_id: bytes
    event: UsageEvent


def _default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class UsageConsumer:
    """One member of the schedulers' consumer group on the usage stream. Not thread-safe.

    ``claim_idle_ms`` must be far longer than it takes to act on one batch: entries pending
    longer than that are taken over from their consumer, which is then presumed dead.
    """

    def __init__(self, client: redis.Redis, keys: Keys, *, group: str = "schedulers",
                 consumer: str | None = None, batch_size: int = 1000, block_ms: int = 1000,
                 claim_idle_ms: int = 30_000, claim_every_s: float | None = None,
                 reconnect_max_s: float = 5.0) -> None:
        self._client = client
        self.stream = keys.usage_stream()
        self.group = group
        self.name = consumer or _default_consumer_name()
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self._claim_every_s = (claim_idle_ms / 2000 if claim_every_s is None else claim_every_s)
        self._next_claim = 0.0
        self._claim_cursor = b"0-0"
        self._group_ready = False
        self._reconnect_max_s = reconnect_max_s
        self._backoff_s = 0.0
        self._outage_logged = False
        #: Malformed entries acknowledged and skipped since start.
        self.malformed = 0
        #: Entries taken over from other consumers since start.
        self.claimed = 0

    @classmethod
    def from_settings(cls, settings: Settings, client: redis.Redis,
                      consumer: str | None = None) -> UsageConsumer:
        return cls(client, Keys.from_settings(settings), group=settings.scheduler_group,
                   consumer=consumer, batch_size=settings.scheduler_batch_size,
                   block_ms=settings.scheduler_block_ms,
                   claim_idle_ms=settings.scheduler_claim_idle_ms)

    def ensure_group(self) -> None:
        """Create the group (and the stream) if missing. Raises RedisUnavailableError."""
        with mapped_errors("creating the schedulers' consumer group"):
            try:
                # From id 0: events published before the first scheduler started count too.
                self._client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._group_ready = True

    def read(self, stop: threading.Event | None = None) -> list[StreamEntry]:
        """The next batch: reclaimed entries of dead consumers first, then new ones.

        Blocks up to ``block_ms`` when there is nothing to do. Returns [] after waiting out a
        backoff when Redis is unreachable (the wait ends early when ``stop`` is set).
        """
        try:
            if not self._group_ready:
                self.ensure_group()
            entries = self._claim() if time.monotonic() >= self._next_claim else []
            room = self.batch_size - len(entries)
            if room > 0:
                # BLOCK only when there is nothing in hand: a claimed batch should go at once.
                entries += self._read_new(room, block=None if entries else self.block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):
                # Redis restarted (or someone deleted the stream): the group is gone with it.
                log.warning("usage stream consumer group missing (Redis restarted?); recreating")
                self._group_ready = False
                self._claim_cursor = b"0-0"
                return []
            raise
        except Exception as exc:
            if not (is_connection_error(exc) or _caused_by_connection_error(exc)):
                raise
            self._wait_after_outage(exc, stop)
            return []
        if self._outage_logged:
            log.warning("usage stream reachable again")
        self._outage_logged = False
        self._backoff_s = 0.0
        return entries

    def ack(self, entries: Sequence[StreamEntry] | Sequence[bytes]) -> int:
        """Acknowledge entries (or entry ids) the caller has acted on; returns how many were.

        An ack lost to an outage is not an error: the entry comes back, and acting on a usage
        event twice is harmless (the measured size only moves forward).
        """
        ids = [e.entry_id if isinstance(e, StreamEntry) else e for e in entries]
        if not ids:
            return 0
        try:
            return int(self._client.xack(self.stream, self.group, *ids))
        except redis.RedisError as exc:
            log.warning("could not acknowledge %d usage entries (%s); they will be redelivered",
                        len(ids), exc)
            return 0

    def prune_consumers(self, idle_ms: int) -> int:
        """Remove group members idle longer than ``idle_ms`` that hold no pending entries.

        Schedulers get a fresh consumer name per process, so dead ones would pile up. A member
        with pending entries is kept (deleting it would drop them); a live one removed by
        mistake is re-created by its next read.
        """
        removed = 0
        with mapped_errors("pruning dead usage consumers"):
            try:
                members = self._client.xinfo_consumers(self.stream, self.group)
            except redis.ResponseError as exc:
                if "NOGROUP" in str(exc) or "no such key" in str(exc).lower():
                    return 0  # no group yet (or Redis lost it): nobody to prune
                raise
            for info in members:
                name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
                if name != self.name and info["pending"] == 0 and info["idle"] > idle_ms:
                    # The reply is the count of pending entries it dropped: 0 here, by design.
                    self._client.xgroup_delconsumer(self.stream, self.group, name)
                    removed += 1
        return removed

    def _claim(self) -> list[StreamEntry]:
        reply = self._client.xautoclaim(self.stream, self.group, self.name, self.claim_idle_ms,
                                        start_id=self._claim_cursor, count=self.batch_size)
        cursor, raw = reply[0], reply[1]
        self._claim_cursor = cursor if isinstance(cursor, bytes) else str(cursor).encode()
        if self._claim_cursor == b"0-0":  # scanned the whole pending list: rest a while
            self._next_claim = time.monotonic() + self._claim_every_s
        entries = self._decode(raw)
        self.claimed += len(entries)
        if entries:
            log.info("took over %d usage entries from dead schedulers", len(entries))
        return entries

    def _read_new(self, count: int, *, block: int | None) -> list[StreamEntry]:
        reply: Any = self._client.xreadgroup(self.group, self.name, {self.stream: ">"},
                                             count=count, block=block)
        if not reply:
            return []
        return self._decode(reply[0][1])  # RESP2: [[stream, [(id, fields), …]]]

    def _decode(self, raw: Sequence[tuple[bytes | None, Mapping[bytes, bytes] | None]]
                ) -> list[StreamEntry]:
        entries: list[StreamEntry] = []
        bad: list[bytes] = []
        for entry_id, fields in raw:
            if entry_id is None or fields is None:
                continue  # deleted from the stream (trimmed) while pending: nothing to act on
            try:
                entries.append(StreamEntry(entry_id, UsageEvent.from_fields(fields)))
            except InvalidInputError as exc:
                log.warning("skipping malformed usage entry %s: %s", entry_id.decode(), exc)
                bad.append(entry_id)
        if bad:
            self.malformed += len(bad)
            self.ack(bad)
        return entries

    def _wait_after_outage(self, exc: BaseException, stop: threading.Event | None) -> None:
        self._backoff_s = min(max(self._backoff_s * 2, 0.05), self._reconnect_max_s)
        if not self._outage_logged:
            log.warning("usage stream unreachable (%s); retrying with backoff up to %.1fs",
                        exc, self._reconnect_max_s)
            self._outage_logged = True
        # After a restart the group must be re-made: try the cheap path first next time.
        self._group_ready = False
        if stop is not None:
            stop.wait(self._backoff_s)
        else:
            time.sleep(self._backoff_s)


def _caused_by_connection_error(exc: BaseException) -> bool:
    cause = exc.__cause__
    return cause is not None and is_connection_error(cause)
