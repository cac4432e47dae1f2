"""One JSON shape for every error the HTTP API answers with, mapped from the library's tree.

Every error body is ``{"error": {"type": ..., "reason": ..., "message": ...}}``:

- ``type``: the coarse class a client branches on (``invalid_request``, ``authentication``,
  ``permission``, ``not_found``, ``conflict``, ``gone``, ``unavailable``, ``internal``), which
  also fixes the status code family;
- ``reason``: the precise cause, named after the library's error (``tool-pairing``,
  ``invalid-message``, ``session-not-found``, ``stale``, ``store-unavailable``...), or the API's
  own (``unauthorized``, ``admin-only``, ``session-exists``, ``invalid-request``);
- ``message``: the library's message, for a person. A message error also names ``index`` and
  ``field`` (which message of the request, where in it).

The library's errors are mapped here, in one table (:data:`LIBRARY_ERRORS`, most specific
class first); anything else is logged with its traceback and answered as ``internal`` without
one: no traceback, SQL or stored value ever reaches a client.

A message names the request's session as the caller named it: the library's messages name
the store's id, which carries the caller's tenant (:mod:`.tenancy`), whatever route they came
through, so that id is written back as the caller's own (``own``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sessionfold.core.errors import (
    ContextOverflowError,
    DiscardedOriginalsError,
    InvalidInputError,
    InvalidMessageError,
    InvalidPolicyError,
    RedisUnavailableError,
    SchemaError,
    SessionfoldError,
    SessionNotFoundError,
    StaleSpanError,
    StoreError,
    SummarizerError,
    ToolPairingError,
    UsageUnmeasurableError,
)

__all__ = ["LIBRARY_ERRORS", "ApiError", "ErrorSpec", "error_body", "spec_of"]

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
    (InvalidMessageError, ErrorSpec(422, "invalid_request", "invalid-message")),
    (InvalidPolicyError, ErrorSpec(422, "invalid_request", "invalid-policy")),
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


def library_error_body(exc: BaseException, *,
                       own: tuple[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """Status and body for an exception raised while serving a request. ``own``: the store's
    id of the request's session and the caller's id of it (see the module doc)."""
    spec = spec_of(exc)
    if spec is INTERNAL:
        log.error("internal error while serving a request", exc_info=exc)
        return spec.status, error_body(spec, "internal error; the server log has the details")
    if isinstance(exc, ApiError):
        return spec.status, error_body(spec, exc.message)
    message = str(exc) if own is None else str(exc).replace(*own)
    if isinstance(exc, InvalidMessageError):
        return spec.status, error_body(spec, message, index=exc.index, field=exc.field)
    return spec.status, error_body(spec, message)
