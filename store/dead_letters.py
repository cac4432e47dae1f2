"""Dead-lettered fold jobs: the ones the workers gave up on, kept for an operator to look at."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sessionfold.core.errors import InvalidInputError
from sqlalchemy.engine import Connection

from .results import DeadLetter
from .schema import dead_letters

__all__ = ["insert_dead_letter", "read_dead_letters"]


def _json_safe(value: Any, path: str = "payload") -> None:
    """The payload is stored as JSON: refuse what JSON cannot hold, naming where it is."""
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"{path} is {value!r}, which JSON cannot hold")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInputError(f"{path} has a non-string key {key!r}")
            _json_safe(item, f"{path}.{key}")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _json_safe(item, f"{path}[{i}]")
        return
    raise InvalidInputError(f"{path} holds a {type(value).__name__}, which JSON cannot hold")


def insert_dead_letter(conn: Connection, job_id: str, sid: str, reason: str, attempts: int,
                       payload: Mapping[str, Any], *, now: datetime) -> int:
    if not isinstance(reason, str) or not reason:
        raise InvalidInputError("a dead letter needs a non-empty reason")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        raise InvalidInputError(f"attempts must be a non-negative integer, got {attempts!r}")
    if not isinstance(payload, Mapping):
        raise InvalidInputError(f"payload must be a JSON object, got {type(payload).__name__}")
    _json_safe(payload)
    inserted = conn.execute(dead_letters.insert().values(
        job_id=job_id, session_id=sid, reason=reason, attempts=attempts, payload=dict(payload),
        created_at=now).returning(dead_letters.c.id))
    return int(inserted.scalar_one())


def read_dead_letters(conn: Connection, *, limit: int) -> list[DeadLetter]:
    """The newest dead letters first."""
    rows = conn.execute(sa.select(dead_letters)
                        .order_by(dead_letters.c.created_at.desc(), dead_letters.c.id.desc())
                        .limit(limit))
    return [DeadLetter(id=r.id, job_id=r.job_id, session_id=r.session_id, reason=r.reason,
                       attempts=r.attempts, payload=r.payload, created_at=r.created_at)
            for r in rows]
