"""A scripted model provider that speaks the Anthropic Messages API, for tests, replay and demos.

No API key, no network: the real ``anthropic`` SDK talks to it, so its retries, errors and usage
objects are the real ones. Two ways to use one :class:`FakeProvider`:

- **in process**: ``provider(system, messages)`` sends the request through the SDK over an
  ``httpx2.MockTransport`` and returns the SDK's ``Message`` (or raises the SDK's error) — the
  shape ``SessionHandle.call(fn)`` expects of ``fn``;
- **over HTTP**: ``with provider.serve() as server:`` runs a small local server answering
  ``POST /v1/messages`` (and ``/v1/messages/count_tokens``) at ``server.base_url``, so another
  process (a Celery worker's ``AnthropicSummarizer(base_url=...)``) can use it too.

What makes it useful rather than a stub:

- **Counted differently from the estimator**: it reports a request's size as ``chars /
  chars_per_token`` (default 3.6) plus a fixed ``overhead_tokens`` for the system prompt framing and
  tool definitions, never the ``cl100k`` estimate, so the per-session calibration has real work.
  Images and documents are counted in tokens as the API roughly counts them, never by their
  base64: an image by its pixels (``width × height / 750`` after scaling its long edge to
  1,568 px, at most :data:`IMAGE_TOKENS`, ~1,600; that flat figure when its size cannot be read:
  a URL, a file id, bytes that are not an image), a PDF by its pages (:data:`PDF_PAGE_TOKENS`
  each, pages counted by their page objects, else one per :data:`PDF_BYTES_PER_PAGE`), a text
  document by its text. Blocks of other types (redacted thinking, server tool results, types
  the stand-in does not know) count by their JSON.
- **A context window**: a request over ``context_window`` tokens is rejected with Anthropic's own
  400 body, ``prompt is too long: N tokens > M maximum``.
- **Prompt caching**: a request whose content carries ``cache_control`` breakpoints reports the
  longest prefix cached before (found at a breakpoint or up to 20 blocks before one) as
  ``cache_read_input_tokens`` and the rest up to its last breakpoint as
  ``cache_creation_input_tokens``, so ``input_tokens`` alone undercounts, as it does for real.
- **A script of faults** consumed one per request: ``provider.script(Fault.overloaded(),
  Fault.overloaded(), Fault.overloaded())`` makes the next three requests answer 529, then
  normal service resumes; ``Fault.rate_limited(retry_after=2)``, ``Fault.bad_request()``
  (permanent) and ``provider.fail_always(Fault.bad_request())`` too.
- **Summaries that keep identifiers**: a request from sessionfold's summarizer (either
  provider; read with :func:`~sessionfold.runtime.providers.prompt.parse_prompt`) is answered
  with a short summary naming the identifiers it lists as must-keep and the transcript's most
  frequent ones (see :func:`echo_reply`), so folds pass the retention check as they would with
  a good model. A reply may be a :class:`Refusal`: the Messages API's ``stop_reason:
  "refusal"``, chat completions' ``message.refusal``.
- **Calls held in flight**: ``provider.hold()`` makes requests wait (already counted) until
  ``provider.release()``; ``provider.wait_for_calls(n)`` blocks until ``n`` have arrived — a
  test can act while a worker's summarizer call is in flight. ``latency_s`` slows every call.
- **Tool calls**: ``provider.script_reply(ToolUse("sessionfold_recall", {"query": "ACCT-1"}))``
  makes the next agent request (not a summarizer's) answer with that tool call, as the real API
  does (``stop_reason: "tool_use"``, a ``toolu_`` id, usage); a reply may be text, one
  :class:`ToolUse` or a list of both (blocks in order). A ``reply`` callback may return the same
  to decide from the request. Without a script, replies are text as before.
- **What was asked**: with ``keep_requests=N`` the last N request bodies are kept in
  ``provider.requests`` (tools, messages and all, in the shape they were sent), for a test to
  read what the model was sent.
- **Streaming**: a request with ``"stream": true`` is answered with Server-Sent Events as the
  API sends them (``message_start`` with the usage and its cache fields, ``content_block_start``
  / ``content_block_delta`` (``text_delta``, ``input_json_delta``) / ``content_block_stop`` per
  block, ``message_delta`` with the stop reason and output usage, ``message_stop``), so the
  SDK's ``messages.stream(...)`` and ``create(stream=True)`` work, tool calls included. Faults
  and "prompt is too long" still answer before the stream starts, as an HTTP error.
- **The OpenAI chat shape**: ``POST /v1/chat/completions`` answers as OpenAI does (``choices``,
  ``tool_calls``, ``usage`` with ``prompt_tokens_details.cached_tokens``; ``stream: true`` sends
  ``chat.completion.chunk`` events ending with ``data: [DONE]``, the usage chunk only with
  ``stream_options.include_usage``), so the real ``openai`` SDK works against it. The request is
  read through :func:`~sessionfold.core.messages.from_openai`: reply callbacks and the script see
  it in the Anthropic shape, and it is counted, scripted and faulted as a Messages request is.
  Its prompt cache is OpenAI's, automatic: the longest prefix of messages seen before (of at
  least 1,024 tokens, in steps of 128) is reported as cached. Too long is OpenAI's 400
  ``context_length_exceeded``.
- **Both batch APIs** (``provider.batches``, :mod:`.batches`): Anthropic's Message Batches and
  OpenAI's Batch API with its Files API, each batched request answered as a live one would be
  (faults included) once ``provider.batches.delay_s`` has passed; ``provider.batches.script(
  "expired")`` makes the next batch expire (or be ``cancelled``, or ``failed``).

Example::

    provider = FakeProvider(context_window=50_000)
    reply = provider("You are terse.", [{"role": "user", "content": "hello"}])
    reply.usage.input_tokens          # the provider's own count

    with provider.serve() as server:
        client = anthropic.Anthropic(api_key="fake", base_url=server.base_url, max_retries=0)
        with client.messages.stream(model="m", max_tokens=64, messages=[...]) as stream:
            text = "".join(stream.text_stream)
        chat = openai.OpenAI(api_key="fake", base_url=server.base_url + "/v1", max_retries=0)
        chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import io
import json
import math
import re
import threading
import time
import uuid
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message as AnthropicMessage
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.openai_shape import from_openai
from sessionfold.core.retention import find_identifiers
from sessionfold.core.tokens import IMAGE_TOKENS
from sessionfold.runtime.providers.prompt import parse_prompt

from .batches import BatchDesk

__all__ = [
    "IMAGE_TOKENS",
    "PDF_BYTES_PER_PAGE",
    "PDF_PAGE_TOKENS",
    "FakeProvider",
    "FakeProviderServer",
    "Fault",
    "ProviderAnswer",
    "ProviderStats",
    "Refusal",
    "Reply",
    "ToolUse",
    "echo_reply",
]


@dataclass(frozen=True)
class ToolUse:
    """A tool call the stand-in model makes: ``name`` and ``input`` (``id``: generated, in the
    API's ``toolu_`` form, when not given)."""

    name: str
    input: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None

    def block(self, make_id: Callable[[], str]) -> dict[str, Any]:
        return {"type": "tool_use", "id": self.id or make_id(), "name": self.name,
                "input": dict(self.input)}


@dataclass(frozen=True)
class Refusal:
    """The stand-in model declines, saying ``text``, as each API words a refusal."""

    text: str = "I can't help with that."


#: A reply: the assistant's text, one tool call, or a list of both (content blocks in order),
#: or a refusal.
Reply = str | ToolUse | Refusal | Sequence[str | ToolUse]
#: What a reply function receives (the request body) and returns (the assistant's reply).
ReplyFn = Callable[[Mapping[str, Any]], Reply]

DEFAULT_MODEL = "fake-model-1"
#: How many blocks before a breakpoint the Messages API looks for an earlier cached prefix.
CACHE_LOOKBACK_BLOCKS = 20
#: OpenAI caches a prompt's prefix from this many tokens on, in steps of OPENAI_CACHE_STEP.
OPENAI_CACHE_MIN_TOKENS = 1024
OPENAI_CACHE_STEP = 128
#: Characters per delta of a streamed text or tool input (the API sends a few words at a time).
STREAM_PIECE_CHARS = 24
# IMAGE_TOKENS (core.tokens, the estimator's figure for the same fact): the most an image costs,
# and what one costs whose size is not read (a URL, a file id, bytes that are not an image).
#: The API's rule for an image: width × height / 750 tokens, its long edge scaled to 1,568 px.
IMAGE_PIXELS_PER_TOKEN = 750
IMAGE_MAX_EDGE = 1_568
#: A PDF page: its text and the image of the page (the API says 1,500 to 3,000 tokens a page).
PDF_PAGE_TOKENS = 2_000
#: A PDF whose page objects are not in sight (compressed object streams): a page per 50 KB.
PDF_BYTES_PER_PAGE = 50_000


@dataclass(frozen=True)
class Fault:
    """One scripted failure: the HTTP status, the Anthropic error type and message, and headers."""

    status: int
    error_type: str
    message: str
    retry_after: float | None = None
    #: OpenAI's error ``code`` (``context_length_exceeded``); Anthropic's errors have none.
    code: str | None = None

    @classmethod
    def overloaded(cls) -> Fault:
        return cls(529, "overloaded_error", "Overloaded")

    @classmethod
    def rate_limited(cls, retry_after: float | None = 1.0) -> Fault:
        return cls(429, "rate_limit_error",
                   "Number of request tokens has exceeded your rate limit.", retry_after)

    @classmethod
    def server_error(cls) -> Fault:
        return cls(500, "api_error", "Internal server error")

    @classmethod
    def bad_request(cls, message: str = "messages: text content blocks must be non-empty") -> Fault:
        return cls(400, "invalid_request_error", message)

    @classmethod
    def context_length_exceeded(cls, tokens: int, maximum: int) -> Fault:
        """OpenAI's answer to a request over the context window."""
        return cls(400, "invalid_request_error",
                   f"This model's maximum context length is {maximum} tokens. However, your "
                   f"messages resulted in {tokens} tokens. Please reduce the length of the "
                   "messages.", code="context_length_exceeded")

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}

    def openai_body(self) -> dict[str, Any]:
        """The fault as OpenAI's API words its errors."""
        return {"error": {"message": self.message, "type": self.error_type, "param": None,
                          "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"retry-after": f"{self.retry_after:g}"}


@dataclass(frozen=True)
class ProviderAnswer:
    """One answer: its status and headers, and its JSON ``body`` or, for a streamed request,
    its Server-Sent ``events`` (each one whole frame; ``body`` is then what they add up to)."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any] | None = None
    events: tuple[bytes, ...] | None = None

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.events is not None else "application/json"

    def content(self) -> bytes:
        if self.events is not None:
            return b"".join(self.events)
        return json.dumps(self.body).encode()


@dataclass(frozen=True)
class _Served:
    """A reply as served, before it is written in either API's shape."""

    content: list[dict[str, Any]]
    prompt: int
    cache_read: int
    cache_created: int
    model: str
    chars_per_token: float

    @property
    def output_tokens(self) -> int:
        return max(1, round(sum(_block_chars(b) for b in self.content) / self.chars_per_token))

    @property
    def calls_tools(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.content)

    @property
    def refused(self) -> bool:
        return any(block["type"] == "refusal" for block in self.content)

    def message(self) -> dict[str, Any]:
        """The Messages API's reply (a refusal: its text, ``stop_reason: "refusal"``)."""
        usage = {"input_tokens": self.prompt - self.cache_read - self.cache_created,
                 "output_tokens": self.output_tokens,
                 "cache_read_input_tokens": self.cache_read,
                 "cache_creation_input_tokens": self.cache_created}
        content = [{"type": "text", "text": b["text"]} if b["type"] == "refusal" else b
                   for b in self.content]
        stop = "refusal" if self.refused else "tool_use" if self.calls_tools else "end_turn"
        return {"id": f"msg_fake_{uuid.uuid4().hex[:20]}", "type": "message",
                "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop, "stop_sequence": None, "usage": usage}

    def chat_completion(self) -> dict[str, Any]:
        """OpenAI's chat completion (its ``usage`` counts the whole prompt, cached included)."""
        text = "".join(b["text"] for b in self.content if b["type"] == "text")
        refusal = "".join(b["text"] for b in self.content if b["type"] == "refusal")
        message: dict[str, Any] = {"role": "assistant", "content": text or None,
                                   "refusal": refusal or None}
        calls = [{"id": b["id"], "type": "function",
                  "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
                 for b in self.content if b["type"] == "tool_use"]
        if calls:
            message["tool_calls"] = calls
        output = self.output_tokens
        return {"id": f"chatcmpl-fake{uuid.uuid4().hex[:20]}", "object": "chat.completion",
                "created": int(time.time()), "model": self.model, "system_fingerprint": None,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": self.prompt, "completion_tokens": output,
                          "total_tokens": self.prompt + output,
                          "prompt_tokens_details": {"cached_tokens": self.cache_read,
                                                    "audio_tokens": 0},
                          "completion_tokens_details": {"reasoning_tokens": 0,
                                                        "audio_tokens": 0}}}


@dataclass
class ProviderStats:
    """What the provider saw. ``calls`` counts every request, failed ones included."""

    calls: int = 0
    succeeded: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    #: Prompt tokens (as this provider counts them) of the most recent requests, newest last.
    recent_prompt_tokens: deque[int] = field(default_factory=lambda: deque(maxlen=1000))
    max_prompt_tokens: int = 0


def echo_reply(request: Mapping[str, Any]) -> str:
    """The default reply: short and deterministic, as a cheap model's would be.

    A summarizer request (one carrying a transcript between sessionfold's markers) is answered
    with a summary that keeps identifiers verbatim, as the instruction asks and a good model
    does: those the request lists as must-keep, then the transcript's most frequent ones. Any
    other request gets a sentence naming the request it answers.
    """
    messages = request.get("messages") or []
    last = messages[-1] if messages else {}
    text = _content_text(last.get("content", "")) if isinstance(last, Mapping) else ""
    prompt = parse_prompt(text)
    if prompt is not None:
        keep = [k.strip() for k in prompt.must_keep if k.strip()]
        frequent = [ident for ident, _ in Counter(find_identifiers(text)).most_common(60)]
        identifiers = list(dict.fromkeys([*keep, *frequent]))
        summary = (f"The agent worked through {text.count('[')} transcript entries "
                   f"({len(text)} characters) on its task.")
        return summary + (" Identifiers: " + "; ".join(identifiers) + "." if identifiers else "")
    head = " ".join(text.split())[:160]
    return f"Noted ({len(messages)} messages). Latest: {head}" if head else "Noted."


class FakeProvider:
    """A deterministic stand-in for the Anthropic Messages API (and OpenAI chat completions).
    Thread-safe."""

    def __init__(
        self,
        *,
        context_window: int = 200_000,
        chars_per_token: float = 3.6,
        overhead_tokens: int = 400,
        reply: ReplyFn = echo_reply,
        latency_s: float = 0.0,
        model: str = DEFAULT_MODEL,
        keep_requests: int = 0,
    ) -> None:
        if context_window < 1:
            raise ValueError(f"context_window must be positive, got {context_window}")
        if chars_per_token <= 0:
            raise ValueError(f"chars_per_token must be positive, got {chars_per_token}")
        if overhead_tokens < 0 or latency_s < 0 or keep_requests < 0:
            raise ValueError("overhead_tokens, latency_s and keep_requests must not be negative")
        self.context_window = context_window
        self.chars_per_token = chars_per_token
        self.overhead_tokens = overhead_tokens
        self.reply = reply
        self.latency_s = latency_s
        self.model = model
        self.stats = ProviderStats()
        self._lock = threading.Lock()
        self._script: deque[Fault] = deque()
        self._replies: deque[Reply] = deque()
        self._tool_ids = 0
        #: The last ``keep_requests`` request bodies of /v1/messages, oldest first.
        self.requests: deque[Mapping[str, Any]] = deque(maxlen=keep_requests)
        self._always: Fault | None = None
        self._cached_prefixes: set[str] = set()
        self._client: anthropic.Anthropic | None = None
        self._arrived = threading.Condition(self._lock)
        self._gate = threading.Event()
        self._gate.set()
        self.hold_timeout_s = 60.0
        #: Both batch APIs in front of this provider (:mod:`.batches`).
        self.batches = BatchDesk(self.handle)

    # --- scripting ----------------------------------------------------------------------------

    def script(self, *faults: Fault) -> None:
        """Queue faults: each of the next ``len(faults)`` requests answers with one, in order."""
        with self._lock:
            self._script.extend(faults)

    def script_reply(self, *replies: Reply) -> None:
        """Queue replies: each of the next agent requests answers with one, in order (a
        summarizer's request is answered as always and leaves the queue alone)."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def replies_left(self) -> int:
        """Queued replies (:meth:`script_reply`) not yet played."""
        with self._lock:
            return len(self._replies)

    def fail_always(self, fault: Fault | None) -> None:
        """Answer every request with ``fault`` (None: serve normally again)."""
        with self._lock:
            self._always = fault

    def hold(self) -> None:
        """Make requests wait (after being counted) until :meth:`release`: a call in flight."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def wait_for_calls(self, n: int, timeout_s: float = 30.0) -> bool:
        """Block until at least ``n`` requests arrived (held ones included); False on timeout."""
        with self._arrived:
            return self._arrived.wait_for(lambda: self.stats.calls >= n, timeout=timeout_s)

    # --- counting -----------------------------------------------------------------------------

    def count_tokens(self, request: Mapping[str, Any]) -> int:
        """The request's prompt size as this provider counts it (not the cl100k estimate):
        text by its characters, images and documents by what they show (see the module doc)."""
        chars = len(_system_text(request.get("system")))
        chars += sum(len(json.dumps(t, sort_keys=True)) for t in request.get("tools") or [])
        media = 0
        for message in request.get("messages") or []:
            size = _message_size(message)
            chars += size.chars
            media += size.tokens
        per_message = 3 * len(request.get("messages") or [])
        return self.overhead_tokens + per_message + round(chars / self.chars_per_token) + media

    # --- serving a request --------------------------------------------------------------------

    def handle(self, path: str, request: Mapping[str, Any]) -> tuple[int, dict[str, str],
                                                                      dict[str, Any]]:
        """Answer one API request as JSON: ``(status, headers, body)``. A request asking to
        stream gets the message its events would add up to; :meth:`answer` streams."""
        answer = self._route(path, request, stream=False)
        return answer.status, answer.headers, answer.body or {}

    def answer(self, path: str, request: Mapping[str, Any]) -> ProviderAnswer:
        """Answer one API request as the API would: JSON, or Server-Sent Events when the
        request says ``"stream": true``. Both transports call this."""
        return self._route(path, request, stream=request.get("stream") is True)

    def _route(self, path: str, request: Mapping[str, Any], *, stream: bool) -> ProviderAnswer:
        route = path.split("?", 1)[0].rstrip("/")
        if route.endswith("/v1/messages/count_tokens"):
            return ProviderAnswer(200, {}, {"input_tokens": self.count_tokens(request)})
        if route.endswith("/v1/chat/completions"):
            return self._chat(request, stream=stream)
        if not route.endswith("/v1/messages"):
            return ProviderAnswer(404, {}, {"type": "error", "error": {
                "type": "not_found_error", "message": f"no route {path}"}})
        problem = _malformed(request)
        if problem:
            return ProviderAnswer(400, {}, Fault.bad_request(problem).body())
        served = self._serve(request, request, chat=False)
        if isinstance(served, Fault):
            return ProviderAnswer(served.status, served.headers(), served.body())
        body = served.message()
        if stream:
            return ProviderAnswer(200, {}, body, tuple(_message_events(body)))
        return ProviderAnswer(200, {}, body)

    def _chat(self, request: Mapping[str, Any], *, stream: bool) -> ProviderAnswer:
        """``POST /v1/chat/completions``: read as a Messages request, answered in OpenAI's shape."""
        converted = _messages_request(request)
        if isinstance(converted, str):
            return ProviderAnswer(400, {}, Fault.bad_request(converted).openai_body())
        served = self._serve(converted, request, chat=True)
        if isinstance(served, Fault):
            return ProviderAnswer(served.status, served.headers(), served.openai_body())
        completion = served.chat_completion()
        if stream:
            options = request.get("stream_options")
            usage = isinstance(options, Mapping) and options.get("include_usage") is True
            return ProviderAnswer(200, {}, completion,
                                  tuple(_chat_events(completion, include_usage=usage)))
        return ProviderAnswer(200, {}, completion)

    def _serve(self, request: Mapping[str, Any], sent: Mapping[str, Any], *,
               chat: bool) -> Fault | _Served:
        """The reply to a well-formed request (in the Messages shape; ``sent`` as it came), or
        the fault it meets: counted, held, scripted and cached the same way for both shapes."""
        prompt = self.count_tokens(request)
        with self._lock:
            self.stats.calls += 1
            self._arrived.notify_all()
        # Outside the lock: held and slow requests must not block each other or the counters.
        self._gate.wait(self.hold_timeout_s)
        if self.latency_s:
            time.sleep(self.latency_s)
        with self._lock:
            self.stats.recent_prompt_tokens.append(prompt)
            self.stats.max_prompt_tokens = max(self.stats.max_prompt_tokens, prompt)
            fault = self._script.popleft() if self._script else self._always
            if fault is None and prompt > self.context_window:
                fault = (Fault.context_length_exceeded(prompt, self.context_window) if chat
                         else Fault.bad_request(f"prompt is too long: {prompt} tokens > "
                                                f"{self.context_window} maximum"))
            if fault is not None:
                self.stats.by_status[fault.status] += 1
                return fault
            self.stats.succeeded += 1
            self.stats.by_status[200] += 1
            cached = (0, self._openai_cached(request)) if chat else self._cache_split(
                request, prompt)
            if self.requests.maxlen:
                self.requests.append(sent)
            scripted = (self._replies.popleft()
                        if self._replies and not _is_summarizer_request(request) else None)
        reply = scripted if scripted is not None else self.reply(request)
        content = self._content(reply, self._next_call_id if chat else self._next_tool_id)
        created, read = cached
        return _Served(content=content, prompt=prompt, cache_read=read, cache_created=created,
                       model=str(request.get("model") or self.model),
                       chars_per_token=self.chars_per_token)

    def _content(self, reply: Reply,
                 make_id: Callable[[], str] | None = None) -> list[dict[str, Any]]:
        """The content blocks of ``reply``, tool calls given fresh ids where they have none."""
        if isinstance(reply, Refusal):
            return [{"type": "refusal", "text": reply.text}]
        parts: Sequence[str | ToolUse] = [reply] if isinstance(reply, str | ToolUse) else reply
        blocks = [{"type": "text", "text": part} if isinstance(part, str)
                  else part.block(make_id or self._next_tool_id) for part in parts]
        return blocks or [{"type": "text", "text": "Noted."}]

    def _next_tool_id(self) -> str:
        with self._lock:
            self._tool_ids += 1
            return f"toolu_fake_{self._tool_ids:06d}_{uuid.uuid4().hex[:8]}"

    def _next_call_id(self) -> str:
        with self._lock:
            self._tool_ids += 1
            return f"call_fake_{self._tool_ids:06d}_{uuid.uuid4().hex[:8]}"

    def _cache_split(self, request: Mapping[str, Any], prompt: int) -> tuple[int, int]:
        """(cache write, cache read) tokens, as the Messages API bills a request with
        ``cache_control`` breakpoints.

        Each breakpoint looks for the longest prefix cached before, at its own block or at
        one of the :data:`CACHE_LOOKBACK_BLOCKS` blocks before it; what the longest hit covers
        is read, the rest up to the last breakpoint written, and every breakpoint's prefix is
        cached from then on. Markers are not part of the content: a prefix cached with its
        marker on its last block is hit by a request whose marker has moved further on.
        Called under the lock: the set of seen prefixes is shared by every thread.
        """
        units = _cache_units(request)
        marks = [k for k, unit in enumerate(units) if unit.marked]
        if not marks:
            return 0, 0
        head = {"system": request.get("system") if isinstance(request.get("system"), str)
                else None, "tools": _unmarked(request.get("tools"))}
        digest = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
        keys: list[str] = []
        for unit in units:
            digest.update(unit.key.encode())
            keys.append("anthropic:" + digest.copy().hexdigest())
        hit = -1
        for mark in marks:
            for k in range(mark, max(-1, mark - CACHE_LOOKBACK_BLOCKS), -1):
                if keys[k] in self._cached_prefixes:
                    hit = max(hit, k)
                    break
        self._cached_prefixes.update(keys[m] for m in marks)
        last = marks[-1]
        read = self.count_tokens(_prefix_request(request, units[hit])) if hit >= 0 else 0
        through = self.count_tokens(_prefix_request(request, units[last])) if last > hit else 0
        read = min(prompt, read)
        return max(0, min(prompt - read, through - read)), read

    def _openai_cached(self, request: Mapping[str, Any]) -> int:
        """OpenAI's automatic prompt cache: tokens of the longest prefix of messages (after the
        system prompt and tools) seen in an earlier request, of at least
        :data:`OPENAI_CACHE_MIN_TOKENS`, in steps of :data:`OPENAI_CACHE_STEP`. Under the lock."""
        messages = list(request.get("messages") or [])
        head = {"system": request.get("system"), "tools": request.get("tools")}
        digest = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
        longest = 0
        for i, message in enumerate(messages, start=1):
            digest.update(json.dumps(message, sort_keys=True).encode())
            key = "openai:" + digest.copy().hexdigest()
            if key in self._cached_prefixes:
                longest = i
            else:
                self._cached_prefixes.add(key)
        if not longest:
            return 0
        tokens = self.count_tokens({**head, "messages": messages[:longest]})
        return tokens // OPENAI_CACHE_STEP * OPENAI_CACHE_STEP if (
            tokens >= OPENAI_CACHE_MIN_TOKENS) else 0

    # --- in process ---------------------------------------------------------------------------

    def anthropic_client(self) -> anthropic.Anthropic:
        """A real SDK client wired to this provider in process (no retries: the caller decides)."""
        if self._client is None:
            transport = httpx2.MockTransport(self._mock_handler)
            self._client = anthropic.Anthropic(
                api_key="sk-fake", base_url="http://fake-provider.invalid", max_retries=0,
                http_client=httpx2.Client(transport=transport))
        return self._client

    def __call__(self, system: str, messages: Sequence[Mapping[str, Any]], *,
                 max_tokens: int = 1024, **kwargs: Any) -> AnthropicMessage:
        """One model call through the real SDK; raises the SDK's own errors."""
        create: Any = self.anthropic_client().messages.create
        params: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens,
                                  "messages": list(messages), **kwargs}
        if system:
            params["system"] = system
        return create(**params)  # type: ignore[no-any-return]

    def _mock_handler(self, request: httpx2.Request) -> httpx2.Response:
        if self.batches.owns(request.url.path):
            batch = self.batches.handle(request.method, request.url.path, request.content,
                                        request.headers.get("content-type"))
            return httpx2.Response(batch.status, content=batch.content, headers={
                **batch.headers, "content-type": batch.content_type,
                "request-id": _request_id()})
        answer = self.answer(request.url.path, json.loads(request.content or b"{}"))
        return httpx2.Response(answer.status, content=answer.content(), headers={
            **answer.headers, "content-type": answer.content_type, "request-id": _request_id()})

    # --- over HTTP ----------------------------------------------------------------------------

    @contextmanager
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[FakeProviderServer]:
        """Serve this provider over HTTP for the ``with`` block (port 0: a free port)."""
        server = FakeProviderServer(self, host, port)
        server.start()
        try:
            yield server
        finally:
            server.stop()


class FakeProviderServer:
    """A local HTTP server for one :class:`FakeProvider` (threaded: concurrent requests overlap)."""

    def __init__(self, provider: FakeProvider, host: str = "127.0.0.1", port: int = 0) -> None:
        self.provider = provider
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(provider))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="fake-provider", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _handler_for(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1 with Content-Length on every answer: the SDK keeps connections alive.
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if not provider.batches.owns(self.path):
                self._answer(404, {}, {"type": "error", "error": {
                    "type": "not_found_error", "message": f"no route {self.path}"}})
                return
            self._batch("GET", b"")

        def _batch(self, method: str, raw: bytes) -> None:
            answer = provider.batches.handle(method, self.path, raw,
                                             self.headers.get("content-type"))
            self.send_response(answer.status)
            self.send_header("content-type", answer.content_type)
            self.send_header("content-length", str(len(answer.content)))
            self.send_header("request-id", _request_id())
            self.end_headers()
            self.wfile.write(answer.content)

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            if provider.batches.owns(self.path):
                self._batch("POST", raw)
                return
            try:
                request = json.loads(raw)
            except json.JSONDecodeError:
                self._answer(400, {}, Fault.bad_request("request body is not JSON").body())
                return
            answer = provider.answer(self.path, request)
            try:
                if answer.events is None:
                    self._answer(answer.status, answer.headers, answer.body)
                else:
                    self._stream(answer.headers, answer.events)
            except (BrokenPipeError, ConnectionResetError):
                # The client stopped waiting (its timeout): there is no one to answer.
                self.close_connection = True

        def _stream(self, headers: Mapping[str, str], events: Sequence[bytes]) -> None:
            # Chunked, one event per chunk, flushed: the client reads each as it is written.
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("request-id", _request_id())
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            for event in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

        def _answer(self, status: int, headers: Mapping[str, str], body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("request-id", _request_id())
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: tests and replay print their own progress

    return Handler


# --- the two APIs' shapes -----------------------------------------------------------------------

def _messages_request(request: Mapping[str, Any]) -> dict[str, Any] | str:
    """A chat completions request as the Messages request it amounts to, or why OpenAI would
    refuse it."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: field required (a non-empty list)"
    try:
        conversation = from_openai(messages)
    except InvalidInputError as exc:
        return f"messages: {exc}"
    if not conversation.messages:
        return "messages: at least one user or assistant message is required"
    tools = []
    for i, tool in enumerate(request.get("tools") or []):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            return f"tools[{i}]: a function tool needs a function with a name"
        tools.append({"name": function["name"], "description": function.get("description", ""),
                      "input_schema": function.get("parameters") or {"type": "object"}})
    converted: dict[str, Any] = {"model": request.get("model"), "system": conversation.system,
                                 "messages": [m.to_json() for m in conversation.messages]}
    if tools:
        converted["tools"] = tools
    return converted


def _pieces(text: str) -> list[str]:
    """``text`` cut into the small deltas a stream sends (at least one, maybe empty)."""
    return [text[i:i + STREAM_PIECE_CHARS]
            for i in range(0, len(text), STREAM_PIECE_CHARS)] or [""]


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {body}\n\n".encode()


def _message_events(message: Mapping[str, Any]) -> Iterator[bytes]:
    """The Messages API's stream of ``message``, event by event, as the API sends it."""
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": 1}}
    yield _sse("message_start", {"type": "message_start", "message": start})
    yield _sse("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        first: dict[str, Any]
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"])]
        else:
            first = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": piece}
                      for piece in ["", *_pieces(json.dumps(block["input"]))]]
        yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                                           "content_block": first})
        for delta in deltas:
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                               "delta": delta})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    # The usage on message_delta is cumulative: the whole reply's, input counts included.
    yield _sse("message_delta", {"type": "message_delta", "usage": usage, "delta": {
        "stop_reason": message["stop_reason"], "stop_sequence": None}})
    yield _sse("message_stop", {"type": "message_stop"})


