"""Drop-in wrappers of the ``anthropic`` SDK: the agent's loop reads like plain SDK code, the
session does the rest.

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
``anthropic.AsyncAnthropic`` and an :class:`~sessionfold.client.aio.AsyncSessionHandle`
(:class:`~sessionfold.client.sdk_openai.SessionOpenAI` does the same for OpenAI's chat
completions). Each call takes the SDK's own keyword arguments and:

1. **appends only what is new** of the caller's whole history, which must begin with what the
   ledger holds (:mod:`.sdk_history`: :class:`~.sdk_history.HistoryMismatchError` otherwise,
   nothing appended; a ``system=`` that is not the session's is refused the same way, and
   leaving ``system`` out sends the session's);
2. **sends the compacted window**, not the caller's history: the session's window with the new
   messages at its end, and the caller's tools with ``sessionfold_recall`` beside them when the
   call offers it. Requests carry prompt-cache breakpoints (``cache_control``) after the
   window's stable head and after its last message
   (:func:`~sessionfold.client.window_view.place_cache_breakpoints`): the calls between two
   folds read the cached prefix at a tenth of the input price, and the first call after a fold
   writes the new one. ``cache_breakpoints=False`` sends none;
3. **reports the provider's usage** for the window the request was built from, then **records
   the reply** in the ledger; one that cannot be recorded raises
   :class:`~.sdk_history.ReplyNotRecordedError` carrying it, so a paid reply is never lost;
4. **folds inline and retries once** on "prompt is too long", and **answers recall itself**
   (a recall-only reply is answered from the ledger and the model called again): the call loop
   of every ``call()`` (:mod:`.call_loop`), not a copy. A reply that mixes recall with the
   agent's tools goes back to the caller, whose next message answers the agent's tools only:
   the recall answers are added to it before it is appended.

**Streaming** (``messages.stream(...)``, ``create(stream=True)``) goes through the same steps
(:mod:`.stream_rounds`). With recall off the caller reads the provider's events as they come;
with recall on, a reply's events reach the caller once it is known not to be a recall-only one,
so recall rounds happen out of its sight. Its usage is reported and the reply recorded when the
stream has been read to its end (a stream closed early records nothing).

The ``anthropic`` package is not imported here: the wrappers call the client they are given, so
``import sessionfold.client`` does not need it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .aio import AsyncSessionHandle
from .call_loop import SendRequest
from .call_plan import OverBudget
from .sdk_history import HistoryLedger, checked_history, record_reply, system_text
from .session import SessionHandle
from .stream_rounds import Opened, drain, drain_async, open_rounds, open_rounds_async

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message as AnthropicMessage

__all__ = [
    "AsyncSessionAnthropic",
    "AsyncSessionMessageStream",
    "SessionAnthropic",
    "SessionMessageStream",
]

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


class _MessageAttemptBase:
    """What the sync and async attempts share: the stream, its manager, how a reply reads."""

    def __init__(self, manager: Any, stream: Any) -> None:
        self.manager = manager
        self.stream = stream
        self.closed = False

    def tool_call(self, event: Any) -> str | None:
        return _tool_started(event)

    def reply(self) -> Any:
        return self.stream.current_message_snapshot


class _MessageAttempt(_MessageAttemptBase):
    """One SDK ``MessageStream`` as the rounds read it."""

    def __next__(self) -> Any:
        return next(self.stream)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.manager.__exit__(None, None, None)


class _AsyncMessageAttempt(_MessageAttemptBase):
    """One SDK ``AsyncMessageStream`` as the rounds read it."""

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

    def __init__(self, handle: SessionHandle, opened: Opened, *, raw: bool = False) -> None:
        self._handle = handle
        self._opened = opened
        self._raw = raw
        self._events = self._relay()
        self._final: AnthropicMessage | None = None

    def _relay(self) -> Iterator[Any]:
        opened = self._opened
        yield from opened.read
        if not opened.done:
            yield from drain(opened.attempt)
        self._finish()

    def _finish(self) -> None:
        reply = self._opened.finish()
        self._final = reply  # get_final_message() has it, even when it cannot be recorded
        record_reply(self._handle, reply, reply)

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
        record_reply(owner.handle, reply, reply)
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
        self._ledger = HistoryLedger(handle)

    def __repr__(self) -> str:
        return f"SessionAnthropic({self.handle.session_id!r})"

    def _prepare(self, kwargs: Mapping[str, Any]) -> None:
        """Check the caller's history against the ledger and append what is new."""
        history = checked_history(kwargs.get("messages"))
        system = kwargs.get("system")
        new = self._ledger.new_messages(history, None if system is None
                                        else system_text(system))
        if new:
            self.handle.append(new)

    def _open_stream(self, kwargs: Mapping[str, Any], *, raw: bool) -> SessionMessageStream:
        messages = self.client.messages
        handle = self.handle
        loop = handle.open_call(over_budget=self.over_budget,
                                cache_breakpoints=self.cache_breakpoints)

        def start(step: SendRequest) -> _MessageAttempt:
            manager = messages.stream(**_messages_params(kwargs, step.view.system,
                                                         step.view.messages, step.tools()))
            return _MessageAttempt(manager, manager.__enter__())

        return SessionMessageStream(handle, open_rounds(loop, start), raw=raw)



# --- Anthropic, asyncio ---------------------------------------------------------------------------

class AsyncSessionMessageStream:
    """The asyncio flavour of :class:`SessionMessageStream` (``async for``,
    ``text_stream``, ``await get_final_message()``)."""

    def __init__(self, handle: AsyncSessionHandle, opened: Opened, *, raw: bool = False) -> None:
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
            async for event in drain_async(opened.attempt):
                yield event
        reply = await opened.finish_async()
        self._final = reply  # get_final_message() has it, even when it cannot be recorded
        await asyncio.to_thread(record_reply, self._handle.sync, reply, reply)

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
        await asyncio.to_thread(record_reply, owner.handle.sync, reply, reply)
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
        self._ledger = HistoryLedger(handle.sync)

    def __repr__(self) -> str:
        return f"AsyncSessionAnthropic({self.handle.session_id!r})"

    async def _prepare(self, kwargs: Mapping[str, Any]) -> None:
        history = checked_history(kwargs.get("messages"))
        system = kwargs.get("system")
        new = await asyncio.to_thread(self._ledger.new_messages, history,
                                      None if system is None else system_text(system))
        if new:
            await self.handle.append(new)

    async def _open_stream(self, kwargs: Mapping[str, Any], *,
                          raw: bool) -> AsyncSessionMessageStream:
        messages = self.client.messages
        loop = self.handle.open_call(over_budget=self.over_budget,
                                     cache_breakpoints=self.cache_breakpoints)

        async def start(step: SendRequest) -> _AsyncMessageAttempt:
            manager = messages.stream(**_messages_params(kwargs, step.view.system,
                                                         step.view.messages, step.tools()))
            return _AsyncMessageAttempt(manager, await manager.__aenter__())

        opened = await open_rounds_async(loop, start)
        return AsyncSessionMessageStream(self.handle, opened, raw=raw)

