"""The API's request and response bodies (pydantic), as the OpenAPI document shows them.

Messages, policies and usage travel as the library's own JSON: the routes hand them to the store
and the library (which validate them and say what is wrong, with the library's error reasons),
so their schema here is the library's (:class:`FoldPolicy`) or an open object.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from sessionfold.client.recall import RecallKind, RecallOutcome
from sessionfold.client.shapes import Shape, WindowShape
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionInfo
from sessionfold.store.notify import WindowState

from .etags import etag_of
from .tenancy import split_store_id

__all__ = [
    "AppendIn",
    "AppendOut",
    "DeadLetterOut",
    "DeadLettersOut",
    "ErrorOut",
    "FoldOut",
    "HealthOut",
    "KeyOut",
    "KeysOut",
    "LedgerEntryOut",
    "LedgerOut",
    "RecallIn",
    "RecallOut",
    "SessionIn",
    "SessionListOut",
    "SessionOut",
    "UsageIn",
    "UsageOut",
    "WindowItemOut",
    "WindowOut",
]

#: A message in the Anthropic Messages shape (role, content) or the OpenAI chat shape; the
#: store validates it.
MessageJson = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "description": "A message in the Anthropic Messages shape "
    "({\"role\": \"user\"|\"assistant\", \"content\": string or blocks}) or the OpenAI "
    "chat shape (assistant tool_calls, role tool), as the append's shape says",
    "additionalProperties": True})]
PolicyJson = Annotated[dict[str, Any], WithJsonSchema(FoldPolicy.model_json_schema())]


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class ErrorDetail(_Out):
    type: str = Field(description="coarse class: invalid_request, authentication, permission, "
                      "not_found, conflict, gone, unavailable, internal")
    reason: str = Field(description="the precise cause, named after the library's error")
    message: str
    index: int | None = Field(default=None, description="which message of the request")
    field: str | None = Field(default=None, description="where in that message")


class ErrorOut(_Out):
    error: ErrorDetail


class SessionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="the session's id within your tenant (URL-safe)",
                    examples=["agent-7"])
    policy: PolicyJson = Field(description="the fold policy (FoldPolicy); budget_tokens at least")
    system: str = Field(default="", description="the system prompt, fixed at creation")
    exist_ok: bool = Field(default=False, description="answer 200 with the existing session "
                           "instead of 409 when the id exists")


class SessionOut(_Out):
    id: str
    tenant: str | None = Field(description="the owning tenant (None: made by the library)")
    system: str
    policy: dict[str, Any]
    revision: int
    fold_revision: int
    incarnation: str = Field(description="hex; random per created session")
    etag: str = Field(description="the window's current ETag")
    paused: bool
    ledger_len: int
    window_tokens: int
    current_tokens: int
    trigger_tokens: int
    measured_tokens: int | None
    last_visit_outcome: str | None
    last_visit_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, info: SessionInfo) -> SessionOut:
        tenant, local = split_store_id(info.id)
        state = WindowState(info.incarnation, info.revision, info.fold_revision)
        return cls(id=local, tenant=tenant, system=info.system, policy=info.policy.to_json(),
                   revision=info.revision, fold_revision=info.fold_revision,
                   incarnation=f"{info.incarnation:x}", etag=str(etag_of(state)),
                   paused=info.paused, ledger_len=info.ledger_len,
                   window_tokens=info.window_tokens, current_tokens=info.current_tokens,
                   trigger_tokens=info.trigger_tokens, measured_tokens=info.measured_tokens,
                   last_visit_outcome=info.last_visit_outcome, last_visit_at=info.last_visit_at,
                   created_at=info.created_at, updated_at=info.updated_at)


class SessionListOut(_Out):
    sessions: list[SessionOut]
    next_after: str | None = Field(description="pass as ?after= for the next page (None: done)")


class AppendIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[MessageJson] = Field(description="messages to append, in order")
    shape: Shape = Field(default="auto", description="anthropic, openai, or auto: read from "
                         "the messages where unambiguous (a tool role or tool_calls is OpenAI, "
                         "a tool_use or tool_result block Anthropic, plain text either). In the "
                         "OpenAI shape consecutive tool messages become one user message of "
                         "tool results, and a request must carry every tool message answering "
                         "one assistant message (a partial set is refused: tool-pairing)")


class AppendOut(_Out):
    first_seq: int
    last_seq: int
    revision: int
    duplicate: bool = Field(description="true when the Idempotency-Key was seen before: "
                            "nothing was appended again")
    crossed_trigger: bool = Field(description="true when this append took the session (not "
                                  "paused) past its fold trigger; its scheduler is nudged to "
                                  "fold it now rather than at its next sweep")


class WindowItemOut(_Out):
    start_seq: int
    end_seq: int
    kind: str
    tokens: int | None


class WindowOut(_Out):
    session_id: str
    system: str
    revision: int
    fold_revision: int
    incarnation: str
    etag: str
    shape: WindowShape = Field(description="the shape of messages: anthropic, or openai (the "
                               "messages= of a chat completion, the system prompt first)")
    last_seq: int = Field(description="the highest ledger seq in the window (-1: empty); "
                          "report usage with it")
    tokens: int
    items: list[WindowItemOut]
    messages: list[dict[str, Any]]


class UsageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    usage: dict[str, Any] = Field(description="the provider's usage object, Anthropic "
                                  "(input_tokens, cache_read_input_tokens, "
                                  "cache_creation_input_tokens, output_tokens) or OpenAI "
                                  "(prompt_tokens, completion_tokens) shape")
    seq: int = Field(ge=0, description="last_seq of the window the call sent")
    revision: int = Field(ge=0, description="revision of the window the call sent")
    model: str | None = Field(default=None, max_length=200)


class UsageOut(_Out):
    prompt_tokens: int
    published: bool = Field(description="false when the usage bus was away (the scheduler's "
                            "store sweep covers it)")


class LedgerEntryOut(_Out):
    seq: int
    message: dict[str, Any] | None = Field(description="None once discarded (retain=discard)")
    tokens: int
    appended_at: datetime
    discarded_at: datetime | None


class LedgerOut(_Out):
    entries: list[LedgerEntryOut]
    next_start: int | None = Field(description="pass as ?start= for the next page (None: done)")


class RecallIn(BaseModel):
    """The recall tool's input (``sessionfold_recall``): ledger rows by ``seq`` (with an
    ``offset`` into the first row's text), or a ``query``."""

    model_config = ConfigDict(extra="forbid")

    seq: str | int | None = Field(default=None, description='a ledger row or range as the '
                                  'window names it: "12", "#12", "12-30" or "#12–#30"',
                                  examples=["#3–#14"])
    offset: int | None = Field(default=None, description="with seq: the character of the "
                               "first row's text to start at (an answer cut short says where)")
    query: str | None = Field(default=None, description="words or identifiers to search the "
                              "session's ledger for", examples=["ACCT-90417"])


