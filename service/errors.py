"""One JSON shape for every error the HTTP API answers with, mapped from the library's tree.

Every error body is ``{"error": {"type": ..., "reason": ..., "message": ...}}``:

- ``type``: the coarse class a client branches on (``invalid_request``, ``authentication``,
  ``permission``, ``not_found``, ``conflict``, ``gone``, ``unavailable``, ``internal``), which
  also fixes the status code family;
- ``reason``: the precise cause, named after the library's error (``tool-pairing``,
  ``invalid-message``, ``session-not-found``, ``stale``, ``store-unavailable``...), or the API's
  own (``unauthorized``, ``admin-only``, ``session-exists``, ``invalid-request``);
- ``message``: the library's message, for a person. A message error also names ``index`` and
  ``field`` (which message of the request, where in it), a usage error ``field``, a request
  the hard cap refuses (``budget-exceeded``) the ``seq`` of the message that cannot fit (none:
  the system prompt), its ``tokens`` and the ``budget_tokens``.

The library's errors are mapped here, in one table (:data:`LIBRARY_ERRORS`, most specific
class first). An answer of 5xx says nothing of what failed inside (no traceback, SQL, driver
text such as ``connection to server at "127.0.0.1", port 5432 failed``, or stored value): it
says what is unavailable and carries an ``error_id``, which the server logs with the details.

A message names the request's session as the caller named it: the library's messages name
the store's id, which carries the caller's tenant (:mod:`.tenancy`), whatever route they came
through, so every such id is written back as the caller's own
(:func:`~.tenancy.without_namespace`).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any

from sessionfold.core.errors import (
    BudgetExceededError,
    ContextOverflowError,
    DiscardedOriginalsError,
    InvalidInputError,
    InvalidMessageError,
    InvalidPolicyError,
    InvalidUsageError,
    RedisUnavailableError,
    SchemaError,
    SessionfoldError,
    SessionNotFoundError,
    StaleSpanError,
    StoreError,
    SummarizerError,
    TooLargeError,
    ToolPairingError,
    UsageUnmeasurableError,
)

from .tenancy import without_namespace

__all__ = ["LIBRARY_ERRORS", "ApiError", "ErrorSpec", "Failure", "error_answer", "error_body",
           "logged_failure", "spec_of"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """How one kind of error is answered: status, type and reason."""

    status: int
    type: str
    reason: str


#: The library's error tree (core/errors.py) as HTTP answers, most specific class first.
LIBRARY_ERRORS: tuple[tuple[type[SessionfoldError], ErrorSpec], ...] = (
    (ToolPairingError, ErrorSpec(422, "invalid_request", "tool-pairing")),
    (TooLargeError, ErrorSpec(413, "invalid_request", "too-large")),
    (InvalidMessageError, ErrorSpec(422, "invalid_request", "invalid-message")),
    (InvalidPolicyError, ErrorSpec(422, "invalid_request", "invalid-policy")),
    (InvalidUsageError, ErrorSpec(422, "invalid_request", "invalid-usage")),
    (InvalidInputError, ErrorSpec(400, "invalid_request", "invalid-input")),
    (UsageUnmeasurableError, ErrorSpec(422, "invalid_request", "usage-unmeasurable")),
    (SessionNotFoundError, ErrorSpec(404, "not_found", "session-not-found")),
    (StaleSpanError, ErrorSpec(409, "conflict", "stale")),
    (DiscardedOriginalsError, ErrorSpec(410, "gone", "discarded-originals")),
    (SchemaError, ErrorSpec(503, "unavailable", "schema-mismatch")),
    (StoreError, ErrorSpec(503, "unavailable", "store-unavailable")),
    (RedisUnavailableError, ErrorSpec(503, "unavailable", "redis-unavailable")),
    (SummarizerError, ErrorSpec(502, "unavailable", "summarizer-failed")),
    (ContextOverflowError, ErrorSpec(400, "invalid_request", "context-overflow")),
    # The request is well formed, but the session's window cannot be sent within its budget:
    # one message (``seq``) or the system prompt cannot fit, whatever the guard shrinks.
    (BudgetExceededError, ErrorSpec(422, "invalid_request", "budget-exceeded")),
)
INTERNAL = ErrorSpec(500, "internal", "internal")


class ApiError(Exception):
    """An error of the API itself (not the library's): authentication, permission, conflict."""

    def __init__(self, status: int, type_: str, reason: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.spec = ErrorSpec(status, type_, reason)
        self.message = message
        self.headers = headers or {}


def spec_of(exc: BaseException) -> ErrorSpec:
    """The answer for ``exc``: its entry in :data:`LIBRARY_ERRORS`, else ``internal``."""
    if isinstance(exc, ApiError):
        return exc.spec
    for cls, spec in LIBRARY_ERRORS:
        if isinstance(exc, cls):
            return spec
    return INTERNAL


def error_body(spec: ErrorSpec, message: str, **extra: Any) -> dict[str, Any]:
    """The one error shape (extra fields that are None are left out)."""
    error: dict[str, Any] = {"type": spec.type, "reason": spec.reason, "message": message}
    error.update({k: v for k, v in extra.items() if v is not None})
    return {"error": error}


#: What a 5xx answer says, by reason: what is unavailable, never why (the log says why).
_UNAVAILABLE = {
    "store-unavailable": "the session store is unavailable",
    "schema-mismatch": "the session store's schema does not match this server",
    "redis-unavailable": "Redis is unavailable",
    "summarizer-failed": "the summarizer failed",
    "internal": "internal error",
}


@dataclass(frozen=True, slots=True)
class Failure:
    """A failure as a client may hear of it: what is unavailable, and the id the log has it
    under."""

    error_id: str
    message: str


def logged_failure(exc: BaseException, what: str = "answering a request") -> Failure:
    """Log ``exc`` (the driver's text, and the traceback of an error outside the library's
    tree) under a new error id; what a client may be told instead."""
    spec = spec_of(exc)
    error_id = secrets.token_hex(6)
    log.error("%s failed (error id %s): %s: %s", what, error_id, type(exc).__name__, exc,
              exc_info=exc if spec is INTERNAL else None)
    said = _UNAVAILABLE.get(spec.reason, "the server could not answer")
    return Failure(error_id, f"{said} (error id {error_id}: the server log has the details)")


def error_answer(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, body and headers for an exception raised while serving a request (see the
    module doc)."""
    spec = spec_of(exc)
    headers = dict(exc.headers) if isinstance(exc, ApiError) else {}
    if spec.status >= 500:
        failure = logged_failure(exc)
        return spec.status, error_body(spec, failure.message,
                                       error_id=failure.error_id), headers
    if isinstance(exc, ApiError):
        return spec.status, error_body(spec, without_namespace(exc.message)), headers
    message = without_namespace(str(exc))
    if isinstance(exc, InvalidMessageError):
        return spec.status, error_body(spec, message, index=exc.index, field=exc.field), headers
    if isinstance(exc, InvalidUsageError):
        return spec.status, error_body(spec, message, field=exc.field), headers
    if isinstance(exc, BudgetExceededError):
        return spec.status, error_body(spec, message, seq=exc.seq, tokens=exc.tokens,
                                       budget_tokens=exc.budget_tokens), headers
    return spec.status, error_body(spec, message), headers
