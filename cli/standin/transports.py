"""How a stand-in provider's answers reach a client: in process through an
``httpx2.MockTransport`` (:func:`mock_handler`), or over HTTP from a small local server
(:class:`FakeProviderServer`).

Both hand a request to the provider's :meth:`~.fakeprovider.FakeProvider.answer` (or, for a
batch API path, to its :class:`~.batches.BatchDesk`) and write the :class:`ProviderAnswer` back:
JSON with a ``content-length``, or Server-Sent Events one chunk per event, flushed as written.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import httpx2

from .batches import BatchDesk
from .faults import Fault

__all__ = ["AnsweringProvider", "FakeProviderServer", "ProviderAnswer", "mock_handler"]


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


class AnsweringProvider(Protocol):
    """What a transport needs of the provider behind it."""

    @property
    def batches(self) -> BatchDesk: ...

    def answer(self, path: str, request: Mapping[str, Any]) -> ProviderAnswer:
        """Answer one API request as the API would: JSON, or Server-Sent Events."""
        ...


def _request_id() -> str:
    return f"req_fake_{uuid.uuid4().hex[:16]}"


def mock_handler(provider: AnsweringProvider) -> Callable[[httpx2.Request], httpx2.Response]:
    """The handler of an ``httpx2.MockTransport`` that answers with ``provider``, in process."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        if provider.batches.owns(request.url.path):
            batch = provider.batches.handle(request.method, request.url.path, request.content,
                                            request.headers.get("content-type"))
            return httpx2.Response(batch.status, content=batch.content, headers={
                **batch.headers, "content-type": batch.content_type,
                "request-id": _request_id()})
        answer = provider.answer(request.url.path, json.loads(request.content or b"{}"))
        return httpx2.Response(answer.status, content=answer.content(), headers={
            **answer.headers, "content-type": answer.content_type, "request-id": _request_id()})

    return handle


class FakeProviderServer:
    """A local HTTP server for one :class:`~.fakeprovider.FakeProvider` (threaded: concurrent
    requests overlap)."""

    def __init__(self, provider: AnsweringProvider, host: str = "127.0.0.1",
                 port: int = 0) -> None:
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


def _handler_for(provider: AnsweringProvider) -> type[BaseHTTPRequestHandler]:
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
