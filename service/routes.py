"""The tenant routes, ``/v1/sessions/...``: every session id in a path is the caller's tenant's.

Each route turns the path's id into the store's id under the caller's tenant
(:func:`~.tenancy.store_id`) before anything else, so no route can reach another tenant's
session: it is not found (404), as one that never existed.

Store calls block (SQLAlchemy): plain ``def`` routes run on the server's thread pool; the
window route is ``async`` because a long-poll must hold no thread while it waits.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Header, Path, Query, Response
from sessionfold.client.recall import RecallRequest, answer
from sessionfold.client.session import SessionHandle
from sessionfold.client.shapes import WindowShape
from sessionfold.core.errors import (
    InvalidInputError,
    RedisUnavailableError,
    SessionNotFoundError,
    UsageUnmeasurableError,
)
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.metrics import metrics
from sessionfold.runtime.usage import UsageEvent
from sessionfold.store import SessionInfo
from sessionfold.store.ledger import MAX_KEY_LEN

from .encoded import EncodedWindow
from .errors import ApiError
from .etags import ETAG_PATTERN, ETag, Until, parse_etag
from .metrics import api_metrics
from .models import (
    AppendIn,
    AppendOut,
    ErrorOut,
    FoldOut,
    LedgerEntryOut,
    LedgerOut,
    RecallIn,
    RecallOut,
    SessionIn,
    SessionListOut,
    SessionOut,
    UsageIn,
    UsageOut,
    WindowOut,
)
from .state import Caller, State
from .tenancy import SESSION_ID_PATTERN, local_id, store_id, tenant_prefix

__all__ = ["router"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text} for code, text in (
        (400, "invalid input (reason names the library's error)"),
        (401, "no API key, or an unknown or revoked one (checked before the body is read)"),
        (404, "no such session in your tenant"),
        (413, "the body is larger than the API reads (body-too-large), or an append holds "
              "more messages, or a larger one, than the store takes (too-large)"),
        (422, "a malformed request, message, policy or usage report"),
        (431, "more header fields, or a longer head, than the API reads"),
        (503, "the store (or Redis) is unavailable; nothing was written (error_id names the "
              "failure in the server's log)"),
    )
}
router = APIRouter(prefix="/v1", responses=_ERRORS)

SessionId = Annotated[str, Path(pattern=SESSION_ID_PATTERN, max_length=200,
                                description="the session's id within your tenant")]


def _exists(state: State, sid: str, session_id: str) -> None:
    if sid not in state.store.window_states([sid]):
        raise SessionNotFoundError(f"no session {session_id!r}")


# --- sessions ------------------------------------------------------------------------------

@router.post("/sessions", status_code=201, response_model=SessionOut,
             responses={200: {"model": SessionOut, "description": "exists (exist_ok)"},
                        409: {"model": ErrorOut, "description": "the id exists"}},
             summary="Create a session with its policy and system prompt")
def create_session(body: SessionIn, caller: Caller, state: State, response: Response) -> Any:
    sid = store_id(caller.tenant, body.id)
    policy = FoldPolicy.from_json(body.policy)
    store = state.store
    info = _existing(state, sid)
    if info is None:
        # exist_ok=True: a session made meanwhile by a concurrent request is read back, not
        # raised, so every InvalidInputError here is about this request's own values (a NUL in
        # the system prompt...), answered 400 as the store says it. One made meanwhile with
        # this very policy and prompt is the session asked for: answered as made here.
        info = store.create_session(sid, policy, body.system, exist_ok=True)
        if (info.system, info.policy) == (body.system, policy):
            return SessionOut.of(info)
    if not body.exist_ok:
        raise ApiError(409, "conflict", "session-exists",
                       f"session {body.id!r} exists; pass exist_ok to get it")
    if info.system != body.system or info.policy != policy:
        raise ApiError(409, "conflict", "session-exists",
                       f"session {body.id!r} exists with another policy or system prompt")
    response.status_code = 200
    return SessionOut.of(info)


def _existing(state: State, sid: str) -> SessionInfo | None:
    try:
        return state.store.get_session(sid)
    except SessionNotFoundError:
        return None


@router.get("/sessions", response_model=SessionListOut, summary="List your sessions (paged)")
def list_sessions(caller: Caller, state: State,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                  after: Annotated[str | None, Query(pattern=SESSION_ID_PATTERN,
                                                     max_length=200)] = None) -> Any:
    prefix = tenant_prefix(caller.tenant)
    found = state.store.list_sessions(
        limit=limit, prefix=prefix,
        after=store_id(caller.tenant, after) if after is not None else prefix)
    sessions = [SessionOut.of(info) for info in found]
    next_after = local_id(caller.tenant, found[-1].id) if len(found) == limit else None
    return SessionListOut(sessions=sessions, next_after=next_after)


@router.get("/sessions/{session_id}", response_model=SessionOut, summary="Read a session")
def get_session(session_id: SessionId, caller: Caller, state: State) -> Any:
    return SessionOut.of(state.store.get_session(store_id(caller.tenant, session_id)))


@router.delete("/sessions/{session_id}", status_code=204, response_class=Response,
               summary="Delete a session with everything it holds")
def delete_session(session_id: SessionId, caller: Caller, state: State) -> Response:
    if not state.store.delete_session(store_id(caller.tenant, session_id)):
        raise SessionNotFoundError(f"no session {session_id!r}")
    return Response(status_code=204)


@router.post("/sessions/{session_id}/pause", response_model=SessionOut,
             summary="Stop background folds until resumed")
def pause(session_id: SessionId, caller: Caller, state: State) -> Any:
    return _set_paused(state, store_id(caller.tenant, session_id), True)


@router.post("/sessions/{session_id}/resume", response_model=SessionOut,
             summary="Let background folds run again")
def resume(session_id: SessionId, caller: Caller, state: State) -> Any:
    return _set_paused(state, store_id(caller.tenant, session_id), False)


def _set_paused(state: State, sid: str, paused: bool) -> SessionOut:
    return SessionOut.of(state.client.set_paused(sid, paused))  # (nudges the scheduler)


# --- messages, window, usage ---------------------------------------------------------------

@router.post("/sessions/{session_id}/messages", status_code=201, response_model=AppendOut,
             responses={200: {"model": AppendOut,
                              "description": "a retry of an Idempotency-Key: not appended again"}},
             summary="Append messages (idempotent by the Idempotency-Key header)")
def append(session_id: SessionId, body: AppendIn, caller: Caller, state: State,
           response: Response,
           idempotency_key: Annotated[str | None, Header(
               min_length=1, max_length=MAX_KEY_LEN, pattern="^[^\\x00-\\x1f\\x7f]*$",
               description="a retry with the same key and messages is not appended twice "
               "(the library's key=)")] = None) -> Any:
    # The library's own append, as an agent's handle makes it: the same shapes and checks, and
    # the same nudge when it takes the session past its trigger (the scheduler reads it now,
    # not at its next sweep). The handle holds no tool results: nothing is kept between
    # requests, which may reach other API processes, so a partial set is refused.
    handle = SessionHandle(state.client, store_id(caller.tenant, session_id),
                           hold_tool_results=False)
    result = handle.append(body.messages, key=idempotency_key, shape=body.shape)
    if result.duplicate:
        response.status_code = 200
    return AppendOut(first_seq=result.first_seq, last_seq=result.last_seq,
                     revision=result.revision, duplicate=result.duplicate,
                     crossed_trigger=result.crossed_trigger)


_WINDOW_DOC = """The window as it stands (already compacted), with an `ETag` of the session's
incarnation and revision.