def _chat_events(completion: Mapping[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """OpenAI's stream of ``completion``: ``chat.completion.chunk`` events, then the usage
    chunk when asked for, then ``[DONE]``."""
    head = {"id": completion["id"], "object": "chat.completion.chunk",
            "created": completion["created"], "model": completion["model"],
            "system_fingerprint": None, **({"usage": None} if include_usage else {})}
    (choice,) = completion["choices"]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse(None, {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    if message["refusal"]:
        yield chunk({"refusal": message["refusal"]})
    if message["content"]:
        for piece in _pieces(message["content"]):
            yield chunk({"content": piece})
    for index, call in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"],
                                                  "arguments": ""}}]})
        for piece in _pieces(call["function"]["arguments"]):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield _sse(None, {**head, "choices": [], "usage": completion["usage"]})
    yield _sse(None, "[DONE]")


# --- helpers ----------------------------------------------------------------------------------

def _malformed(request: Mapping[str, Any]) -> str:
    """What the real API would reject in the request's shape ("" when it is well formed)."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: field required (a non-empty list)"
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: must be 'user' or 'assistant'"
        if not isinstance(message.get("content"), str | list):
            return f"messages.{i}.content: must be a string or a list of blocks"
    return ""


def _block_chars(block: Mapping[str, Any]) -> int:
    if block["type"] in ("text", "refusal"):
        return len(block["text"])
    return len(block["name"]) + len(json.dumps(block["input"]))


def _is_summarizer_request(request: Mapping[str, Any]) -> bool:
    """A request from sessionfold's summarizer: its transcript between nonce markers."""
    messages = request.get("messages") or []
    last = messages[-1] if messages else {}
    return isinstance(last, Mapping) and parse_prompt(_content_text(last.get("content"))) \
        is not None


