"""Operator routes, ``/v1/admin/...``: every tenant's sessions, dead letters, keys (admin keys
only; a tenant key gets 403, since these routes name no session of its own).

Like every route's, their answers show no store id: a session is its tenant and its id in that
tenant, and the listing's page cursor is opaque (the store id's UTF-8, in hex).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from .models import (
    DeadLetterOut,
    DeadLettersOut,
    ErrorOut,
    KeyOut,
    KeysOut,
    SessionListOut,
    SessionOut,
)
from .state import Admin, State
from .tenancy import split_store_id

__all__ = ["router"]

router = APIRouter(prefix="/v1/admin", responses={
    401: {"model": ErrorOut, "description": "no API key, or an unknown or revoked one"},
    403: {"model": ErrorOut, "description": "not an admin key"},
    431: {"model": ErrorOut, "description": "more header fields, or a longer head, than the "
                                            "API reads"},
    503: {"model": ErrorOut, "description": "the store is unavailable"}})

#: A page cursor: a store id's UTF-8 bytes in hex (store ids are at most 255 characters).
_CURSOR = "^(?:[0-9a-f]{2}){1,1020}$"


def _cursor(sid: str) -> str:
    return sid.encode().hex()


def _after(cursor: str) -> str:
    # Any cursor is a place in the id order: one not made here lists from where it falls.
    return bytes.fromhex(cursor).decode("utf-8", errors="replace")


@router.get("/sessions", response_model=SessionListOut,
            summary="List every tenant's sessions (paged)")
def all_sessions(_: Admin, state: State,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                 after: Annotated[str | None, Query(pattern=_CURSOR, description="next_after "
                                                    "of the page before")] = None) -> Any:
    found = state.store.list_sessions(limit=limit,
                                      after=_after(after) if after is not None else None)
    return SessionListOut(sessions=[SessionOut.of(info) for info in found],
                          next_after=_cursor(found[-1].id) if len(found) == limit else None)


@router.get("/dead-letters", response_model=DeadLettersOut,
            summary="Fold jobs the workers gave up on")
def dead_letters(_: Admin, state: State,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
    return DeadLettersOut(dead_letters=[
        DeadLetterOut(id=d.id, job_id=d.job_id, session_id=split_store_id(d.session_id)[1],
                      tenant=split_store_id(d.session_id)[0], reason=d.reason,
                      attempts=d.attempts, created_at=d.created_at)
        for d in state.store.dead_letters(limit)])


@router.get("/keys", response_model=KeysOut, summary="API keys (never their secrets)")
def keys(_: Admin, state: State) -> Any:
    return KeysOut(keys=[KeyOut(key_id=k.key_id, tenant=k.tenant, admin=k.admin,
                                created_at=k.created_at, revoked_at=k.revoked_at)
                         for k in state.store.list_api_keys()])