- `If-None-Match: <etag>` answers 304 while the window is unchanged.
- Long-poll: `?after=<etag>&wait=30` answers as soon as the window moves past that ETag — by
  any change (`until=change`, the default: an append or a fold) or by a fold only
  (`until=fold`) — and with 304 (its `ETag` header the current one: poll again with it) when
  `wait` seconds pass first. `wait` is capped by the server's `api_max_wait_s`.
- `?shape=openai` renders the messages in the OpenAI chat shape (the `messages=` of a chat
  completion, the system prompt first, one `tool` message per tool result; thinking, images
  and documents left out), so they no longer line up one to one with `items`. Its `ETag`
  ends in `-openai`: a tag matches only the shape it was given for.
"""


@router.get("/sessions/{session_id}/window", response_model=WindowOut, description=_WINDOW_DOC,
            responses={304: {"description": "unchanged (or the wait ended first)"}},
            summary="Read the window; long-poll for a change or a fold")
async def read_window(
        session_id: SessionId, caller: Caller, state: State,
        wait: Annotated[float, Query(ge=0, le=3600, description="seconds to wait")] = 0,
        after: Annotated[str | None, Query(max_length=64, pattern=ETAG_PATTERN,
                                           description="the ETag to wait past")] = None,
        until: Annotated[Until, Query(description="change: any change; fold: a fold")]
        = "change",
        cache_breakpoints: Annotated[bool, Query(description="mark the prompt-cache "
                                                 "breakpoints (cache_control; Anthropic shape "
                                                 "only)")] = False,
        shape: Annotated[WindowShape, Query(description="anthropic, or openai: the chat "
                                            "shape")] = "anthropic",
        if_none_match: Annotated[str | None, Header(max_length=200)] = None) -> Response:
    sid = store_id(caller.tenant, session_id)
    if shape == "openai" and cache_breakpoints:
        raise InvalidInputError("cache_breakpoints mark cache_control, which only the "
                                "Anthropic shape has; OpenAI caches prompt prefixes by itself")
    base = _base_etag(after, if_none_match, shape)
    if base is None:  # a plain read: one indexed lookup, then (mostly) bytes encoded before
        states = await anyio.to_thread.run_sync(state.store.window_states, [sid])
        if sid not in states:
            raise SessionNotFoundError(f"no session {session_id!r}")
        encoded = await state.windows.get(sid, states[sid], cache_breakpoints=cache_breakpoints,
                                          shape=shape)
        return _window_response(encoded)
    timeout = min(wait, state.settings.api_max_wait_s) if after is not None else 0.0
    gauge = api_metrics().waiting
    gauge.inc()
    try:
        result = await state.watcher.wait(sid, base, until, timeout)
    finally:
        gauge.dec()
    if result.state is None:
        raise SessionNotFoundError(f"no session {session_id!r}")
    if not result.changed:
        return Response(status_code=304, headers=_headers(ETag(result.state.incarnation,
                                                               result.state.revision, shape)))
    encoded = await state.windows.get(sid, result.state, cache_breakpoints=cache_breakpoints,
                                      shape=shape)
    return _window_response(encoded)


def _base_etag(after: str | None, if_none_match: str | None,
               shape: WindowShape) -> ETag | None:
    if after is not None:  # waiting past a tag: its revision counts, whatever its shape
        return parse_etag(after)
    if if_none_match is None:
        return None
    try:  # a tag this API did not write matches nothing: the window is sent
        tag = parse_etag(if_none_match)
    except InvalidInputError:
        return None
    return tag if tag.shape == shape else None  # another shape's bytes are not these


def _headers(etag: ETag) -> dict[str, str]:
    return {"ETag": str(etag), "Cache-Control": "no-cache"}


def _window_response(encoded: EncodedWindow) -> Response:
    return Response(encoded.body, media_type="application/json", headers=_headers(encoded.etag))


@router.post("/sessions/{session_id}/usage", status_code=202, response_model=UsageOut,
             summary="Report a model call's usage (Anthropic or OpenAI shape)")
def report_usage(session_id: SessionId, body: UsageIn, caller: Caller, state: State) -> Any:
    sid = store_id(caller.tenant, session_id)
    event = UsageEvent.from_usage(sid, body.usage, seq=body.seq, revision=body.revision,
                                  model=body.model)
    if event.prompt_tokens == 0:
        raise UsageUnmeasurableError(
            "the usage reports zero prompt tokens; sessionfold does not guess a session's size "
            "(set measure='estimate' in its policy if the provider reports none)")
    _exists(state, sid, session_id)
    publisher = state.client.publisher
    published = publisher.publish(event) if publisher is not None else False
    return UsageOut(prompt_tokens=event.prompt_tokens, published=published)


# --- recall --------------------------------------------------------------------------------

_RECALL_DOC = """The answer the recall tool (`sessionfold_recall`) gives a model now, from this
session's ledger only: ledger rows by `seq` (`"12"`, `"#12"`, `"12-30"`, `"#12–#30"`, with an
`offset` into the first row's text), or a search by `query`; bounded by the session's
`recall_max_tokens` and the room its window has left. `text` is what the tool result holds.