def _request_id() -> str:
    return f"req_fake_{uuid.uuid4().hex[:16]}"


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "".join(str(b.get("text", "")) for b in system if isinstance(b, Mapping))
    return ""


def _content_text(content: Any) -> str:
    """What ``content`` reads as, for the replies and the summarizer check (its size is
    :func:`_content_size`'s)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "thinking":
            parts.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            parts.append(str(block.get("name", "")) + json.dumps(block.get("input", {})))
        elif kind == "tool_result":
            parts.append(_content_text(block.get("content", "")))
        else:  # images, documents, redacted thinking: their JSON (sizes: _content_size)
            parts.append(json.dumps(block, sort_keys=True))
    return "\n".join(parts)


# --- counting a request as the API roughly does --------------------------------------------------

@dataclass(frozen=True)
class _Size:
    """What a piece of a request weighs: ``chars`` of text (counted at ``chars_per_token``) and
    ``tokens`` counted as such (images and documents)."""

    chars: int = 0
    tokens: int = 0

    def __add__(self, other: _Size) -> _Size:
        return _Size(self.chars + other.chars, self.tokens + other.tokens)


def _message_size(message: Any) -> _Size:
    if not isinstance(message, Mapping):
        return _Size()
    return _content_size(message.get("content", ""))


def _content_size(content: Any) -> _Size:
    if isinstance(content, str):
        return _Size(len(content))
    blocks = [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []
    size = _Size(max(0, len(blocks) - 1))  # a separator between two blocks, as text reads
    for block in blocks:
        size += _block_size(block)
    return size


def _block_size(block: Mapping[str, Any]) -> _Size:
    kind = block.get("type")
    if kind == "text":
        return _Size(len(str(block.get("text", ""))))
    if kind == "thinking":
        return _Size(len(str(block.get("thinking", ""))))
    if kind == "tool_use":
        return _Size(len(str(block.get("name", ""))) + len(json.dumps(block.get("input", {}))))
    if kind == "tool_result":
        return _content_size(block.get("content", ""))
    source = block.get("source")
    if kind == "image" and isinstance(source, Mapping):
        data = source.get("data")
        return _Size(tokens=_image_tokens(data) if source.get("type") == "base64"
                     and isinstance(data, str) else IMAGE_TOKENS)
    if kind == "document" and isinstance(source, Mapping):
        return _document_size(source)
    # Redacted thinking, server tool results, types not known here: their JSON for their size.
    return _Size(len(json.dumps(block, sort_keys=True)))


def _document_size(source: Mapping[str, Any]) -> _Size:
    """A document: a PDF by its pages, plain text by its text, content blocks by theirs; one
    the stand-in cannot see (a URL, a file id) as a page."""
    data = source.get("data")
    if source.get("type") == "base64" and isinstance(data, str):
        return _Size(tokens=_pdf_tokens(data))
    if source.get("type") == "text" and isinstance(data, str):
        return _Size(len(data))
    if source.get("type") == "content":
        return _content_size(source.get("content", ""))
    return _Size(tokens=PDF_PAGE_TOKENS)


def _decoded(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return None


# A request's images are counted again for each cached prefix and on every call that resends
# them: each distinct one is decoded once (a str caches its own hash, so a hit is cheap).
@functools.lru_cache(maxsize=512)
def _image_tokens(data: str) -> int:
    """An image's tokens by its pixels, as the API counts them; :data:`IMAGE_TOKENS` when its
    size cannot be read."""
    raw = _decoded(data)
    size = _image_pixels(raw) if raw else None
    if size is None:
        return IMAGE_TOKENS
    width, height = size
    scale = min(1.0, IMAGE_MAX_EDGE / max(width, height, 1))
    pixels = (width * scale) * (height * scale)
    return max(1, min(IMAGE_TOKENS, math.ceil(pixels / IMAGE_PIXELS_PER_TOKEN)))


def _image_pixels(raw: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the image's header (Pillow reads no more than that); None when
    the bytes are not an image Pillow knows, or Pillow is missing."""
    try:
        from PIL import Image
    except ImportError:  # Pillow is the demo extra's: without it, the flat figure
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a huge image warns of a decompression bomb
            with Image.open(io.BytesIO(raw)) as image:
                width, height = image.size
    except Exception:  # not an image, or one Pillow refuses: counted at the flat figure
        return None
    return (width, height) if width > 0 and height > 0 else None


