"""The API's request and response bodies (pydantic), as the OpenAPI document shows them.

Messages, policies and usage travel as the library's own JSON: the routes hand them to the store
and the library (which validate them and say what is wrong, with the library's error reasons),
so the models take them as open objects, and the document shows what the library takes
(:mod:`.schemas`). Every request body is read with strict JSON types: a boolean is no number
(``{"seq": true}`` is not ledger row 1), a string no boolean, a fraction no count. A number
without a fraction (``12.0``) is JSON's integer 12, as JSON Schema's ``integer`` says: it is
read so where a count belongs (not inside messages, which are kept as given).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import pydantic_core
from annotated_types import Interval
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from sessionfold.client.call_plan import OVER_BUDGET_CHOICES, OverBudget
from sessionfold.client.recall import RecallKind, RecallOutcome
from sessionfold.client.shapes import Shape, WindowShape
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.usage import MAX_REPORTED_TOKENS
from sessionfold.store import SessionInfo
from sessionfold.store.ledger import MAX_APPEND_MESSAGES
from sessionfold.store.notify import WindowState

from .etags import etag_of
from .schemas import (
    MESSAGE_SCHEMA,
    POLICY_SCHEMA,
    USAGE_SCHEMA,
    append_messages_schema,
    recall_schema,
    reply_body_schema,
)
from .tenancy import SESSION_ID_PATTERN, split_store_id

__all__ = [
    "AppendIn",
    "AppendOut",
    "CallIn",
    "CallState",
    "CallStep",
    "DeadLetterOut",
    "DeadLettersOut",
    "ErrorOut",
    "FoldOut",
    "GuardOut",
    "GuardedRequest",
    "HealthOut",
    "KeyOut",
    "KeysOut",
    "LedgerEntryOut",
    "LedgerOut",
    "ProviderErrorIn",
    "RecallAnswerOut",
    "RecallIn",
    "RecallOut",
    "RecallToolDefinition",
    "ReplyIn",
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
MessageJson = Annotated[dict[str, Any], WithJsonSchema(MESSAGE_SCHEMA)]


def whole_numbers(value: Any) -> Any:
    """``value`` (JSON) with every number that has no fraction as an int: JSON has one number
    type, and JSON Schema's ``integer`` is any number without a fraction (``12.0`` is 12).
    Fractions, NaN and infinities stay as they are, for the reader to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


#: An integer as JSON writes it: ``12`` or ``12.0``; never ``true``, ``"12"`` or ``12.5``.
JsonInt = Annotated[int, BeforeValidator(whole_numbers), Field(strict=True)]

#: Each FoldPolicy field's type, read strictly from JSON (FoldPolicy itself converts: "4000" or
#: true would pass as numbers).
_POLICY_TYPES = {name: TypeAdapter(field.annotation)
                 for name, field in FoldPolicy.model_fields.items()
                 if field.annotation is not None}


def _strict_policy_types(policy: dict[str, Any]) -> dict[str, Any]:
    policy = whole_numbers(policy)
    for name, value in policy.items():
        adapter = _POLICY_TYPES.get(name)
        if adapter is None:
            continue  # an unknown field: FoldPolicy refuses it, naming the ones it has
        try:
            adapter.validate_json(pydantic_core.to_json(value), strict=True)
        except (ValidationError, pydantic_core.PydanticSerializationError) as exc:
            problem = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise ValueError(f"policy.{name}: {problem}") from None
    return policy


PolicyJson = Annotated[dict[str, Any], AfterValidator(_strict_policy_types),
                       WithJsonSchema(POLICY_SCHEMA)]
UsageJson = Annotated[dict[str, Any], AfterValidator(whole_numbers),
                      WithJsonSchema(USAGE_SCHEMA)]


class _In(BaseModel):
    """A request body: no unknown fields, strict JSON types."""

    model_config = ConfigDict(extra="forbid", strict=True)


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class ErrorDetail(_Out):
    type: str = Field(description="coarse class: invalid_request, authentication, permission, "
                      "not_found, conflict, gone, unavailable, internal")
    reason: str = Field(description="the precise cause, named after the library's error")
    message: str
    index: int | None = Field(default=None, description="which message of the request")
    field: str | None = Field(default=None, description="where in that message (or in the "
                              "usage report: usage.input_tokens)")
    seq: int | None = Field(default=None, description="with budget-exceeded: the ledger seq "
                            "of the message that cannot fit (absent: the system prompt)")
    tokens: int | None = Field(default=None, description="with budget-exceeded: the request's "
                               "estimate after every shrink")
    budget_tokens: int | None = Field(default=None, description="with budget-exceeded: the "
                                      "session's budget")
    error_id: str | None = Field(default=None, description="with a 5xx: the id the server's "
                                 "log has the failure under")