class RecallOut(_Out):
    kind: RecallKind
    outcome: RecallOutcome = Field(
        description="served: everything asked for; clipped: cut at the cap (next_seq and "
        "next_offset say where to go on); unavailable: nothing could be given back; no-match")
    tokens: int
    next_seq: str | None = Field(description="with clipped: the seq to ask for next")
    next_offset: int | None = Field(description="with clipped: the offset to ask for next")
    text: str = Field(description="the answer, as the recall tool's result gives it to a model")


class FoldOut(_Out):
    session_id: str
    job_id: str


class HealthPart(_Out):
    ok: bool
    detail: str


class HealthOut(_Out):
    status: Literal["ok", "unavailable"]
    store: HealthPart
    redis: HealthPart
    long_poll: str = Field(description="listen (PostgreSQL NOTIFY) or poll (SQLite)")


class KeyOut(_Out):
    key_id: str
    tenant: str
    admin: bool
    created_at: datetime
    revoked_at: datetime | None


class KeysOut(_Out):
    keys: list[KeyOut]


class DeadLetterOut(_Out):
    id: int
    job_id: str
    session_id: str
    tenant: str | None
    reason: str
    attempts: int
    created_at: datetime


class DeadLettersOut(_Out):
    dead_letters: list[DeadLetterOut]
