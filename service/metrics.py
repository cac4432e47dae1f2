"""The API's own metrics: request rate, latency and errors per route, and waiting long-polls.

``sessionfold_api_requests_total{route,method,status}`` (status class ``2xx``..``5xx``),
``sessionfold_api_request_duration_seconds{route,method}`` and
``sessionfold_api_long_polls_waiting`` (a gauge, summed over the host's API processes). The route
label is the route's template (``/v1/sessions/{session_id}/window``), never the requested path:
a session id in a label would make one time series per session. A long-poll (a request naming
an ETag to wait past) counts as ``<route> (long-poll)``, so its wait stays out of the route's
latency. Unmatched paths count as ``unmatched``.

The API process joins the host's metrics directory like every other sessionfold process
(:mod:`sessionfold.runtime.exporter`), so these add up with the workers' and the scheduler's
on the host's exporter port; the API also serves the same sums on its own ``/metrics`` route,
which is what a scrape of the API's Service in Kubernetes reaches.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ApiMetrics", "MetricsMiddleware", "api_metrics"]

#: A request that names an ETag to wait past is a long-poll (``?after=...&wait=...``).
_LONG_POLL = b"after="
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                    30, 60)


class ApiMetrics:
    """The API's metric set, registered in ``registry`` (default: the process's; tests pass a
    fresh one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = REGISTRY if registry is None else registry
        self.requests = Counter("sessionfold_api_requests",
                                "HTTP requests answered, by route, method and status class",
                                ["route", "method", "status"], registry=reg)
        self.duration = Histogram("sessionfold_api_request_duration_seconds",
                                  "HTTP request latency (long-polls under their own route name)",
                                  ["route", "method"], buckets=_LATENCY_BUCKETS, registry=reg)
        self.waiting = Gauge("sessionfold_api_long_polls_waiting",
                             "Long-poll requests waiting for a window change",
                             multiprocess_mode="livesum", registry=reg)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, f"{status // 100}xx").inc()
        self.duration.labels(route, method).observe(seconds)


_default: ApiMetrics | None = None
_lock = threading.Lock()


def api_metrics() -> ApiMetrics:
    """The process's API metrics, made on first use (after the host's multiprocess mode is on,
    so their values go to the host's directory)."""
    global _default
    with _lock:
        if _default is None:
            _default = ApiMetrics()
        return _default


class MetricsMiddleware:
    """Times every HTTP request and counts it under its route template (pure ASGI, so a
    streaming or long-poll response is timed to its last byte)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            if _LONG_POLL in scope.get("query_string", b""):
                template += " (long-poll)"  # waits on purpose: not mixed into the latency
            api_metrics().observe(template, scope.get("method", ""), status,
                                  time.perf_counter() - started)
