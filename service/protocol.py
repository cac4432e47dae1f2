"""The HTTP protocol ``sessionfold serve`` runs: uvicorn's httptools protocol with a bound on the
request head.

llhttp (under httptools) keeps a request's head in memory however long it grows, header by
header: a client can send megabytes of one header, or tens of thousands of headers, and the
server holds them all before the app sees the request (uvicorn bounds the head only for its
``h11`` protocol, ``h11_max_incomplete_event_size``). :class:`BoundedHttpToolsProtocol` counts
the bytes a head has taken, from the second read of it on, and answers 431 (connection closed)
once they pass the limit while the head is still incomplete (the answer is followed by a
half-close, and what the client still sends is read and dropped for at most
:data:`LINGER_S` before the connection closes: closed at once, a client still writing gets a
reset that may discard the 431 before it reads it); the limit is that same uvicorn
setting, set from ``SESSIONFOLD_API_MAX_HEADER_BYTES`` (:func:`server_options`). A head may
hold at most one read (256 KiB) beyond the limit. What completes under it is checked again, field
by field, by :class:`~.boundary.BoundaryMiddleware` (the number of fields, its size).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sessionfold.runtime.settings import Settings, env_name
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .errors import ErrorSpec, error_body

__all__ = ["BoundedHttpToolsProtocol", "server_options"]

#: uvicorn's own default for the h11 protocol's head, used when the setting is absent.
_DEFAULT_HEAD_BYTES = 16 * 1024
#: How long a refused head's connection is drained (read, dropped) before it is closed.
LINGER_S = 2.0


def server_options(settings: Settings) -> dict[str, Any]:
    """The ``uvicorn.Config`` options that serve the API within ``settings``' limits."""
    return {"http": BoundedHttpToolsProtocol,
            "h11_max_incomplete_event_size": settings.api_max_header_bytes}


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """httptools with the request head bounded (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_limit = self.config.h11_max_incomplete_event_size or _DEFAULT_HEAD_BYTES
        self._in_head = False
        self._head_bytes = 0
        self._began_in_this_read = False
        self._refused = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        self._began_in_this_read = True

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the rest of a refused head: dropped until the connection closes
        continuing = self._in_head
        self._began_in_this_read = False
        super().data_received(data)
        # Only a read that both started and ended inside one head is all head: the read that
        # began a message may hold the end of the one before, and the read that completed a
        # head may hold its body. So each counted read is head, and a head is refused within
        # one read of the limit.
        if continuing and self._in_head and not self._began_in_this_read:
            self._head_bytes += len(data)
            if self._head_bytes > self._head_limit and not self.transport.is_closing():
                self._refuse_head()

    def _refuse_head(self) -> None:
        message = (f"the request's head is larger than the API reads: at most "
                   f"{self._head_limit:,} bytes of request line and headers "
                   f"({env_name('api_max_header_bytes')})")
        body = json.dumps(error_body(ErrorSpec(431, "invalid_request", "headers-too-large"),
                                     message)).encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n"
            b"connection: close\r\n\r\n" + body)
        self._refused = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)
