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

The parts are modules of one idea each: :mod:`.faults` (:class:`Fault`), :mod:`.replies`
(what the model says), :mod:`.request_size` (counting), :mod:`.prompt_cache` (both APIs'
caches), :mod:`.messages_api` and :mod:`.chat_completions` (each API's wire format, its stream
included; :mod:`.sse` frames both), :mod:`.transports` (in process, and the HTTP server). This
module holds :class:`FakeProvider`, which scripts, holds, counts and routes requests, and
exports the names callers import from it (:data:`__all__`).

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

import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message as AnthropicMessage
from sessionfold.core.errors import InvalidInputError

from .batches import BatchDesk
from .chat_completions import chat_events, completion_body, messages_request
from .faults import Fault
from .messages_api import message_body, message_events, request_problem
from .prompt_cache import PromptCache
from .replies import (
    Refusal,
    Reply,
    ReplyFn,
    Served,
    ToolUse,
    echo_reply,
    is_summarizer_request,
    reply_blocks,
)
from .request_size import IMAGE_TOKENS, PDF_BYTES_PER_PAGE, PDF_PAGE_TOKENS, count_request
from .transports import FakeProviderServer, ProviderAnswer, mock_handler

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
    "ReplyFn",
    "ToolUse",
    "echo_reply",
]

DEFAULT_MODEL = "fake-model-1"


@dataclass
class ProviderStats:
    """What the provider saw. ``calls`` counts every request, failed ones included."""

    calls: int = 0
    succeeded: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    #: Prompt tokens (as this provider counts them) of the most recent requests, newest last.
    recent_prompt_tokens: deque[int] = field(default_factory=lambda: deque(maxlen=1000))
    max_prompt_tokens: int = 0


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
            raise InvalidInputError(f"context_window must be positive, got {context_window}")
        if chars_per_token <= 0:
            raise InvalidInputError(f"chars_per_token must be positive, got {chars_per_token}")
        if overhead_tokens < 0 or latency_s < 0 or keep_requests < 0:
            raise InvalidInputError(
                "overhead_tokens, latency_s and keep_requests must not be negative")
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
        #: Both APIs' cached prefixes, shared by every thread (used under the lock).
        self._cache = PromptCache(self.count_tokens)
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
        return count_request(request, overhead_tokens=self.overhead_tokens,
                             chars_per_token=self.chars_per_token)

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
        problem = request_problem(request)
        if problem:
            return ProviderAnswer(400, {}, Fault.bad_request(problem).body())
        served = self._serve(request, request, chat=False)
        if isinstance(served, Fault):
            return ProviderAnswer(served.status, served.headers(), served.body())
        body = message_body(served)
        if stream:
            return ProviderAnswer(200, {}, body, tuple(message_events(body)))
        return ProviderAnswer(200, {}, body)

    def _chat(self, request: Mapping[str, Any], *, stream: bool) -> ProviderAnswer:
        """``POST /v1/chat/completions``: read as a Messages request, answered in OpenAI's shape."""
        converted = messages_request(request)
        if isinstance(converted, str):
            return ProviderAnswer(400, {}, Fault.bad_request(converted).openai_body())
        served = self._serve(converted, request, chat=True)
        if isinstance(served, Fault):
            return ProviderAnswer(served.status, served.headers(), served.openai_body())
        completion = completion_body(served)
        if stream:
            options = request.get("stream_options")
            usage = isinstance(options, Mapping) and options.get("include_usage") is True
            return ProviderAnswer(200, {}, completion,
                                  tuple(chat_events(completion, include_usage=usage)))
        return ProviderAnswer(200, {}, completion)

    def _serve(self, request: Mapping[str, Any], sent: Mapping[str, Any], *,
               chat: bool) -> Fault | Served:
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
            cached = (0, self._cache.openai_cached(request)) if chat else (
                self._cache.messages_split(request, prompt))
            if self.requests.maxlen:
                self.requests.append(sent)
            scripted = (self._replies.popleft()
                        if self._replies and not is_summarizer_request(request) else None)
        reply = scripted if scripted is not None else self.reply(request)
        content = reply_blocks(reply, self._next_call_id if chat else self._next_tool_id)
        created, read = cached
        return Served(content=content, prompt=prompt, cache_read=read, cache_created=created,
                      model=str(request.get("model") or self.model),
                      chars_per_token=self.chars_per_token)

    def _next_tool_id(self) -> str:
        with self._lock:
            self._tool_ids += 1
            return f"toolu_fake_{self._tool_ids:06d}_{uuid.uuid4().hex[:8]}"

    def _next_call_id(self) -> str:
        with self._lock:
            self._tool_ids += 1
            return f"call_fake_{self._tool_ids:06d}_{uuid.uuid4().hex[:8]}"

    # --- in process ---------------------------------------------------------------------------

    def anthropic_client(self) -> anthropic.Anthropic:
        """A real SDK client wired to this provider in process (no retries: the caller decides)."""
        if self._client is None:
            transport = httpx2.MockTransport(mock_handler(self))
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
