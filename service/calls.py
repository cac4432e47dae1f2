"""The guarded request over HTTP: the client's call loop served one step per request.

An agent in any language gets what ``SessionHandle.call`` gives a Python one, from the same
loop (:class:`~sessionfold.client.call_loop.CallLoop`), not a copy of it::

    POST /v1/sessions/{id}/call         the request as the guard sends it (GuardedRequest)
        -> the agent sends it to its model, its own tools beside ``tools``
    POST /v1/sessions/{id}/call/reply   the model's reply, or the error it raised (CallStep)
        -> next "send": another request (a recall round, the retry after an overflow)
           next "done": the reply is the call's, recorded; next "raise": raise the error
    GET  /v1/recall-tool                the recall tool's definition in both shapes

Each request makes a :class:`~sessionfold.client.session.SessionHandle` of its own and takes one
step of the loop: ``start()`` opens a call; a reply resumes it from the state it wrote
(:meth:`CallLoop.resume`), which travels in the answer and comes back with the reply. So the
round count and the overflow retry travel with the call, and any API process answers any step:
nothing is kept between requests. The store and bus work (the guard and hard cap, inline folds,
usage reports, recall answers and the recall exchange, recording the reply) is the handle's, as
for a Python agent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Path
from sessionfold.client import call_loop
from sessionfold.client.call_loop import CallLoop, RaiseError, SendRequest
from sessionfold.client.recall import (
    RECALL_TOOL_NAME,
    RECALL_TOOL_VERSION,
    RecallAnswer,
    anthropic_tool,
    openai_tool,
    tool_calls,
)
from sessionfold.client.sdk_history import ReplyNotRecordedError, record_reply
from sessionfold.client.sdk_openai import assistant_blocks
from sessionfold.client.session import SessionHandle
from sessionfold.client.shapes import WindowShape
from sessionfold.client.window_view import rendered
from sessionfold.core.errors import InvalidMessageError
from sessionfold.core.messages import Conversation
from sessionfold.core.openai_write import to_openai

from .models import (
    CallIn,
    CallState,
    CallStep,
    ErrorOut,
    GuardedRequest,
    GuardOut,
    ProviderErrorIn,
    RecallAnswerOut,
    RecallToolDefinition,
    ReplyIn,
)
from .state import Caller, State
from .tenancy import SESSION_ID_PATTERN, store_id

__all__ = ["router"]

router = APIRouter(prefix="/v1", responses={
    code: {"model": ErrorOut, "description": text} for code, text in (
        (400, "invalid input; or context-overflow: the provider refused the one retry after "
              "an inline fold as too long too"),
        (401, "no API key, or an unknown or revoked one (checked before the body is read)"),
        (404, "no such session in your tenant"),
        (413, "the body is larger than the API reads (body-too-large)"),
        (422, "a malformed request or reply (tool-pairing, invalid-message...); or "
              "budget-exceeded: no shrink of the guard and no inline fold brings the request "
              "under the budget (seq names the message that cannot fit), nothing to send"),
        (431, "more header fields, or a longer head, than the API reads"),
        (503, "the store (or Redis) is unavailable (error_id names the failure in the "
              "server's log)"),
    )})

SessionId = Annotated[str, Path(pattern=SESSION_ID_PATTERN, max_length=200,
                                description="the session's id within your tenant")]

_CALL_DOC = """The request as the guard sends it, to send the model next: the session's window
through the pre-send guard and the hard cap, as `SessionHandle.call` sends it under
`over_budget` (`cap`, the default: a window past the budget less the guard's margin is folded
inline first, and what is still over is shrunk on this request alone), the recall tool in
`tools` once the request holds something only recall gives back, cache breakpoints in the
anthropic shape. `guard` says what the guard did.

A request no shrink and no inline fold bring under the budget is refused with 422
`budget-exceeded` (its `seq` names the message that cannot fit; nothing is sent), unless
`over_budget` is `send`. Send the request with your own tools beside `tools`, then post the
model's reply (or its error) to `.../call/reply` with `call` as it came.
"""

_REPLY_DOC = """The model's reply to a guarded request, or the error its call raised, with the
request's `call` state as it came. The reply's usage is reported for the window the request was
built from (with what the guard left out added back, so the background fold still comes).

- A reply that calls only the recall tool is answered from the ledger, while rounds are left:
  the exchange is appended and `next` is `send`, with the next request.