A malformed request (a bad seq, both seq and query, a negative offset, a query the search
refuses) is a 400 `invalid-input` saying what is wrong, as the library raises it. Answers are
counted in `sessionfold_recall_requests_total{kind,outcome}`, as the client counts its own.
"""


@router.post("/sessions/{session_id}/recall", response_model=RecallOut,
             description=_RECALL_DOC,
             summary="What the recall tool answers: ledger rows by seq, or a search")
def recall(session_id: SessionId, body: RecallIn, caller: Caller, state: State) -> Any:
    sid = store_id(caller.tenant, session_id)
    request = RecallRequest.from_input(body.model_dump(exclude_none=True))
    result = answer(state.store, sid, request)
    metrics().record_recall(result.kind, result.outcome)
    return result.to_json()


# --- ledger and folds ----------------------------------------------------------------------

@router.get("/sessions/{session_id}/ledger", response_model=LedgerOut,
            summary="Read ledger rows (paged by seq)")
def read_ledger(session_id: SessionId, caller: Caller, state: State,
                start: Annotated[int, Query(ge=0, le=2**62)] = 0,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
    entries = state.store.read_ledger(store_id(caller.tenant, session_id), start, start + limit)
    out = [LedgerEntryOut(seq=e.seq, message=e.message.to_json() if e.message else None,
                          tokens=e.tokens, appended_at=e.appended_at,
                          discarded_at=e.discarded_at) for e in entries]
    return LedgerOut(entries=out, next_start=start + limit if len(entries) == limit else None)


_FOLD_DOC = """Ask the session's scheduler to look at it now: a nudge on the usage bus, as an
append past the trigger sends. The scheduler re-reads the session from the store and enqueues a
background fold job if the session needs one (past its trigger, not paused, not just visited to
no effect); otherwise nothing happens. Nothing is folded on this request, and no job id is
returned: the job, if any, is the scheduler's (watch it in Flower, or wait for the fold with the
window's long-poll, `until=fold`).

`nudged` is false when the bus was away: the nudge waits in this process's buffer, and the
scheduler's store sweep finds a session over its trigger regardless. Without Redis (no
`REDIS_URL` and no embedded server) there is no scheduler to ask: 503 `redis-unavailable`.
A fold forced now, whatever the trigger, is the library's inline fold
(`SessionHandle.fold_inline`), not this route.
"""


@router.post("/sessions/{session_id}/fold", status_code=202, response_model=FoldOut,
             description=_FOLD_DOC,
             summary="Ask the scheduler to fold the session if it needs it (a nudge)")
def fold_now(session_id: SessionId, caller: Caller, state: State) -> Any:
    """Nudge the session's scheduler (see ``_FOLD_DOC``): a job is enqueued by the scheduler
    if the session needs one; this route enqueues nothing itself and imports no Celery."""
    sid = store_id(caller.tenant, session_id)
    info = state.store.get_session(sid)  # 404 before anything is published
    if state.client.publisher is None:
        raise RedisUnavailableError("no Redis: the scheduler is nudged over the usage bus's "
                                    "Redis (set REDIS_URL)")
    nudged = state.client.nudge(sid, info.revision)
    return FoldOut(session_id=session_id, revision=info.revision, nudged=nudged)


