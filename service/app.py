"""The ASGI app of ``sessionfold serve``: :func:`create_app`.

::

    app = create_app(Settings())             # uvicorn runs it; the lifespan connects
    app = create_app(settings, client=c)     # a test lends its own client (not closed here)

The lifespan joins the host's metrics (before the first metric is recorded), connects the
library client (store, usage publisher, Redis), and starts the process's one long-poll listener.
Every request passes the boundary (:mod:`.boundary`: its head, its key and its body's size are
checked before the body is read); every error leaves as the one JSON shape of :mod:`.errors`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sessionfold.client import Client, connect
from sessionfold.core.errors import SessionfoldError
from sessionfold.runtime.collector import freeze_startup_objects
from sessionfold.runtime.exporter import HostMetrics, start_host_metrics
from sessionfold.runtime.settings import Settings
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import Scope

from . import admin, calls, ops, routes
from .auth import KeyChecker
from .boundary import BoundaryMiddleware, Limits
from .encoded import EncodedWindows
from .errors import ApiError, ErrorSpec, error_answer, error_body
from .metrics import MetricsMiddleware, api_metrics
from .schemas import COMPONENTS
from .state import ApiState
from .watch import WindowWatcher

__all__ = ["API_TITLE", "create_app"]

log = logging.getLogger(__name__)

API_TITLE = "sessionfold"
_DESCRIPTION = """Background context compaction for long-lived LLM agents, over HTTP.

Every `/v1` route takes `Authorization: Bearer <API key>` (`sessionfold keys create TENANT`);
session ids live inside the key's tenant. Errors have one shape:
`{"error": {"type": ..., "reason": ..., "message": ...}}`."""


def _version() -> str:
    try:
        return version("sessionfold")
    except PackageNotFoundError:  # pragma: no cover (a source tree without metadata)
        return "0"


def create_app(settings: Settings, *, client: Client | None = None) -> FastAPI:
    """The API for ``settings``; ``client`` lends a connected client (it is not closed)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        exporter: HostMetrics | None = None
        owned = client is None
        if owned:
            exporter = start_host_metrics(settings, "api")
        api_metrics()  # registered now, in the mode the exporter chose
        connected = client if client is not None else await anyio.to_thread.run_sync(
            connect, settings)
        store = connected.store
        state = ApiState(settings=settings, client=connected,
                         watcher=WindowWatcher.for_store(
                             store, poll_interval_s=settings.api_poll_interval_s),
                         windows=EncodedWindows(store),
                         keys=KeyChecker(store, cache_s=settings.api_key_cache_s),
                         owns_client=owned)
        await state.watcher.start()
        app.state.sessionfold = state
        if owned:
            # Start-up is done: the collector need not walk it again (a full collection that
            # did paused a full-decode window read for ~90 ms, see bench/RESULTS.md, B2).
            freeze_startup_objects()
        try:
            yield
        finally:
            await state.watcher.close()
            await anyio.to_thread.run_sync(state.close)
            if exporter is not None:
                exporter.close()

    app = FastAPI(title=API_TITLE, version=_version(), description=_DESCRIPTION,
                  lifespan=lifespan)
    app.add_middleware(BoundaryMiddleware, limits=Limits.from_settings(settings))
    app.add_middleware(MetricsMiddleware)  # added last, so outermost: refusals are counted
    app.include_router(routes.router)
    app.include_router(calls.router)
    app.include_router(admin.router)
    app.include_router(ops.router)
    _install_error_handlers(app)
    _install_components(app)
    return app


def _install_components(app: FastAPI) -> None:
    """The document's shared schemas (the message shapes), which the bodies refer to."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = FastAPI.openapi(app)  # built once, then served from app.openapi_schema
            document["components"]["schemas"].update(COMPONENTS)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def _install_error_handlers(app: FastAPI) -> None:
    async def library(_: Request, exc: Exception) -> JSONResponse:
        status, body, headers = error_answer(exc)
        return JSONResponse(body, status_code=status, headers=headers)

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        parts = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err.get("loc", ()))
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        spec = ErrorSpec(422, "invalid_request", "invalid-request")
        return JSONResponse(error_body(spec, "; ".join(parts) or "invalid request"),
                            status_code=422)

    async def http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        kinds = {404: ("not_found", "no-such-route"), 405: ("invalid_request",
                                                           "method-not-allowed")}
        type_, reason = kinds.get(exc.status_code, ("invalid_request", "http-error"))
        spec = ErrorSpec(exc.status_code, type_, reason)
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # The router names the methods of the one route it tried; the path may have others.
            headers["Allow"] = ", ".join(_methods_of(app, request.scope))
        return JSONResponse(error_body(spec, str(exc.detail)), status_code=exc.status_code,
                            headers=headers)

    app.add_exception_handler(SessionfoldError, library)
    app.add_exception_handler(ApiError, library)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http)
    app.add_exception_handler(Exception, library)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _methods_of(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route of ``app`` answers at the request's path (what a 405's
    ``Allow`` lists), asked of the routes as the router asks them."""
    return [method for method in _METHODS
            if any(route.matches({**scope, "method": method})[0] is Match.FULL
                   for route in app.router.routes)]