- A context overflow (the provider's "prompt is too long", `context_length_exceeded`) folds the
  session inline, once per request: `next` is `send`, with the retry; a second is 400
  `context-overflow`. Any other error: `next` is `raise`.
- Any other reply is the call's: `next` is `done`, and the reply is recorded in the ledger
  (once per reply id). When it called the recall tool beside your own tools, `tool_results`
  holds the answers in its shape: send them with your own results.
"""


@dataclass(frozen=True)
class _Counts:
    """A handle's counts before a step, to tell what the step did."""

    guarded: int
    over: int
    folds: int

    @classmethod
    def of(cls, handle: SessionHandle) -> _Counts:
        return cls(handle.guarded_requests, handle.guard_over_budget, handle.inline_folds)


class _ProviderError(Exception):
    """The model call's error as the caller reported it: the status and body an SDK's error
    carries, where the loop's overflow check reads them."""

    def __init__(self, error: ProviderErrorIn) -> None:
        self.status_code = error.status
        self.body = error.body
        said = error.body if isinstance(error.body, str) else json.dumps(error.body)
        super().__init__(f"{error.status}: {said[:500]}")


def _handle(state: State, caller: Caller, session_id: str) -> SessionHandle:
    # No tool results are held: nothing is kept between requests.
    return SessionHandle(state.client, store_id(caller.tenant, session_id),
                         hold_tool_results=False)


@router.post("/sessions/{session_id}/call", response_model=GuardedRequest,
             description=_CALL_DOC, summary="Open a model call: the guarded request to send")
def open_call(session_id: SessionId, body: CallIn, caller: Caller, state: State) -> Any:
    handle = _handle(state, caller, session_id)
    cache_breakpoints = (body.cache_breakpoints if body.cache_breakpoints is not None
                         else body.shape == "anthropic")
    loop = handle.open_call(takes_tools=body.tools, over_budget=body.over_budget,
                            cache_breakpoints=cache_breakpoints)
    counts = _Counts.of(handle)
    return _guarded(handle, loop, loop.start(), body.shape, counts)


@router.post("/sessions/{session_id}/call/reply", response_model=CallStep,
             description=_REPLY_DOC,
             summary="The model's reply to a guarded request: recorded, or the next request")
def take_reply(session_id: SessionId, body: ReplyIn, caller: Caller, state: State) -> Any:
    handle = _handle(state, caller, session_id)
    loop = CallLoop.resume(handle, call_loop.CallState.from_json(
        body.call.model_dump(mode="json")))
    counts = _Counts.of(handle)
    if body.error is not None:
        after = loop.failed(_ProviderError(body.error))
        if isinstance(after, RaiseError):
            if after.cause is not None:  # the retry overflowed too: ContextOverflowError
                after.throw()
            return CallStep(next="raise")
        return CallStep(next="send", request=_guarded(handle, loop, after, body.shape, counts))
    assert body.reply is not None  # (ReplyIn takes one of them)
    reply, unconverted = _loop_reply(body.reply, body.shape)
    done = loop.replied(reply, relayed=body.relayed)
    if isinstance(done, SendRequest):  # a recall round was answered
        return CallStep(next="send", request=_guarded(handle, loop, done, body.shape, counts),
                        recall=_outcomes(handle.last_recall))
    if unconverted is not None:  # its usage is reported; a message that does not convert
        raise unconverted
    try:
        recorded = record_reply(handle, reply, body.reply)
    except ReplyNotRecordedError as exc:  # answered as what refused it (pairing, the store)
        raise exc.__cause__ or exc from None
    results = _answer_recall(handle, reply, body.shape)
    return CallStep(next="done", recorded_seq=recorded.last_seq if recorded else None,
                    recall=_outcomes(handle.last_recall) if results else [],
                    tool_results=results)


@router.get("/recall-tool", response_model=RecallToolDefinition,
            summary="The recall tool's definition, in the Anthropic and OpenAI shapes")
def recall_tool(_: Caller) -> Any:
    return RecallToolDefinition(name=RECALL_TOOL_NAME, version=RECALL_TOOL_VERSION,
                                anthropic=anthropic_tool(), openai=openai_tool())


# --- steps as answers ----------------------------------------------------------------------

def _guarded(handle: SessionHandle, loop: CallLoop, step: SendRequest, shape: WindowShape,
             before: _Counts) -> GuardedRequest:
    """The request ``step`` says to send, in ``shape``, with the loop's state and what the
    guard did for it (read off the handle's counts)."""
    view, plan = step.view, loop.plan
    if shape == "openai":
        shown = [rendered(item, recall=view.recall) for item in view.items]
        messages = to_openai(Conversation(system=view.system, messages=shown))
        tools = [openai_tool() for tool in step.offered if tool.get("name") == RECALL_TOOL_NAME]
    else:
        messages, tools = view.messages, step.tools()
    folds = handle.inline_folds - before.folds
    outcome = ("over-budget" if handle.guard_over_budget > before.over else
               "folded" if folds else
               "shrunk" if handle.guarded_requests > before.guarded else "under")
    policy = plan.policy
    guard = GuardOut(outcome=outcome,
                     tokens=plan.calibration.predict(handle.request_tokens(plan, view)),
                     budget_tokens=policy.budget_tokens, limit_tokens=policy.guard_tokens,
                     unsent_tokens=view.unsent_tokens, inline_folds=folds,
                     revision=view.revision, last_seq=view.last_seq)
    return GuardedRequest(shape=shape, system=view.system, messages=messages, tools=tools,
                          call=CallState(**loop.state.to_json()), guard=guard)


def _loop_reply(raw: Mapping[str, Any], shape: WindowShape
                ) -> tuple[Mapping[str, Any], InvalidMessageError | None]:
    """The reply as the loop reads replies (``content`` in Anthropic blocks, ``id``, ``usage``,
    ``model``), and the error its message met in conversion (a chat completion's), if any:
    its usage is reported before that error is raised."""
    if shape == "anthropic":
        return raw, None
    choices = raw.get("choices") or [{}]
    message = choices[0].get("message") or {}
    reply = {"id": raw.get("id"), "model": raw.get("model"), "usage": raw.get("usage")}
    try:
        return {**reply, "content": assistant_blocks({"role": "assistant", **message})}, None
    except InvalidMessageError as exc:
        return {**reply, "content": []}, exc


def _answer_recall(handle: SessionHandle, reply: Mapping[str, Any],
                   shape: WindowShape) -> list[dict[str, Any]]:
    """The answers to the recall calls of a reply that goes back to the caller (beside its
    own tools, or after the last round), in the reply's shape; [] when it made none."""
    calls = [call for call in tool_calls(reply) if call.is_recall]
    if not calls:
        return []
    blocks = handle.answer_recall(reply)
    if shape == "anthropic":
        return blocks
    return [answer.openai_message(call.id)
            for call, answer in zip(calls, handle.last_recall, strict=True)]


def _outcomes(answers: list[RecallAnswer]) -> list[RecallAnswerOut]:
    return [RecallAnswerOut(kind=a.kind, outcome=a.outcome, tokens=a.tokens) for a in answers]
