"""The usage bus's events and their publisher: what agents put on the Redis Streams.

An agent publishes one :class:`UsageEvent` per provider call: the provider's own token counts,
and the highest ledger seq and window revision the request was built from (so a report on a
window that a fold has since replaced is recognised as old)::

    publisher = UsagePublisher.from_settings(settings, url)
    publisher.publish(UsageEvent.from_usage("s1", response.usage, seq=41, revision=7,
                                            model=response.model))

Each event goes to its session's partition's stream (:mod:`.keys`), so the one scheduler owning
that partition sees all of a session's reports. An entry has one field: ``usage.v1`` holds a
JSON array ``[session, seq, revision, input, cache_read, cache_creation, output, model, time]``
(one field, not nine: a reader pays per field to parse a reply). Two more kinds share the
streams: ``fold.v1`` (:class:`FoldEvent`, an agent's inline fold, for a scheduler to count in
``/metrics``) and ``nudge.v1`` (:class:`NudgeEvent`, "read this session from the store now":
no size, so it never outranks a measured report).

Publishing never blocks the agent for long and never raises: short socket timeouts, no retries,
and while Redis is away events wait in a small in-memory buffer (the oldest dropped beyond
``buffer_max``), flushed in order by the first publish that gets through. What is dropped is
covered by the scheduler's periodic store sweep. The schedulers' reader is
:mod:`sessionfold.workers.usage_consumer`.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any

import redis
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.tokens import measured_prompt_tokens, prompt_tokens
from sessionfold.core.usage import read_usage

from .keys import Keys
from .metrics import VisitCounts
from .redis_conn import RedisClient, agent_path_client

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["FIELD", "FOLD_FIELD", "NUDGE_FIELD", "Event", "FoldEvent", "NudgeEvent", "UsageEvent",
           "UsagePublisher"]

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

        Read by :func:`~sessionfold.core.usage.read_usage`, the one strict reader of provider
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
