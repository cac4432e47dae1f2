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
- **A context window**: a request over ``context_window`` tokens is rejected with Anthropic's own
  400 body, ``prompt is too long: N tokens > M maximum``.
- **Prompt caching**: a request whose content carries ``cache_control`` reports the prefix up to
  the last marker as ``cache_read_input_tokens`` when that prefix was seen before (else as
  ``cache_creation_input_tokens``), so ``input_tokens`` alone undercounts, as it does for real.
- **A script of faults** consumed one per request: ``provider.script(Fault.overloaded(),
  Fault.overloaded(), Fault.overloaded())`` makes the next three requests answer 529, then
  normal service resumes; ``Fault.rate_limited(retry_after=2)``, ``Fault.bad_request()``
  (permanent) and ``provider.fail_always(Fault.bad_request())`` too.
- **Summaries that keep identifiers**: a request from sessionfold's ``AnthropicSummarizer`` is
  answered with a short summary naming the identifiers it lists as must-keep and the
  transcript's most frequent ones (see :func:`echo_reply`), so folds pass the retention check
  as they would with a good model.
- **Calls held in flight**: ``provider.hold()`` makes requests wait (already counted) until
  ``provider.release()``; ``provider.wait_for_calls(n)`` blocks until ``n`` have arrived — a
  test can act while a worker's summarizer call is in flight. ``latency_s`` slows every call.

Example::

    provider = FakeProvider(context_window=50_000)
    reply = provider("You are terse.", [{"role": "user", "content": "hello"}])
    reply.usage.input_tokens          # the provider's own count

    with provider.serve() as server:
        client = anthropic.Anthropic(api_key="fake", base_url=server.base_url, max_retries=0)
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message as AnthropicMessage
from sessionfold.core.retention import find_identifiers

__all__ = [
    "FakeProvider",
    "FakeProviderServer",
    "Fault",
    "ProviderStats",
    "echo_reply",
]

#: What a reply function receives (the request body) and returns (the assistant's text).
ReplyFn = Callable[[Mapping[str, Any]], str]

DEFAULT_MODEL = "fake-model-1"


@dataclass(frozen=True)
class Fault:
    """One scripted failure: the HTTP status, the Anthropic error type and message, and headers."""

    status: int
    error_type: str
    message: str
    retry_after: float | None = None

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

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"retry-after": f"{self.retry_after:g}"}


@dataclass
class ProviderStats:
    """What the provider saw. ``calls`` counts every request, failed ones included."""

    calls: int = 0
    succeeded: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    #: Prompt tokens (as this provider counts them) of the most recent requests, newest last.
    recent_prompt_tokens: deque[int] = field(default_factory=lambda: deque(maxlen=1000))
    max_prompt_tokens: int = 0


# The identifiers a summarizer request asks to keep, between nonce markers (sessionfold's
# AnthropicSummarizer writes ``<<<must-keep-NONCE>>>`` ... ``<<<end-must-keep-NONCE>>>``).
_MUST_KEEP = re.compile(r"<<<must-keep-(?P<nonce>[^>\s]+)>>>\n(?P<body>.*?)\n"
                        r"<<<end-must-keep-(?P=nonce)>>>", re.DOTALL)


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
    if "<<<transcript-" in text:
        keep = [line.removeprefix("- ").strip() for match in _MUST_KEEP.finditer(text)
                for line in match["body"].splitlines() if line.strip()]
        frequent = [ident for ident, _ in Counter(find_identifiers(text)).most_common(60)]
        identifiers = list(dict.fromkeys([*keep, *frequent]))
        summary = (f"The agent worked through {text.count('[')} transcript entries "
                   f"({len(text)} characters) on its task.")
        return summary + (" Identifiers: " + "; ".join(identifiers) + "." if identifiers else "")
    head = " ".join(text.split())[:160]
    return f"Noted ({len(messages)} messages). Latest: {head}" if head else "Noted."


