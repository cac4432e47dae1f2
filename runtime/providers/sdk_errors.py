"""A provider SDK's errors mapped into sessionfold's, once for every provider.

The ``anthropic`` and ``openai`` SDKs are generated from the same template: a timeout, a
connection error, a status error carrying the response, and a base class. :func:`mapped_errors`
translates them where a provider calls its SDK:

- timeouts and connection errors, 408, 409 (both retried by the SDKs themselves), 429, 529 and
  every 5xx become :class:`TransientSummarizerError`, with the provider's ``retry-after-ms`` /
  ``retry-after`` hint in seconds: the Celery task retries it, with its own backoff and cap;
- any other status (a prompt longer than the context window, bad credentials, a refused
  request) and any other SDK error become :class:`PermanentSummarizerError`.

The SDK's own retries are off in every provider (``max_retries=0``): an SDK retry would hide a
429 from the task's backoff and its cap, and the SDKs honour ``retry-after`` without a bound.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sessionfold.core.errors import PermanentSummarizerError, TransientSummarizerError

__all__ = ["TRANSIENT_STATUSES", "SdkErrors", "mapped_errors", "retry_after"]

#: Statuses worth retrying besides every 5xx: rate limit, overload, and the two the SDKs
#: themselves retry (408 request timeout, 409 lock timeout).
TRANSIENT_STATUSES = frozenset({408, 409, 429, 529})


@dataclass(frozen=True)
class SdkErrors:
    """One SDK's exception classes, and what its API is called in a message.

    ``permanent``: a status error that is permanent whatever its status (OpenAI's 429
    ``insufficient_quota``: no backoff brings credit back).
    """

    api: str
    timeout: type[Exception]
    connection: type[Exception]
    status: type[Exception]
    base: type[Exception]
    permanent: Callable[[Any], bool] = lambda exc: False


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The provider's ``retry-after-ms`` / ``retry-after`` hint in seconds, if it sent one
    (``retry-after`` may be seconds or an HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(raw)
    if parsed is None:
        return None
    return max(0.0, float(email.utils.mktime_tz(parsed) - time.time()))


def _detail(exc: Any) -> str:
    """The API's own words for a status error: its error message, else the SDK's text."""
    message = getattr(exc, "api_message", None)  # anthropic reads it out of the body
    body = getattr(exc, "body", None)
    if not message and isinstance(body, Mapping):  # openai keeps the body's "error" object
        message = body.get("message")
    return message if isinstance(message, str) and message else str(exc)


@contextmanager
def mapped_errors(sdk: SdkErrors) -> Iterator[None]:
    """Translate ``sdk``'s exceptions into sessionfold's, at the one place they enter."""
    try:
        yield
    except sdk.timeout as exc:
        raise TransientSummarizerError(f"summarizer request to {sdk.api} timed out: "
                                       f"{exc}") from exc
    except sdk.connection as exc:
        raise TransientSummarizerError(f"cannot reach {sdk.api}: {exc}") from exc
    except sdk.status as caught:
        error: Any = caught  # the SDK's APIStatusError: status_code and response
        status: int = error.status_code
        described = f"{sdk.api} answered {status}: {_detail(error)}"
        if (status in TRANSIENT_STATUSES or status >= 500) and not sdk.permanent(error):
            raise TransientSummarizerError(described, retry_after=retry_after(
                error.response.headers), status_code=status) from caught
        raise PermanentSummarizerError(described, status_code=status) from caught
    except sdk.base as exc:
        raise PermanentSummarizerError(f"summarizer call to {sdk.api} failed: {exc}") from exc
