"""What one API process holds for its whole life, and the dependencies routes take from it.

One :class:`ApiState` per process (made in the app's lifespan): the library client (the store,
the usage publisher, the Redis URL), the long-poll watcher, the encoded-window cache, the key
checker and, made on first use, the Celery app that manual folds are enqueued through (the
same ``enqueue`` ``sessionfold fold`` and the scheduler use).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sessionfold.client import Client
from sessionfold.store import SessionStore
from sessionfold.workers.settings import Settings

from .auth import KeyChecker, Principal
from .encoded import EncodedWindows
from .errors import ApiError
from .watch import WindowWatcher

__all__ = ["Admin", "ApiState", "Caller", "api_state"]

Enqueue = Callable[[str, int | None, str, str | None], str]


@dataclass
class ApiState:
    settings: Settings
    client: Client
    watcher: WindowWatcher
    windows: EncodedWindows
    keys: KeyChecker
    #: Close the client when the app stops (False: the caller lent it, a test).
    owns_client: bool = True
    _enqueue: Enqueue | None = field(default=None, repr=False)
    _celery: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _redis: Any = field(default=None, repr=False)

    @property
    def store(self) -> SessionStore:
        return self.client.store

    def enqueue(self) -> Enqueue:
        """The fold-job ``enqueue`` of the runtime (made on first use; needs Redis)."""
        from sessionfold.core.errors import RedisUnavailableError
        from sessionfold.workers.celery_app import make_celery, make_enqueue

        with self._lock:
            if self._enqueue is None:
                if not self.client.redis_url:
                    raise RedisUnavailableError("no Redis: manual folds are enqueued on the "
                                                "usage bus's Redis (set REDIS_URL)")
                self._celery = make_celery(self.settings, redis_url=self.client.redis_url)
                self._enqueue = make_enqueue(self._celery)
            return self._enqueue

    def redis(self) -> Any:
        """A short-timeout Redis client for ``/healthz`` (None without Redis)."""
        from sessionfold.workers.wiring import inline_redis_client

        with self._lock:
            if self._redis is None and self.client.redis_url:
                self._redis = inline_redis_client(self.settings, self.client.redis_url)
            return self._redis

    def close(self) -> None:
        with self._lock:
            if self._celery is not None:
                self._celery.close()
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
