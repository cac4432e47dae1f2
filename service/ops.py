"""Routes without a tenant: ``/healthz`` (no auth) and ``/metrics`` (Prometheus text).

Both run their blocking part on threads of their own (:func:`ops_limiter`), not on the
default thread pool that the store calls of the tenant routes share: when thousands of
app servers reconnect their long-polls at once, each new one reads its session's state on that
pool, and a probe queued behind them would answer in seconds (an orchestrator would take the
process for dead, and the storm would grow).
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sessionfold.core.errors import SessionfoldError
from sessionfold.runtime.metrics import exposition
from sessionfold.runtime.redis_conn import mapped_errors

from .errors import logged_failure
from .models import ErrorOut, HealthOut, HealthPart
from .state import ApiState, State

__all__ = ["ops_limiter", "router"]

router = APIRouter(responses={431: {"model": ErrorOut, "description": "more header fields, "
                                                                   "or a longer head, than "
                                                                   "the API reads"}})
_OPS_LIMITER: anyio.CapacityLimiter | None = None


def ops_limiter() -> anyio.CapacityLimiter:
    """The two threads ``/healthz`` and ``/metrics`` run on (made on first use, in the loop)."""
    global _OPS_LIMITER
    if _OPS_LIMITER is None:
        _OPS_LIMITER = anyio.CapacityLimiter(2)
    return _OPS_LIMITER


@router.get("/healthz", response_model=HealthOut,
            responses={503: {"model": HealthOut, "description": "the store or Redis is away"}},
            summary="Whether the store and Redis answer (no auth)")
async def healthz(state: State) -> Any:
    store, redis = await anyio.to_thread.run_sync(_check, state, limiter=ops_limiter())
    out = HealthOut(status="ok" if store.ok and redis.ok else "unavailable", store=store,
                    redis=redis, long_poll=state.watcher.mode)
    return JSONResponse(out.model_dump(mode="json"), status_code=200 if out.status == "ok"
                        else 503)


def _check(state: ApiState) -> tuple[HealthPart, HealthPart]:
    # A failure's text (the driver's, naming hosts and ports) goes to the log under an error
    # id; the probe's answer says what is away and the id.
    try:
        store = HealthPart(ok=True, detail=f"schema {state.store.check_schema()}")
    except SessionfoldError as exc:
        store = HealthPart(ok=False, detail=logged_failure(exc, "/healthz: the store").message)
    client = state.redis()
    if client is None:
        return store, HealthPart(ok=False, detail="no Redis configured or started")
    try:
        with mapped_errors("answering /healthz"):
            client.ping()
        redis = HealthPart(ok=True, detail="ping answered")
    except SessionfoldError as exc:
        redis = HealthPart(ok=False, detail=logged_failure(exc, "/healthz: Redis").message)
    return store, redis


@router.get("/metrics", response_class=Response, summary="Prometheus metrics (text format)",
            responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}},
                             "description": "the host's metrics"}})
async def metrics() -> Response:
    body = await anyio.to_thread.run_sync(exposition, limiter=ops_limiter())
    return Response(body, media_type=CONTENT_TYPE_LATEST)
