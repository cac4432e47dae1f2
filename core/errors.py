"""The one error tree of sessionfold.

Callers catch these, never a library's own exceptions: anthropic, SQLAlchemy and redis errors are
translated where they enter (``raise Mapped(msg) from exc``)::

    SessionfoldError
    ├── InvalidInputError              bad input from a caller; nothing was written
    │   ├── InvalidMessageError        a message or block is malformed (names index and field)
    │   │   ├── ToolPairingError       an orphan tool_result / a tool_use answered out of place
    │   │   └── TooLargeError          an append of more messages, or a larger one, than taken
    │   ├── InvalidPolicyError         a FoldPolicy value is out of range (says what is allowed)
    │   └── InvalidUsageError          a usage report's count is not a whole number >= 0
    ├── UsageUnmeasurableError         the provider reported zero usage for a call that succeeded
    ├── SummarizerError                the summarizer could not produce a summary
    │   ├── TransientSummarizerError   429, 529, 5xx, timeouts: retry later (``retry_after``)
    │   └── PermanentSummarizerError   anything else: record a refusal, do not retry
    ├── ContextOverflowError           the provider rejected a request as too long
    ├── BudgetExceededError            one message alone keeps a request over its budget
    ├── StaleSpanError                 a fold lost its compare-and-set; nothing was written
    ├── SummaryDeferred                not a failure: a visit's summary went to a batch API
    ├── SessionNotFoundError           no session with that id
    ├── DiscardedOriginalsError        recover() of a span whose originals were discarded
    ├── SchemaError                    the database schema is missing or newer than this code
    ├── StoreError                     the store's database failed; the transaction rolled back
    ├── RedisUnavailableError          Redis could not be reached, timed out, or refused a command
    ├── MissingExtraError              a role's optional dependencies (an extra) are not installed
    └── MisuseError                    called in a way never supported (a bug in the caller)
        └── UnsupportedModelError      a pydantic model class the fast copy or decoder cannot take
"""

from __future__ import annotations


class SessionfoldError(Exception):
    """Base of every error sessionfold raises on purpose."""


class InvalidInputError(SessionfoldError, ValueError):
    """The caller passed something sessionfold cannot accept. Nothing was written."""


class InvalidMessageError(InvalidInputError):
    """A message or one of its blocks is malformed.

    ``index`` is the 0-based position of the offending message in the input, ``field`` the dotted
    path inside it (for example ``content[1].tool_use_id``).
    """

    def __init__(self, reason: str, *, index: int | None = None, field: str | None = None) -> None:
        where = []
        if index is not None:
            where.append(f"message {index}")
        if field:
            where.append(field)
        prefix = ": ".join(where)
        super().__init__(f"{prefix}: {reason}" if prefix else reason)
        self.reason = reason
        self.index = index
        self.field = field


class InvalidPolicyError(InvalidInputError):
    """A FoldPolicy value is out of range; the message says what is allowed."""


class ToolPairingError(InvalidMessageError):
    """A tool_result without its tool_use in the previous message, or the reverse."""


class TooLargeError(InvalidMessageError):
    """An append holds more messages than the store takes at once, or a message (``index``)
    larger than it takes; the message names the limit. Nothing was written."""


class InvalidUsageError(InvalidInputError):
    """A provider usage report holds a count that is not a whole number of tokens >= 0 (a
    string, a boolean, a fraction, NaN or an infinity), or is no usage report at all.

    ``field`` is the count's path in the report (``usage.input_tokens``).
    """

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        super().__init__(reason)
        self.field = field


class UsageUnmeasurableError(SessionfoldError):
    """A call succeeded but the provider reported zero prompt tokens (or an impossible number).

    sessionfold will not guess at the size of such a session unless its policy says
    ``measure="estimate"``.
    """


class SummarizerError(SessionfoldError):
    """The summarizer could not produce a summary."""