class ErrorOut(_Out):
    error: ErrorDetail


class SessionIn(_In):
    id: str = Field(description="the session's id within your tenant (URL-safe)",
                    pattern=SESSION_ID_PATTERN, max_length=200, examples=["agent-7"])
    policy: PolicyJson = Field(description="the fold policy (FoldPolicy); budget_tokens at least")
    # The store refuses a NUL (PostgreSQL text cannot hold it), answered 400 naming the field:
    # the document says so without the model refusing it first.
    system: str = Field(default="", description="the system prompt, fixed at creation (no NUL)",
                        json_schema_extra={"pattern": "^[^\\x00]*$"})
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


class AppendIn(_In):
    model_config = ConfigDict(json_schema_extra=append_messages_schema(MAX_APPEND_MESSAGES))

    messages: list[MessageJson] = Field(
        min_length=1, max_length=MAX_APPEND_MESSAGES,
        description=f"messages to append, in order: 1 to {MAX_APPEND_MESSAGES:,}, none over "
                    "8 MiB stored (413 too-large)")
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


class UsageIn(_In):
    usage: UsageJson = Field(description="the provider's usage object, Anthropic "
                             "(input_tokens, cache_read_input_tokens, "
                             "cache_creation_input_tokens, output_tokens) or OpenAI "
                             "(prompt_tokens, completion_tokens) shape; a count that is not "
                             "a whole number >= 0 is refused naming it (invalid-usage)")
    seq: JsonInt = Field(ge=0, description="last_seq of the window the call sent")
    revision: JsonInt = Field(ge=0, description="revision of the window the call sent")
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


class RecallIn(_In):
    """The recall tool's input (``sessionfold_recall``): ledger rows by ``seq`` (with an
    ``offset`` into the first row's text), or a ``query``."""

    model_config = ConfigDict(json_schema_extra=recall_schema())

    seq: str | JsonInt | None = Field(default=None, description='a ledger row or range as '
                                        'the window names it: "12", "#12", "12-30" or '
                                        '"#12–#30", or the row\'s number',
                                        examples=["#3–#14"])
    offset: JsonInt | None = Field(default=None, description="with seq: the character of "
                                     "the first row's text to start at (an answer cut short "
                                     "says where)")
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
    revision: int = Field(description="the window revision the scheduler was nudged at")
    nudged: bool = Field(description="true when the nudge reached the usage bus; false when "
                         "the bus was away (buffered; the scheduler's store sweep covers it)")


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


# --- the call loop over HTTP: the guarded request (service/calls.py) -------------------------

#: Counts of tokens in a call state, within what a usage report may hold.
_TokenCount = Annotated[int, BeforeValidator(whole_numbers), Strict(),
                        Interval(ge=-MAX_REPORTED_TOKENS, le=MAX_REPORTED_TOKENS)]


class CallState(_In):
    """The state of one model call's loop (the client's ``CallState``), as the API wrote it
    in a guarded request: send it back as it came with the model's reply. It carries the
    round count, so any API process can answer the reply."""

    version: Literal[1] = Field(description="the state's format")
    phase: Literal["sending"] = Field(description="a request is out, its reply awaited")
    takes_tools: bool = True
    over_budget: OverBudget | None = None
    cache_breakpoints: bool = False
    rounds: JsonInt = Field(default=0, ge=0, le=2**31,
                            description="recall rounds answered so far in this call")
    retried: bool = Field(default=False, description="the request out is the one retry "
                          "after a context overflow")
    tools: list[Annotated[str, Field(max_length=200)]] = Field(
        default=[], max_length=16, description="the tools sessionfold offers this call")
    revision: JsonInt = Field(default=-1, ge=-1, le=2**62, description="the window "
                              "revision the request was built from")
    last_seq: JsonInt = Field(default=-1, ge=-1, le=2**62)
    unsent_tokens: JsonInt = Field(default=0, ge=-MAX_REPORTED_TOKENS, le=MAX_REPORTED_TOKENS)
    tool_tokens: JsonInt = Field(default=0, ge=-MAX_REPORTED_TOKENS, le=MAX_REPORTED_TOKENS)
    # (Spelled out: pydantic writes the bounds of an optional integer as unknown keywords.)
    sent_tokens: Annotated[_TokenCount | None, WithJsonSchema({"anyOf": [
        {"type": "integer", "minimum": -MAX_REPORTED_TOKENS, "maximum": MAX_REPORTED_TOKENS},
        {"type": "null"}]})] = None


