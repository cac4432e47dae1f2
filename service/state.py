"""What one API process holds for its whole life, and the dependencies routes take from it.

One :class:`ApiState` per process (made in the app's lifespan): the library client (the store,
the usage publisher, the Redis URL), the long-poll watcher, the encoded-window cache and the key
checker. Nothing here is Celery's: a fold asked for over HTTP is a nudge to the scheduler on the
usage bus (the client's publisher), never a job enqueued by the API.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sessionfold.client import Client
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore

from .auth import KeyChecker, Principal
from .encoded import EncodedWindows
from .errors import ApiError
from .watch import WindowWatcher

__all__ = ["Admin", "ApiState", "Caller", "api_state"]


@dataclass
class ApiState:
    settings: Settings
    client: Client
    watcher: WindowWatcher
    windows: EncodedWindows
    keys: KeyChecker
    #: Close the client when the app stops (False: the caller lent it, a test).
    owns_client: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _redis: Any = field(default=None, repr=False)

    @property
    def store(self) -> SessionStore:
        return self.client.store

    def redis(self) -> Any:
        """A short-timeout Redis client for ``/healthz`` (None without Redis)."""
        from sessionfold.runtime.wiring import inline_redis_client

        with self._lock:
            if self._redis is None and self.client.redis_url:
                self._redis = inline_redis_client(self.settings, self.client.redis_url)
            return self._redis

    def close(self) -> None:
        with self._lock:
            if self._redis is not None:
                self._redis.close()
        if self.owns_client:
            self.client.close()


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.sessionfold
    return state


_bearer = HTTPBearer(auto_error=False, description="an API key made by "
                     "`sessionfold keys create TENANT` (sfk_...)")


async def _caller(request: Request,
                  credentials: Annotated[HTTPAuthorizationCredentials | None,
                                         Depends(_bearer)]) -> Principal:
    # The boundary checked the key before the body was read (.boundary) and left the caller
    # here; the bearer scheme above only documents the header in the OpenAPI document.
    principal = getattr(request.state, "principal", None)
    if isinstance(principal, Principal):
        return principal
    header = f"Bearer {credentials.credentials}" if credentials is not None else None
    principal = await api_state(request).keys.principal(header)
    request.state.principal = principal
    return principal


async def _admin(principal: Annotated[Principal, Depends(_caller)]) -> Principal:
    if not principal.admin:
        raise ApiError(403, "permission", "admin-only",
                       "this route needs an admin key (`sessionfold keys create TENANT --admin`)")
    return principal


Caller = Annotated[Principal, Depends(_caller)]
Admin = Annotated[Principal, Depends(_admin)]
State = Annotated[ApiState, Depends(api_state)]