_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


@functools.lru_cache(maxsize=128)
def _pdf_tokens(data: str) -> int:
    """A PDF's tokens: :data:`PDF_PAGE_TOKENS` a page, its pages counted by their page objects,
    or by its size when none is in sight (they may sit in compressed object streams)."""
    raw = _decoded(data)
    pages = len(_PDF_PAGE.findall(raw)) if raw else 0
    if not pages:
        size = len(raw) if raw else len(data) * 3 // 4
        pages = max(1, math.ceil(size / PDF_BYTES_PER_PAGE))
    return pages * PDF_PAGE_TOKENS


@dataclass(frozen=True)
class _CacheUnit:
    """One block of a request, in the order the prompt cache reads it: the system prompt's
    blocks (when it is a list), then each message's (string content is one text block)."""

    message: int  # -1 for a system block
    block: int
    key: str  # the block as content: without its marker, with its message's position and role
    marked: bool


def _unmarked(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def _cache_units(request: Mapping[str, Any]) -> list[_CacheUnit]:
    units: list[_CacheUnit] = []
    system = request.get("system")
    if isinstance(system, list):
        for j, block in enumerate(system):
            marked = isinstance(block, Mapping) and "cache_control" in block
            units.append(_CacheUnit(-1, j, json.dumps(["system", _unmarked(block)],
                                                      sort_keys=True), marked))
    for i, message in enumerate(request.get("messages") or []):
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else (
            content if isinstance(content, list) else [])
        for j, block in enumerate(blocks):
            marked = isinstance(block, Mapping) and "cache_control" in block
            key = json.dumps([i, message.get("role"), _unmarked(block)], sort_keys=True)
            units.append(_CacheUnit(i, j, key, marked))
    return units


def _prefix_request(request: Mapping[str, Any], unit: _CacheUnit) -> dict[str, Any]:
    """The request cut after ``unit`` (for counting the tokens of a cached prefix)."""
    system = request.get("system")
    messages = list(request.get("messages") or [])
    if unit.message < 0:
        return {"system": list(system or [])[:unit.block + 1], "tools": request.get("tools"),
                "messages": []}
    message = messages[unit.message]
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return {"system": system, "tools": request.get("tools"),
            "messages": [*messages[:unit.message],
                         {**message, "content": blocks[:unit.block + 1]}]}