class CallIn(_In):
    shape: WindowShape = Field(default="anthropic", description="the shape of the request: "
                               "anthropic (Messages API) or openai (chat completions)")
    tools: bool = Field(default=True, description="the model call takes the tools sessionfold "
                        "adds (the recall tool, once offered); false: recall is off for it")
    over_budget: OverBudget = Field(
        default="cap", description="a request past the budget less the guard's margin, as "
        "SessionHandle.call's over_budget takes it (one of "
        f"{', '.join(OVER_BUDGET_CHOICES)}): cap folds the session inline and refuses what "
        "still cannot fit (422 budget-exceeded, nothing to send); send sends the best shrink "
        "of the request, fitting or not; the others as SessionHandle.call does them")
    cache_breakpoints: bool | None = Field(
        default=None, description="mark prompt-cache breakpoints (cache_control) after the "
        "window's stable head and its last message; null: yes in the anthropic shape (the only "
        "one that takes them)")


class GuardOut(_Out):
    outcome: Literal["under", "shrunk", "folded", "over-budget"] = Field(
        description="under: the stored window goes as it is; shrunk: the guard left some of "
        "it out of this request (the stored window is untouched); folded: the session was "
        "folded inline first (the hard cap, or a context overflow); over-budget: sent over "
        "the budget because over_budget=send")
    tokens: int = Field(description="the guard's estimate of the request in the provider's "
                        "tokens (the session's calibration), the recall tool included, the "
                        "caller's own tools not")
    budget_tokens: int
    limit_tokens: int = Field(description="the line the guard keeps under: the budget less "
                              "the policy's guard margin")
    unsent_tokens: int = Field(description="tokens of the stored window this request leaves "
                               "out (its usage report adds them back)")
    inline_folds: int = Field(description="folds made on the caller's path for this request")
    revision: int = Field(description="the window revision the request was built from")
    last_seq: int = Field(description="the highest ledger seq in it")


class GuardedRequest(_Out):
    """The request as the guard sends it: what to send the model next."""

    shape: WindowShape
    system: str = Field(description="the session's system prompt (system= of the Messages "
                        "API; in the openai shape also the first message)")
    messages: list[dict[str, Any]] = Field(description="the messages to send, in the shape")
    tools: list[dict[str, Any]] = Field(description="the tools sessionfold adds, in the shape "
                                        "(the recall tool once offered): send them beside your "
                                        "own")
    call: CallState = Field(description="send back with the model's reply (or its error)")
    guard: GuardOut


class ProviderErrorIn(_In):
    status: JsonInt = Field(ge=100, le=599, description="the HTTP status the provider answered")
    body: Annotated[Any, WithJsonSchema({"description": "the provider's error body as it "
                                         "came: its JSON, or its text"})] = None


class ReplyIn(_In):
    """The model's reply to a guarded request (or the error it raised)."""

    model_config = ConfigDict(json_schema_extra=reply_body_schema())

    call: CallState = Field(description="the call state of the guarded request, as it came")
    shape: WindowShape = Field(default="anthropic", description="the shape of the reply: "
                               "anthropic (a Message) or openai (a ChatCompletion)")
    reply: dict[str, Any] | None = Field(default=None, description="the provider's response "
                                         "(its JSON); give reply or error")
    error: ProviderErrorIn | None = Field(default=None, description="what the model call "
                                          "raised instead; give reply or error")
    relayed: bool = Field(default=False, description="the caller already reads this reply (a "
                          "stream handed to its agent): it ends the call whatever it holds")

    @model_validator(mode="after")
    def _one_of(self) -> ReplyIn:
        if (self.reply is None) == (self.error is None):
            raise ValueError("give the model's reply or the error its call raised (one of "
                             "reply, error)")
        return self


class RecallAnswerOut(_Out):
    kind: RecallKind
    outcome: RecallOutcome
    tokens: int


class CallStep(_Out):
    """What follows a model's reply."""

    next: Literal["send", "done", "raise"] = Field(
        description="send: send request (a recall round, or the one retry after a context "
        "overflow); done: the reply is the call's (recorded); raise: the error is not a "
        "context overflow, raise it")
    request: GuardedRequest | None = Field(default=None, description="with send")
    recorded_seq: int | None = Field(default=None, description="with done: the ledger seq the "
                                     "reply was recorded at (null: it had no content)")
    recall: list[RecallAnswerOut] = Field(default=[], description="the recall calls answered "
                                          "at this step, in order")
    tool_results: list[dict[str, Any]] = Field(
        default=[], description="with done, when the reply called the recall tool beside your "
        "own tools: its answers in the reply's shape (tool_result blocks, or tool messages); "
        "send them with your own results in the next message")


class RecallToolDefinition(_Out):
    """The recall tool's definition, in both shapes (the bytes every request carries)."""

    name: str
    version: int = Field(description="changes whenever the definition does")
    anthropic: dict[str, Any] = Field(description="for the Messages API's tools")
    openai: dict[str, Any] = Field(description="for chat completions' tools")
