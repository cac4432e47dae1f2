"""What a request may make an API process hold before anything of it is trusted: its head, its
key, its body (pure ASGI, ahead of routing).

In order, before the app sees the request:

1. **Headers**: more header fields than ``api_max_headers``, or a head (request line and
   headers) over ``api_max_header_bytes``, is answered 431. (The server's protocol,
   :mod:`.protocol`, already refuses a head that grows past the limit before it is complete:
   this catches the rest, whatever server runs the app.)
2. **The key**: every ``/v1`` route needs one. It is checked here, *before any of the body is
   read*: a caller without a live key is answered 401 and its body is never read into memory
   (the server discards what still arrives). FastAPI reads and parses a body before it solves
   a route's dependencies, so the check cannot wait for the route. The caller's
   :class:`~.auth.Principal` is left in the request's state for the routes.
3. **The declared size**: a ``Content-Length`` over ``api_max_body_bytes`` is answered 413
   naming the limit, before the body is read.
4. **The body**: read here, counting, and answered 413 as soon as it passes the limit (a chunked
   body declares no size); the app is then handed the body read.

Every refusal is the one error shape of :mod:`.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessionfold.core.errors import SessionfoldError
from sessionfold.runtime.settings import Settings, env_name
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import Principal
from .errors import ApiError, error_answer

__all__ = ["BoundaryMiddleware", "Limits"]

_API_PREFIX = "/v1"


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one request (see the module doc), from the settings."""

    max_body_bytes: int
    max_header_bytes: int
    max_headers: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(settings.api_max_body_bytes, settings.api_max_header_bytes,
                   settings.api_max_headers)


class _BodyTooLarge(Exception):
    """The body passed the limit while it was read."""


class BoundaryMiddleware:
    """Refuses, before the body is read, what no route should hold (see the module doc)."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_head(scope)
            if _needs_key(scope):
                scope.setdefault("state", {})["principal"] = await _principal(scope)
            declared = _declared_length(scope)
            if declared is not None and declared > self.limits.max_body_bytes:
                raise self._too_large()
            if (declared or 0) > 0 or _header(scope, b"transfer-encoding") is not None:
                body = await _read_body(receive, self.limits.max_body_bytes)
                if body is None:
                    return  # the client went away: nobody to answer
                receive = _replay(body, receive)
        except _BodyTooLarge:
            await _answer(self._too_large(), scope, send)
            return
        except (ApiError, SessionfoldError) as exc:
            await _answer(exc, scope, send)
            return
        await self.app(scope, receive, send)

    def _check_head(self, scope: Scope) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") \
            + sum(len(name) + len(value) + 4 for name, value in headers)
        if len(headers) > self.limits.max_headers or size > self.limits.max_header_bytes:
            raise ApiError(
                431, "invalid_request", "headers-too-large",
                f"the request's head is larger than the API reads: at most "
                f"{self.limits.max_headers:,} header fields ({env_name('api_max_headers')}) "
                f"and {self.limits.max_header_bytes:,} bytes of request line and headers "
                f"({env_name('api_max_header_bytes')}); got {len(headers):,} fields, "
                f"{size:,} bytes")

    def _too_large(self) -> ApiError:
        return ApiError(413, "invalid_request", "body-too-large",
                        f"the request body is larger than the API reads: at most "
                        f"{self.limits.max_body_bytes:,} bytes "
                        f"({env_name('api_max_body_bytes')})")


def _needs_key(scope: Scope) -> bool:
    path: str = scope["path"]
    return path == _API_PREFIX or path.startswith(_API_PREFIX + "/")


async def _principal(scope: Scope) -> Principal:
    state = getattr(scope["app"].state, "sessionfold", None)
    if state is None:  # the lifespan has not connected the store yet
        raise ApiError(503, "unavailable", "starting", "the API is starting; try again")
    authorization = _header(scope, b"authorization")
    principal: Principal = await state.keys.principal(
        authorization.decode("latin-1") if authorization is not None else None)
    return principal


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _declared_length(scope: Scope) -> int | None:
    raw = _header(scope, b"content-length")
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 19:  # (the server's parser refuses most of these)
        raise ApiError(400, "invalid_request", "invalid-request",
                       f"Content-Length must be a number of bytes, got {raw[:40]!r}")
    return int(raw)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body (None when the client disconnected first); _BodyTooLarge past
    ``limit``, without reading further."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app ``body`` in one message, then whatever comes next (a
    disconnect, which a long response listens for)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(exc: BaseException, scope: Scope, send: Send) -> None:
    status, body, headers = error_answer(exc)

    async def nothing() -> Message:  # the response never reads the request
        return {"type": "http.disconnect"}

    await JSONResponse(body, status_code=status, headers=headers)(scope, nothing, send)
