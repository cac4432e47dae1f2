"""Bearer API keys: made and checked here, stored hashed in the store's ``api_keys`` table.

A key is ``sfk_<key id>_<secret>``: the key id (12 hex digits) names its row, the secret (32
random bytes, URL-safe base64) is shown once, when the key is made (``sessionfold keys create``),
and never stored. The row keeps SHA-256 over the key id and the secret. With 256 random bits an
unsalted fast hash is the right tool: nothing can be guessed from it, and checking it costs a
microsecond. A slow password hash (bcrypt, scrypt) would add tens of milliseconds to every
request for no gain: it protects low-entropy passwords, and these are not passwords. The stored
digest is compared with :func:`hmac.compare_digest` (constant time).

A checked key is trusted for ``cache_s`` seconds without asking the store again (the
``api_key_cache_s`` setting): a revoked key stops working within that time in every API process.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

import anyio.to_thread
from sessionfold.store import SessionStore
from sessionfold.store.api_keys import ApiKeyInfo

from .errors import ApiError
from .tenancy import check_tenant

__all__ = ["KeyChecker", "NewKey", "Principal", "create_key", "key_digest", "parse_key"]

_KEY = re.compile(r"^sfk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant whose sessions the request may touch, and whether the key
    may use the operator routes."""

    tenant: str
    admin: bool
    key_id: str


@dataclass(frozen=True, slots=True)
class NewKey:
    """A key just made: ``key`` is the only copy of the secret (print it once)."""

    key: str
    info: ApiKeyInfo


def key_digest(key_id: str, secret: str) -> str:
    return hashlib.sha256(f"{key_id}:{secret}".encode()).hexdigest()


def parse_key(key: str) -> tuple[str, str] | None:
    """``(key id, secret)`` of a well-formed key, else None."""
    match = _KEY.fullmatch(key)
    return (match[1], match[2]) if match else None


def create_key(store: SessionStore, tenant: str, *, admin: bool = False) -> NewKey:
    """Make a key for ``tenant`` (created by its first key: tenants have no row of their own)."""
    check_tenant(tenant)
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    info = store.create_api_key(key_id, tenant, key_digest(key_id, secret), admin=admin)
    return NewKey(f"sfk_{key_id}_{secret}", info)


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "authentication", "unauthorized", message,
                    headers={"WWW-Authenticate": 'Bearer realm="sessionfold"'})


class KeyChecker:
    """Checks ``Authorization: Bearer <key>`` headers against the store, with a short cache."""

    def __init__(self, store: SessionStore, *, cache_s: float = 5.0) -> None:
        self._store = store
        self._cache_s = cache_s
        self._cache: dict[str, tuple[float, ApiKeyInfo]] = {}

    async def principal(self, authorization: str | None) -> Principal:
        if not authorization or not authorization[:len(_BEARER)].lower() == _BEARER:
            raise _unauthorized("send an API key: 'Authorization: Bearer sfk_...' (made by "
                                "`sessionfold keys create TENANT`)")
        parsed = parse_key(authorization[len(_BEARER):].strip())
        if parsed is None:
            raise _unauthorized("the API key is malformed")
        key_id, secret = parsed
        info = await self._lookup(key_id)
        if info is None or info.revoked_at is not None \
                or not hmac.compare_digest(info.digest, key_digest(key_id, secret)):
            raise _unauthorized("the API key is unknown or revoked")
        return Principal(info.tenant, info.admin, key_id)

    async def _lookup(self, key_id: str) -> ApiKeyInfo | None:
        now = time.monotonic()
        hit = self._cache.get(key_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        info = await anyio.to_thread.run_sync(self._store.get_api_key, key_id)
        if info is not None and self._cache_s > 0:
            if len(self._cache) > 10_000:
                self._cache.clear()  # keys are few; this only bounds a flood of made-up ids
            self._cache[key_id] = (now + self._cache_s, info)
        return info
