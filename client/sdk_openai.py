"""A drop-in wrapper of the ``openai`` SDK's chat completions: :class:`SessionOpenAI`.

``wrapped.chat.completions.create(**kwargs)`` takes the SDK's keyword arguments and
OpenAI-shaped messages, and does what :class:`~sessionfold.client.sdk_anthropic.SessionAnthropic`
does for the Messages API: appends only what of the caller's history is new
(:mod:`.sdk_history`), sends the compacted window (converted with
:func:`~sessionfold.core.openai_write.to_openai`; the recall tool as an OpenAI function tool
beside the caller's), folds inline and retries once on overflow and answers recall rounds
itself (the call loop, :mod:`.call_loop`), reports the usage and records the reply (converted
with :func:`~sessionfold.core.openai_shape.from_openai`). ``stream=True`` gives a
:class:`SessionChatStream` of the final reply's chunks (:mod:`.stream_rounds`); the usage
chunk reaches the caller only when it asked for it with ``stream_options``, as the SDK's.

The ``openai`` package is not imported here: the wrapper calls the client it is given.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sessionfold.core.errors import InvalidMessageError
from sessionfold.core.frame import RECALL_TOOL_NAME
from sessionfold.core.messages import Conversation, parse_messages, sdk_dict
from sessionfold.core.openai_shape import from_openai, leading_system_count
from sessionfold.core.openai_write import to_openai

from .call_loop import SendRequest
from .call_plan import OverBudget
from .recall import openai_tool
from .sdk_history import HistoryLedger, ReplyNotRecordedError, record_reply
from .session import SessionHandle
from .stream_rounds import Opened, drain, open_rounds

if TYPE_CHECKING:
    import openai

__all__ = ["SessionChatStream", "SessionOpenAI", "assistant_blocks"]


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


def assistant_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An OpenAI assistant message as the Anthropic blocks the ledger holds (the same
    conversion the caller's copy of it goes through on the next call: a refusal included);
    the HTTP API records a chat completion's reply with it too."""
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
            return cls(completion, reply_id, model, usage, assistant_blocks(message))
        except InvalidMessageError as exc:
            return cls(completion, reply_id, model, usage, [], exc)

    def check_converted(self) -> None:
        """Raise the error the message met in conversion, if it met one."""
        if self.unconverted is not None:
            raise self.unconverted


def _record(handle: SessionHandle, reply: _ChatReply, response: Any) -> None:
    """:func:`~.sdk_history.record_reply` for a chat completion: one whose message did not
    convert is not recorded either (:class:`ReplyNotRecordedError`, carrying ``response``)."""
    try:
        reply.check_converted()
    except InvalidMessageError as exc:
        raise ReplyNotRecordedError(handle.session_id, response, exc) from exc
    record_reply(handle, reply, response)


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

    def __init__(self, handle: SessionHandle, opened: Opened) -> None:
        self._handle = handle
        self._opened = opened
        self._events = self._relay()
        self._done = False

    def _relay(self) -> Iterator[Any]:
        opened = self._opened
        attempt: _ChatAttempt = opened.attempt
        yield from opened.read
        if not opened.done:
            yield from drain(attempt)
        reply = opened.finish()
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
            loop = handle.open_call(over_budget=owner.over_budget)
            options = dict(kwargs.get("stream_options") or {})
            show_usage = options.get("include_usage") is True
            streamed = {**kwargs, "stream_options": {**options, "include_usage": True}}

            def start(step: SendRequest) -> _ChatAttempt:
                params = _chat_params(streamed, step.view.system, step.view.messages,
                                      step.tools())
                return _ChatAttempt(completions.create(**params), show_usage=show_usage)

            return SessionChatStream(handle, open_rounds(loop, start))

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
        self._ledger = HistoryLedger(handle)

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