class FakeProvider:
    """A deterministic stand-in for the Anthropic Messages API. Thread-safe."""

    def __init__(
        self,
        *,
        context_window: int = 200_000,
        chars_per_token: float = 3.6,
        overhead_tokens: int = 400,
        reply: ReplyFn = echo_reply,
        latency_s: float = 0.0,
        model: str = DEFAULT_MODEL,
    ) -> None:
        if context_window < 1:
            raise ValueError(f"context_window must be positive, got {context_window}")
        if chars_per_token <= 0:
            raise ValueError(f"chars_per_token must be positive, got {chars_per_token}")
        if overhead_tokens < 0 or latency_s < 0:
            raise ValueError("overhead_tokens and latency_s must not be negative")
        self.context_window = context_window
        self.chars_per_token = chars_per_token
        self.overhead_tokens = overhead_tokens
        self.reply = reply
        self.latency_s = latency_s
        self.model = model
        self.stats = ProviderStats()
        self._lock = threading.Lock()
        self._script: deque[Fault] = deque()
        self._always: Fault | None = None
        self._cached_prefixes: set[str] = set()
        self._client: anthropic.Anthropic | None = None
        self._arrived = threading.Condition(self._lock)
        self._gate = threading.Event()
        self._gate.set()
        self.hold_timeout_s = 60.0

    # --- scripting ----------------------------------------------------------------------------

    def script(self, *faults: Fault) -> None:
        """Queue faults: each of the next ``len(faults)`` requests answers with one, in order."""
        with self._lock:
            self._script.extend(faults)

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
        """The request's prompt size as this provider counts it (not the cl100k estimate)."""
        chars = len(_system_text(request.get("system")))
        chars += sum(len(json.dumps(t, sort_keys=True)) for t in request.get("tools") or [])
        for message in request.get("messages") or []:
            chars += _message_chars(message)
        per_message = 3 * len(request.get("messages") or [])
        return self.overhead_tokens + per_message + round(chars / self.chars_per_token)

    # --- serving a request --------------------------------------------------------------------

    def handle(self, path: str, request: Mapping[str, Any]) -> tuple[int, dict[str, str],
                                                                      dict[str, Any]]:
        """Answer one API request: ``(status, headers, body)``. Both transports call this."""
        if path.rstrip("/").endswith("/v1/messages/count_tokens"):
            return 200, {}, {"input_tokens": self.count_tokens(request)}
        if not path.rstrip("/").endswith("/v1/messages"):
            return 404, {}, {"type": "error", "error": {"type": "not_found_error",
                                                        "message": f"no route {path}"}}
        problem = _malformed(request)
        if problem:
            return 400, {}, Fault.bad_request(problem).body()
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
                fault = Fault.bad_request(
                    f"prompt is too long: {prompt} tokens > {self.context_window} maximum")
            if fault is not None:
                self.stats.by_status[fault.status] += 1
                return fault.status, fault.headers(), fault.body()
            self.stats.succeeded += 1
            self.stats.by_status[200] += 1
            cached = self._cache_split(request, prompt)
        text = self.reply(request)
        output = max(1, round(len(text) / self.chars_per_token))
        read, created = cached
        usage = {"input_tokens": prompt - read - created, "output_tokens": output,
                 "cache_read_input_tokens": read, "cache_creation_input_tokens": created}
        body = {"id": f"msg_fake_{uuid.uuid4().hex[:20]}", "type": "message",
                "role": "assistant", "model": str(request.get("model") or self.model),
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                "stop_sequence": None, "usage": usage}
        return 200, {}, body

    def _cache_split(self, request: Mapping[str, Any], prompt: int) -> tuple[int, int]:
        """(cache read, cache write) tokens for the prefix up to the last cache_control marker.

        Called under the lock: the set of seen prefixes is shared by every thread.
        """
        prefix = _cached_prefix(request)
        if prefix is None:
            return 0, 0
        tokens = min(prompt, self.count_tokens(prefix))
        digest = hashlib.sha256(json.dumps(prefix, sort_keys=True).encode()).hexdigest()
        if digest in self._cached_prefixes:
            return tokens, 0
        self._cached_prefixes.add(digest)
        return 0, tokens

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
        status, headers, body = self.handle(request.url.path, json.loads(request.content or b"{}"))
        return httpx2.Response(status, headers={**headers, "request-id": _request_id()},
                               json=body)

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

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            try:
                request = json.loads(raw)
            except json.JSONDecodeError:
                self._answer(400, {}, Fault.bad_request("request body is not JSON").body())
                return
            self._answer(*provider.handle(self.path, request))

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


def _request_id() -> str:
    return f"req_fake_{uuid.uuid4().hex[:16]}"


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "".join(str(b.get("text", "")) for b in system if isinstance(b, Mapping))
    return ""


def _content_text(content: Any) -> str:
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
        else:  # images, documents, redacted thinking: their JSON stands in for their size
            parts.append(json.dumps(block, sort_keys=True))
    return "\n".join(parts)


def _message_chars(message: Any) -> int:
    if not isinstance(message, Mapping):
        return 0
    return len(_content_text(message.get("content", "")))


def _has_marker(value: Any) -> bool:
    if isinstance(value, Mapping):
        return "cache_control" in value
    return False


def _cached_prefix(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The request cut after its last ``cache_control`` marker, or None without a marker."""
    messages = list(request.get("messages") or [])
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content") if isinstance(messages[i], Mapping) else None
        if not isinstance(content, list):
            continue
        for j in range(len(content) - 1, -1, -1):
            if _has_marker(content[j]):
                head = [*messages[:i], {**messages[i], "content": content[:j + 1]}]
                return {"system": request.get("system"), "tools": request.get("tools"),
                        "messages": head}
    system = request.get("system")
    if isinstance(system, list) and any(_has_marker(b) for b in system):
        return {"system": system, "tools": request.get("tools"), "messages": []}
    return None
