"""API keys of the HTTP API: rows of ``api_keys`` (key id, tenant, admin, digest, revoked).

The store keeps a key's digest only (the API makes keys and hashes them, see
``sessionfold.service.auth``); a revoked key's row stays, with ``revoked_at``, so ``keys list``
shows when it was revoked and a key id is never reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError
from sqlalchemy.engine import Connection, Row

from .schema import api_keys

__all__ = ["ApiKeyInfo", "get_api_key", "insert_api_key", "list_api_keys", "revoke_api_key"]


@dataclass(frozen=True, slots=True)
class ApiKeyInfo:
    """One API key's row (``digest`` is SHA-256 hex; the secret itself is never stored)."""

    key_id: str
    tenant: str
    admin: bool
    digest: str
    created_at: datetime
    revoked_at: datetime | None = None


def _info(row: Row[Any]) -> ApiKeyInfo:
    return ApiKeyInfo(key_id=row.key_id, tenant=row.tenant, admin=bool(row.admin),
                      digest=row.digest, created_at=row.created_at, revoked_at=row.revoked_at)


def check_key_id(key_id: object) -> str:
    if not isinstance(key_id, str) or not key_id or len(key_id) > 32 \
            or not all(ch in "0123456789abcdef" for ch in key_id):
        raise InvalidInputError(f"an API key id is 1 to 32 lower-case hex digits, got "
                                f"{key_id!r:.60}")
    return key_id


def insert_api_key(conn: Connection, key_id: str, tenant: str, digest: str, *, admin: bool,
                   now: datetime) -> ApiKeyInfo:
    conn.execute(api_keys.insert().values(key_id=key_id, tenant=tenant, admin=admin,
                                          digest=digest, created_at=now, revoked_at=None))
    return ApiKeyInfo(key_id, tenant, admin, digest, now)


def get_api_key(conn: Connection, key_id: str) -> ApiKeyInfo | None:
    row = conn.execute(sa.select(api_keys).where(api_keys.c.key_id == key_id)).first()
    return _info(row) if row is not None else None


def list_api_keys(conn: Connection, tenant: str | None = None) -> list[ApiKeyInfo]:
    query = sa.select(api_keys).order_by(api_keys.c.tenant, api_keys.c.created_at,
                                         api_keys.c.key_id)
    if tenant is not None:
        query = query.where(api_keys.c.tenant == tenant)
    return [_info(row) for row in conn.execute(query)]


def revoke_api_key(conn: Connection, key_id: str, *, now: datetime) -> bool:
    """Revoke a key; False if there is no such key or it was revoked already."""
    done = conn.execute(api_keys.update().where(api_keys.c.key_id == key_id,
                                                api_keys.c.revoked_at.is_(None))
                        .values(revoked_at=now))
    return bool(done.rowcount)
