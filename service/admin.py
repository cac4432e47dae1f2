"""Operator routes, ``/v1/admin/...``: every tenant's sessions, dead letters, keys (admin keys
only; a tenant key gets 403, since these routes name no session of its own)."""

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
    403: {"model": ErrorOut, "description": "not an admin key"}})


@router.get("/sessions", response_model=SessionListOut,
            summary="List every tenant's sessions (store ids, paged)")
def all_sessions(_: Admin, state: State,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                 after: Annotated[str | None, Query(max_length=255)] = None) -> Any:
    found = state.store.list_sessions(limit=limit, after=after)
    return SessionListOut(sessions=[SessionOut.of(info) for info in found],
                          next_after=found[-1].id if len(found) == limit else None)


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
