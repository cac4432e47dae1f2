"""Drop-in SDK wrappers: the agent's loop reads like plain SDK code, the session does the rest.

::

    llm = SessionAnthropic(anthropic.Anthropic(), client.session("agent-7", policy, SYSTEM))
    history = [{"role": "user", "content": task}]
    while True:
        reply = llm.messages.create(model=MODEL, max_tokens=4096, system=SYSTEM,
                                    messages=history, tools=MY_TOOLS)
        history.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            break
        history.append({"role": "user", "content": run_my_tools(reply)})

:class:`SessionAnthropic` wraps an ``anthropic.Anthropic`` client and a
:class:`~sessionfold.client.session.SessionHandle`; :class:`AsyncSessionAnthropic` an
``anthropic.AsyncAnthropic`` and an :class:`~sessionfold.client.aio.AsyncSessionHandle`;
:class:`SessionOpenAI` an ``openai.OpenAI`` and a handle (``chat.completions.create``, in
OpenAI's chat shape, converted with :func:`~sessionfold.core.messages.from_openai` /
:func:`~sessionfold.core.messages.to_openai`). Each call takes the SDK's own keyword arguments
and:

1. **appends only what is new**: plain SDK code sends its whole history every call. The
   caller's messages must begin with what the session's ledger holds (in ledger order, without
   the recall exchanges the wrapper made itself); the messages past it are appended. When the
   two differ, :class:`HistoryMismatchError` names the first index where they part, and a
   ``system=`` that is not the session's system prompt is refused the same way (leaving
   ``system`` out sends the session's). Nothing is appended on a mismatch.
2. **sends the compacted window**, not the caller's history: the session's window with the new
   messages at its end, and the caller's tools with ``sessionfold_recall`` beside them when the
   session's policy has recall on.
   Requests carry prompt-cache breakpoints (``cache_control``) after the window's stable head
   and after its last message (:func:`~sessionfold.client.window_view.place_cache_breakpoints`):
   the calls between two folds read the cached prefix at a tenth of the input price, and the
   first call after a fold writes the new one. ``cache_breakpoints=False`` sends none.
3. **reports the provider's usage** for the window the request was built from, then
   **records the reply** in the ledger (keyed by the reply's id, so a retry does not add it
   twice). A reply that cannot be recorded (the store is down, the session was deleted
   meanwhile, the store refuses the message, a chat completion does not convert) is not lost:
   its usage has gone out first, and :class:`ReplyNotRecordedError` is raised carrying it as
   ``response`` (what the call would have returned), saying why. The ledger then lacks it: put
   it in the history as usual and the next call appends it with the messages after it, or
   deal with the cause. Raised rather than logged because the wrapper's contract is that the
   ledger holds what the caller was given; a reply returned unrecorded would break it
   silently, to surface one call later as a history mismatch or a missing turn.
4. **folds inline and retries once** when the provider answers "prompt is too long", and
   **answers recall itself**: a reply that asks only for ``sessionfold_recall`` is answered from
   the ledger and the model called again; the caller gets the first reply that is not one.
   Both are the handle's own paths (:meth:`SessionHandle.call` and the pieces it is made of),
   not copies. A reply that mixes recall with the agent's tools goes back to the caller, whose
   next message answers the agent's tools only: the wrapper adds the recall answers to it
   before it is appended (a tool result the caller wrote for the recall call is replaced).

**Streaming** (``messages.stream(...)``, ``create(stream=True)``, ``chat.completions.create(
stream=True)``) goes through the same steps. With recall off the caller reads the provider's
events as they come. With recall on, a reply's events reach the caller once it is known not to
be a recall-only one -- at the first call of one of the agent's own tools, or at its end -- so
a recall round is answered and the model called again without the caller seeing any of it; the
caller reads the final reply's stream. Its usage is reported and the reply recorded when the
stream has been read to its end (a stream closed early records nothing).

The ``anthropic`` and ``openai`` packages are not imported here: the wrappers call the client
they are given, so ``import sessionfold.client`` needs neither.

Errors: the wrappers raise the library's errors (:mod:`sessionfold.core.errors`) and the
provider SDK's own, as they are, plus two of their own::

    InvalidMessageError
    └── HistoryMismatchError     the history does not begin with the ledger; nothing appended
    SessionfoldError
    └── ReplyNotRecordedError    the reply was paid for and reported but not recorded
                                 (``response``: the reply; ``__cause__``: why)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sessionfold.core.errors import InvalidMessageError, SessionfoldError
from sessionfold.core.messages import (
    Conversation,
    Message,
    ToolResultBlock,
    ToolUseBlock,
    parse_message,
    parse_messages,
    sdk_dict,
)
from sessionfold.core.openai_shape import from_openai, leading_system_count
from sessionfold.core.openai_write import to_openai
from sessionfold.core.overflow import is_context_overflow

from .aio import AsyncSessionHandle
from .recall import RECALL_TOOL_NAME, openai_tool
from .session import CallPlan, OverBudget, SessionHandle
from .window_view import WindowView

if TYPE_CHECKING:
    import anthropic
    import openai
    from anthropic.types import Message as AnthropicMessage

__all__ = [
    "AsyncSessionAnthropic",
    "AsyncSessionMessageStream",
    "HistoryMismatchError",
    "ReplyNotRecordedError",
    "SessionAnthropic",
    "SessionChatStream",
    "SessionMessageStream",
    "SessionOpenAI",
]


class HistoryMismatchError(InvalidMessageError):
    """The caller's history does not begin with what the session holds, or its ``system``
    is not the session's. ``index`` is the first message where the two part (None for the
    system prompt, ``field="system"``). Nothing was appended."""


class ReplyNotRecordedError(SessionfoldError):
    """The model's reply was paid for, and its usage reported, but it could not be recorded in
    the session's ledger.

    ``response`` is the reply as the call would have returned it: the SDK's ``Message`` or
    ``ChatCompletion``; for a stream read to its end, the final ``Message`` (also
    ``get_final_message()``) or the assistant message in OpenAI's shape (also ``message()``).
    ``reason`` says why, and ``__cause__`` is the error met (StoreError, SessionNotFoundError,
    InvalidMessageError...). The ledger does not hold the reply: put it in the history as
    usual and the next call appends it with the messages after it (a fault that lasts fails
    that call's append, before anything is sent), or deal with the cause.
    """

    def __init__(self, session_id: str, response: Any, cause: BaseException) -> None:
        self.session_id = session_id
        self.response = response
        self.reason = f"{type(cause).__name__}: {cause}"
        super().__init__(
            f"session {session_id!r}: the model's reply was not recorded in the ledger "
            f"({self.reason}); its usage was reported, and the reply is this error's "
            "`response`")


# --- the caller's history against the ledger ---------------------------------------------------

def _comparable(message: Message, recall_ids: set[str]) -> Any:
    """``message`` as compared: string content as one text block, without ``cache_control``
    markers (the SDK's caller moves them from call to call), and without the tool results
    answering recall calls (the wrapper writes those, whatever the caller sent)."""
    blocks = []
    for block in message.blocks():
        if isinstance(block, ToolResultBlock) and block.tool_use_id in recall_ids:
            continue
        data = block.model_dump(mode="json", exclude_unset=True)
        data.pop("cache_control", None)
        blocks.append(data)
        if isinstance(block, ToolUseBlock) and block.name == RECALL_TOOL_NAME:
            recall_ids.add(block.id)
    return [message.role, blocks]


@dataclass
class _Known:
    """The ledger as the caller would have sent it, read once and kept: one comparable form
    per row the caller saw (None for a row discarded under ``retain="discard"``: anything goes
    there), the recall calls met so far, and the last row (the reply the caller answers)."""

    next_seq: int = 0
    rows: list[Any] = field(default_factory=list)
    recall_ids: set[str] = field(default_factory=set)
    last: Message | None = None

    def refresh(self, handle: SessionHandle, ledger_len: int) -> None:
        if ledger_len < self.next_seq:  # the session was deleted and made again
            self.next_seq, self.rows, self.recall_ids, self.last = 0, [], set(), None
        if ledger_len == self.next_seq:
            return
        for entry in handle.ledger(self.next_seq):
            self.next_seq = entry.seq + 1
            if entry.origin == "recall":  # the wrapper's own exchange: the caller never saw it
                continue
            self.last = entry.message
            self.rows.append(None if entry.message is None
                             else _comparable(entry.message, self.recall_ids))


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    parts = []
    for block in system if isinstance(system, list) else []:
        text = block.get("text") if isinstance(block, Mapping) else getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
    return "".join(parts)


class _Ledger:
    """What one wrapper knows of its session's ledger, and the step every call starts with."""

    def __init__(self, handle: SessionHandle) -> None:
        self.handle = handle
        self.known = _Known()

    def new_messages(self, messages: Sequence[Message], system: str | None) -> list[Message]:
        """The caller's ``messages`` past the ledger, the recall answers added to the first
        (see the module doc); HistoryMismatchError when the caller's history does not begin
        with the ledger or ``system`` (None: not given) is not the session's."""
        info = self.handle.info()
        if system is not None and system != info.system:
            raise HistoryMismatchError(
                f"system= differs from session {self.handle.session_id!r}'s system prompt "
                f"(given {len(system)} characters starting {system[:60]!r}; the session's "
                f"starts {info.system[:60]!r}); the system prompt is fixed when the session "
                "is made: leave system out to send the session's", field="system")
        self.known.refresh(self.handle, info.ledger_len)
        rows = self.known.rows
        recall_ids: set[str] = set()  # the caller's side: the recall calls met in its own history
        for i, message in enumerate(messages[:len(rows)]):
            theirs = _comparable(message, recall_ids)
            if rows[i] is not None and theirs != rows[i]:
                raise HistoryMismatchError(
                    f"the history differs from session {self.handle.session_id!r}'s ledger "
                    f"from message {i} on (a {message.role} message here, a {rows[i][0]} "
                    f"message with other content in the ledger); the messages must begin "
                    f"with the {len(rows)} the session holds, in order", index=i)
        if len(messages) < len(rows):
            raise HistoryMismatchError(
                f"the history has {len(messages)} messages but session "
                f"{self.handle.session_id!r}'s ledger holds {len(rows)}: the messages must "
                "begin with all of them", index=len(messages))
        new = list(messages[len(rows):])
        if new and new[0].role == "user" and self.known.last is not None:
            new[0] = self._with_recall_answers(self.known.last, new[0])
        return new

    def _with_recall_answers(self, reply: Message, answer: Message) -> Message:
        """``answer`` (the user message after ``reply``) with ``reply``'s recall calls
        answered from the ledger, in the order ``reply`` made its calls."""
        recalls = {b.id for b in reply.blocks()
                   if isinstance(b, ToolUseBlock) and b.name == RECALL_TOOL_NAME}
        if not recalls:
            return answer
        own = [b.model_dump(mode="json", exclude_unset=True) for b in answer.blocks()
               if not (isinstance(b, ToolResultBlock) and b.tool_use_id in recalls)]
        content = self.handle.tool_results(reply.to_json(), own)
        return Message(role="user", content=parse_message(
            {"role": "user", "content": content}).content)


def _checked_history(messages: Any) -> list[Message]:
    if not isinstance(messages, list | tuple):
        raise InvalidMessageError(f"messages is a list of messages, got "
                                  f"{type(messages).__name__}")
    return parse_messages(list(messages), check_pairing=False)


def _reply_message(content: Any) -> list[dict[str, Any]]:
    """The ledger row of a reply with ``content`` ([] for a reply with no content)."""
    if not content:
        return []
    return [{"role": "assistant", "content": content}]


def _content_of(reply: Any) -> Any:
    return reply.get("content") if isinstance(reply, Mapping) else getattr(reply, "content", None)


def _id_of(reply: Any) -> str | None:
    value = reply.get("id") if isinstance(reply, Mapping) else getattr(reply, "id", None)
    return value if isinstance(value, str) and 0 < len(value) <= 180 else None


def _record(handle: SessionHandle, reply: Any, response: Any) -> None:
    """Append the reply (the SDK's object or its JSON) to the ledger, once per reply id.

    Called once its usage has been reported. Whatever fails here, the caller must still get
    what it paid for: :class:`ReplyNotRecordedError` carrying ``response`` (the reply as the
    caller would have got it)."""
    try:
        if isinstance(reply, _ChatReply):
            reply.check_converted()
        rows = _reply_message(_content_of(reply))
        if rows:
            reply_id = _id_of(reply)
            handle.append(rows, key=f"sdk-reply-{reply_id}" if reply_id else None)
    except Exception as exc:
        raise ReplyNotRecordedError(handle.session_id, response, exc) from exc


# --- streams: the rounds before the one the caller reads -----------------------------------------

class _Attempt(Protocol):
    """One streamed request as the rounds need it."""

    def tool_call(self, event: Any) -> str | None:
        """The name of the tool whose call ``event`` starts, if it starts one."""
        ...

    def reply(self) -> Any:
        """The reply, once every event was read: with ``content`` (Anthropic blocks), ``id``,
        ``usage`` and ``model``, as the handle reads replies."""
        ...


class _SyncAttempt(_Attempt, Protocol):
    def __next__(self) -> Any: ...

    def close(self) -> None: ...


class _AsyncAttempt(_Attempt, Protocol):
    async def next(self) -> Any: ...

    async def close(self) -> None: ...


@dataclass
class _Opened:
    """The attempt the caller reads, the events already read from it, and the view it was
    built from; ``done``: it was read to its end while being looked at (its usage went out
    already, and the events read are all there is)."""

    attempt: Any
    read: list[Any]
    view: WindowView
    done: bool = False


def _decided(attempt: _Attempt, event: Any) -> bool:
    """Whether ``event`` shows the reply is not a recall-only one (it calls one of the agent's
    own tools)."""
    name = attempt.tool_call(event)
    return name is not None and name != RECALL_TOOL_NAME


def _open_sync(handle: SessionHandle, plan: CallPlan, view: WindowView,
               start: Callable[[WindowView], _SyncAttempt]) -> tuple[_SyncAttempt, WindowView]:
    """:meth:`SessionHandle._send`'s overflow step for a stream: the request is refused before
    its first event, so the inline fold and the one retry happen here."""
    try:
        return start(view), view
    except Exception as exc:
        if not is_context_overflow(exc):
            raise
        view = handle._after_overflow(exc, plan)
        try:
            return start(view), view
        except Exception as again:
            if is_context_overflow(again):
                raise handle._still_too_long(again) from again
            raise


def _rounds_sync(handle: SessionHandle, plan: CallPlan,
                 start: Callable[[WindowView], _SyncAttempt], view: WindowView) -> _Opened:
    """Open streams until one is not a recall-only reply (or the rounds are used up)."""
    rounds = 0
    while True:
        attempt, view = _open_sync(handle, plan, view, start)
        if not plan.recall:
            return _Opened(attempt, [], view)
        try:
            read: list[Any] = []
            for event in _drain(attempt):
                read.append(event)
                if _decided(attempt, event):
                    return _Opened(attempt, read, view)
            reply = attempt.reply()
            handle._after_call(reply, view)
            next_view = handle._recall_round(plan, reply, rounds, view)
        except BaseException:
            attempt.close()
            raise
        if next_view is None:
            return _Opened(attempt, read, view, done=True)
        attempt.close()
        view, rounds = next_view, rounds + 1


def _drain(attempt: _SyncAttempt) -> Iterator[Any]:
    while True:
        try:
            yield next(attempt)
        except StopIteration:
            return


async def _open_async(handle: AsyncSessionHandle, plan: CallPlan, view: WindowView,
                      start: Callable[[WindowView], Any]) -> tuple[_AsyncAttempt, WindowView]:
    h = handle.sync
    try:
        return await start(view), view
    except Exception as exc:
        if not is_context_overflow(exc):
            raise
        view = await asyncio.to_thread(h._after_overflow, exc, plan)
        try:
            return await start(view), view
        except Exception as again:
            if is_context_overflow(again):
                raise h._still_too_long(again) from again
            raise


async def _rounds_async(handle: AsyncSessionHandle, plan: CallPlan,
                        start: Callable[[WindowView], Any], view: WindowView) -> _Opened:
    h = handle.sync
    rounds = 0
    while True:
        attempt, view = await _open_async(handle, plan, view, start)
        if not plan.recall:
            return _Opened(attempt, [], view)
        try:
            read: list[Any] = []
            while True:
                try:
                    event = await attempt.next()
                except StopAsyncIteration:
                    break
                read.append(event)
                if _decided(attempt, event):
                    return _Opened(attempt, read, view)
            reply = attempt.reply()
            await asyncio.to_thread(h._after_call, reply, view)
            next_view = await asyncio.to_thread(h._recall_round, plan, reply, rounds, view)
        except BaseException:
            await attempt.close()
            raise
        if next_view is None:
            return _Opened(attempt, read, view, done=True)
        await attempt.close()
        view, rounds = next_view, rounds + 1


# --- Anthropic ------------------------------------------------------------------------------------

#: Events the SDK's MessageStream makes up from the raw ones (a raw stream has none).
_DERIVED_EVENTS = frozenset({"text", "citation", "thinking", "signature", "input_json"})


def _messages_params(kwargs: Mapping[str, Any], system: str, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The SDK's keyword arguments for one request: the caller's, with the window's messages,
    the caller's system (the session's, when not given) and the tools to send."""
    params = {k: v for k, v in kwargs.items() if k not in ("messages", "stream")}
    if kwargs.get("system") is None and system:
        params["system"] = system
    own = list(kwargs.get("tools") or [])
    if own or tools:
        params["tools"] = [*own, *tools]
    params["messages"] = messages
    return params


def _tool_started(event: Any) -> str | None:
    """The tool name of the ``tool_use`` block a Messages stream event starts, if any."""
    block = getattr(event, "content_block", None)
    if event.type == "content_block_start" and getattr(block, "type", None) == "tool_use":
        name = getattr(block, "name", None)
        return name if isinstance(name, str) else ""
    return None


class _MessageAttempt:
    """One SDK ``MessageStream`` as the rounds read it."""

    def __init__(self, manager: Any, stream: Any) -> None:
        self.manager = manager
        self.stream = stream
        self.closed = False

    def tool_call(self, event: Any) -> str | None:
        return _tool_started(event)

    def reply(self) -> Any:
        return self.stream.current_message_snapshot

    def __next__(self) -> Any:
        return next(self.stream)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.manager.__exit__(None, None, None)


class _AsyncMessageAttempt:
    """One SDK ``AsyncMessageStream`` as the rounds read it."""

    def __init__(self, manager: Any, stream: Any) -> None:
        self.manager = manager
        self.stream = stream
        self.closed = False

    def tool_call(self, event: Any) -> str | None:
        return _tool_started(event)

    def reply(self) -> Any:
        return self.stream.current_message_snapshot

    async def next(self) -> Any:
        return await self.stream.__anext__()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.manager.__aexit__(None, None, None)


class SessionMessageStream:
    """What ``with wrapped.messages.stream(...) as stream`` gives: the final reply's events
    (the SDK's own event objects), ``text_stream``, ``get_final_message()``,
    ``get_final_text()``, ``until_done()``. Recorded and reported when read to the end."""

    def __init__(self, handle: SessionHandle, opened: _Opened, *, raw: bool = False) -> None:
        self._handle = handle
        self._opened = opened
        self._raw = raw
        self._events = self._relay()
        self._final: AnthropicMessage | None = None

    def _relay(self) -> Iterator[Any]:
        opened = self._opened
        yield from opened.read
        if not opened.done:
            yield from _drain(opened.attempt)
        self._finish()

    def _finish(self) -> None:
        opened = self._opened
        reply = opened.attempt.reply()
        if not opened.done:
            self._handle._after_call(reply, opened.view)
        self._final = reply  # get_final_message() has it, even when it cannot be recorded
        _record(self._handle, reply, reply)

    def __iter__(self) -> Iterator[Any]:
        for event in self._events:
            if not (self._raw and event.type in _DERIVED_EVENTS):
                yield event

    def __next__(self) -> Any:
        while True:
            event = next(self._events)
            if not (self._raw and event.type in _DERIVED_EVENTS):
                return event

    @property
    def text_stream(self) -> Iterator[str]:
        for event in self._events:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                yield event.delta.text

    def until_done(self) -> None:
        for _ in self._events:
            pass

    def get_final_message(self) -> AnthropicMessage:
        self.until_done()
        assert self._final is not None
        return self._final

    def get_final_text(self) -> str:
        return "".join(b.text for b in self.get_final_message().content if b.type == "text")

    def close(self) -> None:
        self._opened.attempt.close()

    def __enter__(self) -> SessionMessageStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StreamManager:
    """``wrapped.messages.stream(...)``: the request is made on entering, as the SDK's."""

    def __init__(self, opener: Callable[[], SessionMessageStream]) -> None:
        self._opener = opener
        self._stream: SessionMessageStream | None = None

    def __enter__(self) -> SessionMessageStream:
        self._stream = self._opener()
        return self._stream

    def __exit__(self, *exc: object) -> None:
        if self._stream is not None:
            self._stream.close()


class _Messages:
    """``wrapped.messages``: ``create`` and ``stream`` bound to the session."""

    def __init__(self, owner: SessionAnthropic) -> None:
        self._owner = owner

    def create(self, **kwargs: Any) -> Any:
        """``client.messages.create(**kwargs)`` through the session (see the module doc):
        the reply (``stream=True``: a :class:`SessionMessageStream` of the raw events)."""
        owner = self._owner
        owner._prepare(kwargs)
        if kwargs.get("stream") is True:
            return owner._open_stream(kwargs, raw=True)
        messages = owner.client.messages

        def send(system: str, window: list[dict[str, Any]],
                 tools: list[dict[str, Any]]) -> Any:
            return messages.create(**_messages_params(kwargs, system, window, tools))

        reply = owner.handle.call(send, over_budget=owner.over_budget,
                                  cache_breakpoints=owner.cache_breakpoints)
        _record(owner.handle, reply, reply)
        return reply

    def stream(self, **kwargs: Any) -> _StreamManager:
        """``client.messages.stream(**kwargs)`` through the session: ``with ... as stream``
        gives a :class:`SessionMessageStream` of the final reply."""
        owner = self._owner

        def opener() -> SessionMessageStream:
            owner._prepare(kwargs)
            return owner._open_stream(kwargs, raw=False)

        return _StreamManager(opener)


class SessionAnthropic:
    """An ``anthropic.Anthropic`` client bound to one session: ``messages.create`` and
    ``messages.stream`` take the SDK's keyword arguments (see the module doc).

    A reply is recorded after its usage is reported; one that cannot be recorded raises
    :class:`ReplyNotRecordedError` with the reply as its ``response`` (a stream: at its end,
    ``get_final_message()`` still giving it), so a paid reply is never lost."""

    def __init__(self, client: anthropic.Anthropic, handle: SessionHandle, *,
                 over_budget: OverBudget | None = None,
                 cache_breakpoints: bool = True) -> None:
        self.client = client
        self.handle = handle
        self.over_budget = over_budget
        self.cache_breakpoints = cache_breakpoints
        self.messages = _Messages(self)
        self._ledger = _Ledger(handle)

    def __repr__(self) -> str:
        return f"SessionAnthropic({self.handle.session_id!r})"

    def _prepare(self, kwargs: Mapping[str, Any]) -> None:
        """Check the caller's history against the ledger and append what is new."""
        history = _checked_history(kwargs.get("messages"))
        system = kwargs.get("system")
        new = self._ledger.new_messages(history, None if system is None
                                        else _system_text(system))
        if new:
            self.handle.append(new)

    def _open_stream(self, kwargs: Mapping[str, Any], *, raw: bool) -> SessionMessageStream:
        messages = self.client.messages
        handle = self.handle
        plan, view = handle._plan_call(_takes_tools, self.over_budget, self.cache_breakpoints)

        def start(view: WindowView) -> _MessageAttempt:
            manager = messages.stream(**_messages_params(kwargs, view.system, view.messages,
                                                         plan.tools))
            return _MessageAttempt(manager, manager.__enter__())

        return SessionMessageStream(handle, _rounds_sync(handle, plan, start, view), raw=raw)


def _takes_tools(system: str, messages: list[dict[str, Any]], *,
                 tools: list[dict[str, Any]]) -> None:
    """Stands for a wrapper's model call when a plan is made: it takes the tools."""


# --- Anthropic, asyncio ---------------------------------------------------------------------------

class AsyncSessionMessageStream:
    """The asyncio flavour of :class:`SessionMessageStream` (``async for``,
    ``text_stream``, ``await get_final_message()``)."""

    def __init__(self, handle: AsyncSessionHandle, opened: _Opened, *, raw: bool = False) -> None:
        self._handle = handle
        self._opened = opened
        self._raw = raw
        self._events = self._relay()
        self._final: AnthropicMessage | None = None

    async def _relay(self) -> AsyncIterator[Any]:
        opened = self._opened
        for event in opened.read:
            yield event
        if not opened.done:
            while True:
                try:
                    event = await opened.attempt.next()
                except StopAsyncIteration:
                    break
                yield event
        reply = opened.attempt.reply()
        h = self._handle.sync
        if not opened.done:
            await asyncio.to_thread(h._after_call, reply, opened.view)
        self._final = reply  # get_final_message() has it, even when it cannot be recorded
        await asyncio.to_thread(_record, h, reply, reply)

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for event in self._events:
            if not (self._raw and event.type in _DERIVED_EVENTS):
                yield event

    @property
    async def text_stream(self) -> AsyncIterator[str]:
        async for event in self._events:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                yield event.delta.text

    async def until_done(self) -> None:
        async for _ in self._events:
            pass

    async def get_final_message(self) -> AnthropicMessage:
        await self.until_done()
        assert self._final is not None
        return self._final

    async def get_final_text(self) -> str:
        final = await self.get_final_message()
        return "".join(b.text for b in final.content if b.type == "text")

    async def close(self) -> None:
        await self._opened.attempt.close()

    async def __aenter__(self) -> AsyncSessionMessageStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _AsyncStreamManager:
    def __init__(self, opener: Callable[[], Any]) -> None:
        self._opener = opener
        self._stream: AsyncSessionMessageStream | None = None

    async def __aenter__(self) -> AsyncSessionMessageStream:
        self._stream = await self._opener()
        assert self._stream is not None
        return self._stream

    async def __aexit__(self, *exc: object) -> None:
        if self._stream is not None:
            await self._stream.close()


class _AsyncMessages:
    def __init__(self, owner: AsyncSessionAnthropic) -> None:
        self._owner = owner

    async def create(self, **kwargs: Any) -> Any:
        """``await client.messages.create(**kwargs)`` through the session."""
        owner = self._owner
        await owner._prepare(kwargs)
        if kwargs.get("stream") is True:
            return await owner._open_stream(kwargs, raw=True)
        messages = owner.client.messages

        async def send(system: str, window: list[dict[str, Any]],
                       tools: list[dict[str, Any]]) -> Any:
            return await messages.create(**_messages_params(kwargs, system, window, tools))

        reply = await owner.handle.call(send, over_budget=owner.over_budget,
                                        cache_breakpoints=owner.cache_breakpoints)
        await asyncio.to_thread(_record, owner.handle.sync, reply, reply)
        return reply

    def stream(self, **kwargs: Any) -> _AsyncStreamManager:
        """``async with wrapped.messages.stream(**kwargs) as stream``."""
        owner = self._owner

        async def opener() -> AsyncSessionMessageStream:
            await owner._prepare(kwargs)
            return await owner._open_stream(kwargs, raw=False)

        return _AsyncStreamManager(opener)


class AsyncSessionAnthropic:
    """An ``anthropic.AsyncAnthropic`` client bound to one session (an
    :class:`AsyncSessionHandle`): ``await messages.create(...)``, ``async with
    messages.stream(...)``; a reply that cannot be recorded raises
    :class:`ReplyNotRecordedError` carrying it, as :class:`SessionAnthropic`."""

    def __init__(self, client: anthropic.AsyncAnthropic, handle: AsyncSessionHandle, *,
                 over_budget: OverBudget | None = None,
                 cache_breakpoints: bool = True) -> None:
        self.client = client
        self.handle = handle
        self.over_budget = over_budget
        self.cache_breakpoints = cache_breakpoints
        self.messages = _AsyncMessages(self)
        self._ledger = _Ledger(handle.sync)

    def __repr__(self) -> str:
        return f"AsyncSessionAnthropic({self.handle.session_id!r})"

    async def _prepare(self, kwargs: Mapping[str, Any]) -> None:
        history = _checked_history(kwargs.get("messages"))
        system = kwargs.get("system")
        new = await asyncio.to_thread(self._ledger.new_messages, history,
                                      None if system is None else _system_text(system))
        if new:
            await self.handle.append(new)

    async def _open_stream(self, kwargs: Mapping[str, Any], *,
                          raw: bool) -> AsyncSessionMessageStream:
        messages = self.client.messages
        h = self.handle.sync
        plan, view = await asyncio.to_thread(h._plan_call, _takes_tools, self.over_budget,
                                             self.cache_breakpoints)

        async def start(view: WindowView) -> _AsyncMessageAttempt:
            manager = messages.stream(**_messages_params(kwargs, view.system, view.messages,
                                                         plan.tools))
            return _AsyncMessageAttempt(manager, await manager.__aenter__())

        opened = await _rounds_async(self.handle, plan, start, view)
        return AsyncSessionMessageStream(self.handle, opened, raw=raw)


# --- OpenAI chat completions ----------------------------------------------------------------------

def _openai_history(messages: Any) -> list[Any]:
    """The caller's chat history as plain dicts (the SDK's message objects dumped)."""
    if not isinstance(messages, list | tuple):
        raise InvalidMessageError(f"messages is a list of messages, got "
                                  f"{type(messages).__name__}")
    return [sdk_dict(m) for m in messages]


def _openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan's tools (Anthropic shape) in OpenAI's: the recall tool, when on."""
    return [openai_tool() for tool in tools if tool.get("name") == RECALL_TOOL_NAME]


def _chat_params(kwargs: Mapping[str, Any], system: str, window: list[dict[str, Any]],
                 tools: list[dict[str, Any]]) -> dict[str, Any]:
    params = {k: v for k, v in kwargs.items() if k != "messages"}
    conversation = Conversation(system=system,
                                messages=parse_messages(window, check_pairing=False))
    params["messages"] = to_openai(conversation)
    own = list(kwargs.get("tools") or [])
    if own or tools:
        params["tools"] = [*own, *_openai_tools(tools)]
    return params


def _assistant_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An OpenAI assistant message as the Anthropic blocks the ledger holds (the same
    conversion the caller's copy of it goes through on the next call: a refusal included)."""
    if not any(message.get(name) for name in ("content", "tool_calls", "refusal")):
        return []
    converted = from_openai([message]).messages
    content: list[dict[str, Any]] = converted[0].to_json()["content"] if converted else []
    return content


@dataclass(frozen=True)
class _ChatReply:
    """A chat completion as the handle reads replies: Anthropic ``content``, ``id``, the
    provider's ``usage``, ``model``; ``completion`` is what the caller gets.

    Made without raising, whatever the message holds: its usage must be reported before
    anything can fail. A message that does not convert has no ``content`` (no tool calls for
    the recall round to read) and keeps the error for :meth:`check_converted`."""

    completion: Any
    id: str | None
    model: str | None
    usage: Any
    content: list[dict[str, Any]]
    unconverted: InvalidMessageError | None = None

    @classmethod
    def of(cls, completion: Any) -> _ChatReply:
        choices = getattr(completion, "choices", None) or []
        message = sdk_dict(choices[0].message) if choices else {}
        return cls.made(completion, getattr(completion, "id", None),
                        getattr(completion, "model", None), getattr(completion, "usage", None),
                        {"role": "assistant", **message})

    @classmethod
    def made(cls, completion: Any, reply_id: str | None, model: str | None, usage: Any,
             message: Mapping[str, Any]) -> _ChatReply:
        try:
            return cls(completion, reply_id, model, usage, _assistant_blocks(message))
        except InvalidMessageError as exc:
            return cls(completion, reply_id, model, usage, [], exc)

    def check_converted(self) -> None:
        """Raise the error the message met in conversion, if it met one."""
        if self.unconverted is not None:
            raise self.unconverted


class _ChatAttempt:
    """One streamed chat completion: its chunks, and the reply they add up to."""

    def __init__(self, stream: Any, *, show_usage: bool) -> None:
        self.stream = stream
        self.show_usage = show_usage
        self.id: str | None = None
        self.model: str | None = None
        self.usage: Any = None
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None

    def __next__(self) -> Any:
        while True:
            chunk = next(self.stream)
            self._add(chunk)
            if chunk.choices or self.show_usage:
                return chunk

    def _add(self, chunk: Any) -> None:
        self.id, self.model = self.id or chunk.id, self.model or chunk.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        for choice in chunk.choices[:1]:
            delta = choice.delta
            if delta.content:
                self.text.append(delta.content)
            for call in delta.tool_calls or []:
                entry = self.calls.setdefault(call.index, {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                entry["id"] = call.id or entry["id"]
                if call.function is not None:
                    entry["function"]["name"] += call.function.name or ""
                    entry["function"]["arguments"] += call.function.arguments or ""
            self.finish_reason = choice.finish_reason or self.finish_reason

    def tool_call(self, chunk: Any) -> str | None:
        for choice in chunk.choices[:1]:
            for call in choice.delta.tool_calls or []:
                if call.function is not None and call.function.name:
                    return str(call.function.name)
        return None

    def message(self) -> dict[str, Any]:
        """The assistant message the chunks add up to, in OpenAI's shape."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return message

    def reply(self) -> _ChatReply:
        return _ChatReply.made(None, self.id, self.model, self.usage, self.message())

    def close(self) -> None:
        self.stream.close()


class SessionChatStream:
    """What ``wrapped.chat.completions.create(..., stream=True)`` returns: the final reply's
    ``ChatCompletionChunk`` objects (the usage chunk only when the caller asked for it with
    ``stream_options``); ``message()`` is the assistant message they add up to, in OpenAI's
    shape, once read to the end. Recorded and reported then."""

    def __init__(self, handle: SessionHandle, opened: _Opened) -> None:
        self._handle = handle
        self._opened = opened
        self._events = self._relay()
        self._done = False

    def _relay(self) -> Iterator[Any]:
        opened = self._opened
        attempt: _ChatAttempt = opened.attempt
        yield from opened.read
        if not opened.done:
            yield from _drain(attempt)
        reply = attempt.reply()
        if not opened.done:
            self._handle._after_call(reply, opened.view)
        self._done = True
        _record(self._handle, reply, attempt.message())

    def __iter__(self) -> Iterator[Any]:
        return self._events

    def __next__(self) -> Any:
        return next(self._events)

    def message(self) -> dict[str, Any]:
        """The streamed assistant message (OpenAI's shape): what the caller appends to its
        history. The stream is read to its end first."""
        for _ in self._events:
            pass
        attempt: _ChatAttempt = self._opened.attempt
        return attempt.message()

    def close(self) -> None:
        self._opened.attempt.close()

    def __enter__(self) -> SessionChatStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Completions:
    def __init__(self, owner: SessionOpenAI) -> None:
        self._owner = owner

    def create(self, **kwargs: Any) -> Any:
        """``client.chat.completions.create(**kwargs)`` through the session: the
        ``ChatCompletion`` (``stream=True``: a :class:`SessionChatStream`)."""
        owner = self._owner
        owner._prepare(kwargs)
        completions = owner.client.chat.completions
        handle = owner.handle
        if kwargs.get("stream") is True:
            plan, view = handle._plan_call(_takes_tools, owner.over_budget, False)
            options = dict(kwargs.get("stream_options") or {})
            show_usage = options.get("include_usage") is True
            streamed = {**kwargs, "stream_options": {**options, "include_usage": True}}

            def start(view: WindowView) -> _ChatAttempt:
                params = _chat_params(streamed, view.system, view.messages, plan.tools)
                return _ChatAttempt(completions.create(**params), show_usage=show_usage)

            return SessionChatStream(handle, _rounds_sync(handle, plan, start, view))

        def send(system: str, window: list[dict[str, Any]],
                 tools: list[dict[str, Any]]) -> _ChatReply:
            return _ChatReply.of(completions.create(**_chat_params(kwargs, system, window,
                                                                   tools)))

        reply: _ChatReply = handle.call(send, over_budget=owner.over_budget)
        _record(handle, reply, reply.completion)
        return reply.completion


class _Chat:
    def __init__(self, owner: SessionOpenAI) -> None:
        self.completions = _Completions(owner)


class SessionOpenAI:
    """An ``openai.OpenAI`` client bound to one session: ``chat.completions.create`` takes
    the SDK's keyword arguments and OpenAI-shaped messages (see the module doc). The system
    prompt is the session's: ``system``/``developer`` messages in the history must say the
    same, or be left out.

    A reply is recorded after its usage is reported, refusals included; one that cannot be
    recorded (a store fault, or a message that does not convert) raises
    :class:`ReplyNotRecordedError` with the ``ChatCompletion`` as its ``response`` (a stream:
    the assistant message, as ``message()`` gives it), so a paid reply is never lost."""

    def __init__(self, client: openai.OpenAI, handle: SessionHandle, *,
                 over_budget: OverBudget | None = None) -> None:
        self.client = client
        self.handle = handle
        self.over_budget = over_budget
        self.chat = _Chat(self)
        self._ledger = _Ledger(handle)

    def __repr__(self) -> str:
        return f"SessionOpenAI({self.handle.session_id!r})"

    def _prepare(self, kwargs: Mapping[str, Any]) -> None:
        history = _openai_history(kwargs.get("messages"))
        conversation = from_openai(history)
        # Only leading system/developer messages are the prompt (a later one stays in place as
        # a message of the conversation), so only they are compared with the session's.
        given = leading_system_count(history) > 0
        new = self._ledger.new_messages(conversation.messages,
                                        conversation.system if given else None)
        if new:
            self.handle.append(new)