class TransientSummarizerError(SummarizerError):
    """Worth retrying later (rate limit, overload, server error, timeout).

    ``retry_after`` carries the provider's ``retry-after`` hint in seconds, when it sent one.
    """

    def __init__(self, message: str, *, retry_after: float | None = None,
                 status_code: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.status_code = status_code


class PermanentSummarizerError(SummarizerError):
    """Retrying will not help (bad request, auth, a summary that cannot be produced)."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ContextOverflowError(SessionfoldError):
    """The provider rejected the request as longer than the model's context window."""


class BudgetExceededError(SessionfoldError):
    """A request cannot be brought under its session's budget: after every shrink the
    pre-send guard may make (the cheap layers, clipping inside the protected turns, an inline
    fold, leaving the older history out) what is left is still over it, because one message
    (or the system prompt) cannot be made small enough. Nothing was sent.

    ``tokens`` is the request's estimate after those shrinks, ``budget_tokens`` the budget,
    ``seq`` the ledger seq of the largest message left (None: the system prompt).
    """

    def __init__(self, message: str, *, tokens: int, budget_tokens: int,
                 seq: int | None = None) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.budget_tokens = budget_tokens
        self.seq = seq


class StaleSpanError(SessionfoldError):
    """A fold lost its compare-and-set (the window changed or a newer claim exists).

    Nothing of the fold was written; the caller re-reads the window.
    """


class SummaryDeferred(SessionfoldError):
    """Not a failure: the visit's summary was asked of a provider's batch API, which answers in
    minutes. Raised by a batch summarizer (:attr:`~sessionfold.core.compact.FoldVisit.
    batch_summarizer`) at the first summary a visit priced at the batch rate asks for;
    :func:`~sessionfold.core.compact.fold_window` lets it through (it is no
    :class:`SummarizerError`), nothing of the visit is decided or written, and the caller makes
    the visit again once the answer is in (:mod:`sessionfold.runtime.batch_folds`)."""


class SessionNotFoundError(SessionfoldError, LookupError):
    """No session with that id."""


class DiscardedOriginalsError(SessionfoldError):
    """The originals of a span were discarded under ``retain="discard"``."""


class SchemaError(SessionfoldError):
    """The database schema is missing, or newer than this version of sessionfold."""


class StoreError(SessionfoldError):
    """The session store's database failed (unreachable, connection lost, lock wait timed out).

    Raised where SQLAlchemy's errors enter sessionfold (:mod:`sessionfold.store.db`). The
    transaction was rolled back: nothing of it was written, and it is safe to retry.
    """


class RedisUnavailableError(SessionfoldError):
    """Redis could not be reached, timed out, or refused a command (for example out of memory).

    Raised where redis-py's errors enter sessionfold (:mod:`sessionfold.runtime.redis_conn`).
    The usage publisher never raises it: reporting usage must not fail an agent.
    """


#: The optional top-level modules sessionfold imports, and the extra (``pip install
#: 'sessionfold[EXTRA]'``, see pyproject.toml) that brings each. A module missing from here is
#: part of the base install: its absence is a broken install, not a missing extra.
EXTRA_OF_MODULE: dict[str, str] = {
    "celery": "worker", "kombu": "worker", "billiard": "worker", "flower": "worker",
    "fastapi": "api", "starlette": "api", "uvicorn": "api",
    "psycopg": "postgres",
    "rich": "demo", "matplotlib": "demo", "PIL": "demo",
    "openai": "openai",
}


class MissingExtraError(SessionfoldError):
    """A part of sessionfold needs an extra that is not installed; the message names the pip
    command (``sessionfold worker needs the worker extra: pip install 'sessionfold[worker]'``).

    ``what`` is the part that needs it, ``extra`` the extra's name.
    """

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(f"{what} needs the {extra} extra: pip install 'sessionfold[{extra}]'")
        self.what = what
        self.extra = extra

    @classmethod
    def of_missing(cls, exc: ModuleNotFoundError, what: str) -> MissingExtraError | None:
        """The error for ``exc`` when the module it could not import comes with an extra
        (:data:`EXTRA_OF_MODULE`); None when it does not (a broken install: let it raise)."""
        extra = EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0])
        return None if extra is None else cls(what, extra)


class MisuseError(SessionfoldError, RuntimeError):
    """sessionfold was called in a way it never supports: a step out of order (metrics made
    multiprocess after the first was recorded), a class it cannot handle. A bug in the calling
    code, not bad data; the message says what to do instead."""


class UnsupportedModelError(MisuseError, TypeError):
    """A pydantic model class the fast copy (:func:`~.evolve.evolve`) or the store's decoder
    cannot take (it has private attributes): copy it with ``model_copy``, decode it by
    validation."""
