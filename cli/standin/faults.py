"""The stand-in's scripted failures: :class:`Fault`, an HTTP error as either API words it.

``FakeProvider.script(Fault.overloaded(), ...)`` queues them one per request and
``FakeProvider.fail_always(fault)`` answers every request with one; the provider also answers
with a fault when a request is malformed or over its context window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Fault"]


@dataclass(frozen=True)
class Fault:
    """One scripted failure: the HTTP status, the Anthropic error type and message, and headers."""

    status: int
    error_type: str
    message: str
    retry_after: float | None = None
    #: OpenAI's error ``code`` (``context_length_exceeded``); Anthropic's errors have none.
    code: str | None = None

    @classmethod
    def overloaded(cls) -> Fault:
        return cls(529, "overloaded_error", "Overloaded")

    @classmethod
    def rate_limited(cls, retry_after: float | None = 1.0) -> Fault:
        return cls(429, "rate_limit_error",
                   "Number of request tokens has exceeded your rate limit.", retry_after)

    @classmethod
    def server_error(cls) -> Fault:
        return cls(500, "api_error", "Internal server error")

    @classmethod
    def bad_request(cls, message: str = "messages: text content blocks must be non-empty") -> Fault:
        return cls(400, "invalid_request_error", message)

    @classmethod
    def context_length_exceeded(cls, tokens: int, maximum: int) -> Fault:
        """OpenAI's answer to a request over the context window."""
        return cls(400, "invalid_request_error",
                   f"This model's maximum context length is {maximum} tokens. However, your "
                   f"messages resulted in {tokens} tokens. Please reduce the length of the "
                   "messages.", code="context_length_exceeded")

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}

    def openai_body(self) -> dict[str, Any]:
        """The fault as OpenAI's API words its errors."""
        return {"error": {"message": self.message, "type": self.error_type, "param": None,
                          "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"retry-after": f"{self.retry_after:g}"}
