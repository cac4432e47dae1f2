"""The usage bus: agents report each model call's usage on a Redis Stream; schedulers read it.

An agent publishes one :class:`UsageEvent` per provider call: the provider's own token counts,
and the highest ledger seq and window revision the request was built from (so a report on a
window that a fold has since replaced is recognised as old)::

    publisher = UsagePublisher.from_settings(settings, url)
    publisher.publish(UsageEvent.from_usage("s1", response.usage, seq=41, revision=7,
                                            model=response.model))

Sessions are split into partitions by a hash of their id (:mod:`.keys`): each partition has
its own stream, and an event goes to its session's partition's stream, so one scheduler (the
partition's owner, :mod:`.partitions`) sees all of a session's reports.

On the stream an event is one entry with one field, ``usage.v1``, holding a JSON array
``[session, seq, revision, input, cache_read, cache_creation, output, model, time]``: one
field, not nine, because a reader pays per field to parse a reply (about five times slower
with nine fields in redis-py's own parser).

The same stream carries one more kind of entry, with the field ``fold.v1``: a :class:`FoldEvent`,
published by an agent after an inline fold (the overflow fallback) so that a scheduler counts it
into ``/metrics``. The agent's process serves no metrics of its own, and the consumer group hands
each entry to exactly one scheduler, so each inline fold is counted once however many schedulers
run (:meth:`UsageConsumer.read` passes fold events to its ``on_fold`` callback and acknowledges
them at once; a scheduler that dies between the two could count one twice when another takes
the entry over).

A third kind, with the field ``nudge.v1``, is a :class:`NudgeEvent`: an agent's append took
its session past its trigger (:attr:`AppendResult.crossed_trigger
<sessionfold.store.results.AppendResult.crossed_trigger>`). It goes to the session's partition's
stream, so its owner re-reads the session from the store at once rather than wait for the next
usage report or the sweep. It is a nudge and not an estimated usage event on purpose: it carries
no size, so it can never outrank a measured report in the ``(revision, seq)`` ordering, and a
scheduler never writes anything of it to the measured state. :meth:`UsageConsumer.read` passes
nudges to its ``on_nudge`` callback and acknowledges them at once (one lost to a dying scheduler
is covered by the sweep).

Publishing never blocks the agent for long and never raises: the publisher's connection has
short socket timeouts and no retries, and while Redis is unreachable events wait in a small
in-memory buffer (the oldest dropped beyond ``buffer_max``), a warning is logged once per outage
and the buffer is flushed, in order, by the first publish that gets through. What is dropped is
not lost for good: the scheduler's periodic store sweep finds over-budget sessions regardless.

Schedulers read the streams of the partitions they own in a consumer group (one group per
stream), so an entry is handled until acknowledged, also across a change of owner::

    consumer = UsageConsumer(client, keys, batch_size=1000, block_ms=1000, claim_idle_ms=30_000)
    consumer.assign({0, 3, 7})                 # the partitions this scheduler owns now
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any

import redis
from sessionfold.core.cost import read_usage
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.tokens import measured_prompt_tokens, prompt_tokens

from .keys import Keys
from .metrics import VisitCounts
from .redis_conn import (
    RedisClient,
    agent_path_client,
    is_cluster,
    is_connection_error,
    mapped_errors,
)

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["FIELD", "FOLD_FIELD", "NUDGE_FIELD", "FoldEvent", "NudgeEvent", "StreamEntry",
           "UsageConsumer", "UsageEvent", "UsagePublisher"]

log = logging.getLogger(__name__)

#: The one field of a stream entry; the version names the payload's layout.
FIELD = b"usage.v1"
#: The field of an inline fold's entry (a JSON object: :meth:`VisitCounts.to_json`).
FOLD_FIELD = b"fold.v1"
#: The field of a nudge's entry (a JSON array: ``[session, revision, time]``).
NUDGE_FIELD = b"nudge.v1"
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
        """The request's size as the provider measured it (input + cache read + cache write:
        :func:`~sessionfold.core.tokens.prompt_tokens`)."""
        return prompt_tokens(self.input_tokens, self.cache_read_input_tokens,
                             self.cache_creation_input_tokens)

    @property
    def position(self) -> tuple[int, int]:
        """``(revision, seq)``: which report is newer is
        :func:`~sessionfold.core.tokens.supersedes`'s rule."""
        return (self.revision, self.seq)

    @classmethod
    def from_usage(cls, session_id: str, usage: Any, *, seq: int, revision: int,
                   model: str | None = None, time_s: float | None = None) -> UsageEvent:
        """An event from a provider's usage: an anthropic ``Usage``, an OpenAI ``usage``, or a
        dict with either's fields.

        Read by :func:`~sessionfold.core.cost.read_usage`, the one strict reader of provider
        usage: a count that is not a whole number >= 0 raises InvalidUsageError naming it, and a
        prompt no context window holds UsageUnmeasurableError. The event keeps the provider's
        split: ``input_tokens`` the uncached part (OpenAI's ``prompt_tokens`` less its cached
        tokens), the cache reads and writes apart, so :attr:`prompt_tokens` is the whole prompt.
        Missing or None counts read as 0 (anthropic leaves the cache fields None when unused); a
        report of zero makes an event of zero, which the client flags rather than sends.
        """
        tokens = read_usage(usage)
        measured_prompt_tokens(tokens.prompt, measure="estimate")  # refuses impossible sizes
        return cls(
            session_id=session_id, seq=seq, revision=revision,
            input_tokens=tokens.uncached,
            cache_read_input_tokens=tokens.cache_read,
            cache_creation_input_tokens=tokens.cache_write_5m + tokens.cache_write_1h,
            output_tokens=tokens.output,
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
        if cls is not UsageEvent:
            return cls(*values)
        # The generated __init__ sets each field through object.__setattr__ (a frozen
        # dataclass): the slots' own setters do it in half the time, and the same check runs.
        event = _new_object(UsageEvent)
        (_s_sid(event, values[0]), _s_seq(event, values[1]), _s_rev(event, values[2]),
         _s_in(event, values[3]), _s_read(event, values[4]), _s_write(event, values[5]),
         _s_out(event, values[6]), _s_model(event, values[7]), _s_time(event, values[8]))
        event.__post_init__()
        return event

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> UsageEvent:
        """Parse a stream entry's fields; :class:`InvalidInputError` says what is wrong."""
        payload = fields.get(FIELD)
        if payload is None:
            raise InvalidInputError(f"usage entry lacks the field {FIELD.decode()!r}")
        return cls.from_payload(payload)


_new_object = object.__new__
(_s_sid, _s_seq, _s_rev, _s_in, _s_read, _s_write, _s_out, _s_model, _s_time) = (
    UsageEvent.__dict__[f.name].__set__ for f in dataclass_fields(UsageEvent))


@dataclass(frozen=True, slots=True)
class FoldEvent:
    """An inline fold done in an agent's process, for a scheduler to count in its metrics.

    Carries what the metrics keep of the visit (:class:`VisitCounts`: closed-set labels and
    counts), never the session's content.
    """

    visit: VisitCounts

    def to_fields(self) -> dict[bytes, bytes]:
        """The stream entry's fields (``XADD stream * fold.v1 <json>``)."""
        return {FOLD_FIELD: json.dumps(self.visit.to_json(), separators=(",", ":")).encode()}

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> FoldEvent:
        """Parse a stream entry's fields; :class:`InvalidInputError` says what is wrong."""
        return cls(VisitCounts.from_json(_entry_json(fields, FOLD_FIELD, "fold")))


def _entry_json(fields: Mapping[bytes, bytes], name: bytes, what: str) -> Any:
    """The JSON value of field ``name`` of a ``what`` entry; InvalidInputError when it is
    missing or not JSON."""
    payload = fields.get(name)
    if payload is None:
        raise InvalidInputError(f"{what} entry lacks the field {name.decode()!r}")
    try:
        return json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{what} entry is not JSON: {exc}") from None


@dataclass(frozen=True, slots=True)
class NudgeEvent:
    """An append took session ``session_id`` past its trigger (at window ``revision``; ``time``:
    when, unix seconds): its partition's scheduler should re-read it from the store now.

    Carries no size on purpose (see the module doc): what the scheduler decides on is the
    store's own figure, read fresh.
    """

    session_id: str
    revision: int
    time: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if type(self.session_id) is not str or not self.session_id:
            raise InvalidInputError(
                f"nudge: session_id must be a non-empty string, got {self.session_id!r}")
        if type(self.revision) is not int or self.revision < 0:
            raise InvalidInputError(
                f"nudge: revision must be an integer >= 0, got {self.revision!r}")
        if type(self.time) not in (int, float) or not math.isfinite(self.time):
            raise InvalidInputError(f"nudge: time must be a finite number, got {self.time!r}")

    def to_fields(self) -> dict[bytes, bytes]:
        """The stream entry's fields (``XADD stream * nudge.v1 <json>``)."""
        return {NUDGE_FIELD: json.dumps([self.session_id, self.revision, self.time],
                                        ensure_ascii=False, separators=(",", ":")).encode()}

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> NudgeEvent:
        """Parse a stream entry's fields; :class:`InvalidInputError` says what is wrong."""
        values = _entry_json(fields, NUDGE_FIELD, "nudge")
        if type(values) is not list or len(values) != 3:
            raise InvalidInputError(f"nudge entry must be a JSON array of 3 values: {values!r}")
        return cls(*values)


#: What a publisher sends: one entry each.
Event = UsageEvent | FoldEvent | NudgeEvent


# --------------------------------------------------------------------------------------------
# publishing (inside agents)


class UsagePublisher:
    """Appends usage events to the stream (``XADD … MAXLEN ~ n``); never raises, never stalls.

    Thread-safe: one publisher may serve all the agent threads of a process. ``client`` should
    have short socket timeouts and no retries (:meth:`from_settings` builds one).
    """

    def __init__(self, client: RedisClient, keys: Keys, *, maxlen: int,
                 buffer_max: int = 1000, retry_initial_s: float = 0.5,
                 retry_max_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        if buffer_max < 0:
            raise InvalidInputError(f"buffer_max must be >= 0, got {buffer_max}")
        self._client = client
        self._keys = keys
        self._maxlen = maxlen
        self._buffer: deque[Event] = deque(maxlen=buffer_max)
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
        client = agent_path_client(url, settings.usage_socket_timeout_s)
        # The length bound is the bus's as a whole, spread over the partitions' streams.
        maxlen = max(1000, settings.usage_stream_maxlen // settings.partitions)
        return cls(client, Keys.from_settings(settings), maxlen=maxlen,
                   buffer_max=settings.usage_buffer_max)

    @property
    def buffered(self) -> int:
        """Events waiting in memory for Redis to come back."""
        return len(self._buffer)

    def publish(self, event: Event) -> bool:
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

    def _hold(self, events: Sequence[Event]) -> None:
        for ev in events:
            if len(self._buffer) == self._buffer_max:
                self.dropped += 1  # deque(maxlen) drops the oldest (maxlen 0: this one)
                self._dropped_this_outage += 1
            self._buffer.append(ev)

    def _send(self, events: list[Event]) -> bool:
        self._buffer.clear()
        try:
            if len(events) == 1:
                self._client.xadd(self._stream_of(events[0]),
                                  events[0].to_fields(),  # type: ignore[arg-type]
                                  maxlen=self._maxlen, approximate=True)
            else:
                pipe = self._client.pipeline(transaction=False)
                for ev in events:
                    pipe.xadd(self._stream_of(ev), ev.to_fields(),  # type: ignore[arg-type]
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

    def _stream_of(self, event: Event) -> str:
        # A usage event (or a nudge) goes to its session's partition, so the scheduler owning
        # that partition sees every report of the session, in order. An inline fold's event is only
        # counted (by whichever scheduler reads it): partition 0's stream carries them all.
        if isinstance(event, UsageEvent | NudgeEvent):
            return self._keys.usage_stream_of(event.session_id)
        return self._keys.usage_stream(0)

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
    """One usage event read from a partition's stream, with the id to acknowledge it by."""

    entry_id: bytes
    event: UsageEvent
    #: The partition whose stream it was read from (it is acknowledged there).
    partition: int = 0


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
