"""Recognising "the prompt is longer than the context window" across providers."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest
from sessionfold.core.errors import (
    ContextOverflowError,
    PermanentSummarizerError,
    TransientSummarizerError,
)
from sessionfold.core.overflow import is_context_overflow, overflow_tokens

TOO_LONG = "prompt is too long: 210000 tokens > 200000 maximum"


def anthropic_error(status: int, message: str, kind: str = "invalid_request_error",
                    *, raw: str | None = None) -> anthropic.APIStatusError:
    """The exception the real SDK raises for this response."""
    def handler(request: httpx2.Request) -> httpx2.Response:
        if raw is not None:
            return httpx2.Response(status, text=raw)
        return httpx2.Response(status, json={"type": "error",
                                             "error": {"type": kind, "message": message}})
    client = anthropic.Anthropic(api_key="test", base_url="http://fake", max_retries=0,
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
    with pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(model="claude-x", max_tokens=10,
                               messages=[{"role": "user", "content": "hi"}])
    return info.value


class OpenAIStyleError(Exception):
    """Shaped like openai.BadRequestError (not imported: sessionfold does not depend on it)."""

    def __init__(self, message: str, *, code: str | None, body: Any = None,
                 status_code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.body = body
        self.status_code = status_code


def test_anthropic_prompt_too_long_is_an_overflow_with_its_numbers() -> None:
    exc = anthropic_error(400, TOO_LONG)
    assert isinstance(exc, anthropic.BadRequestError)
    assert is_context_overflow(exc)
    assert overflow_tokens(exc) == (210000, 200000)


def test_anthropic_input_plus_max_tokens_over_the_limit_is_an_overflow() -> None:
    exc = anthropic_error(400, "input length and `max_tokens` exceed context limit: 197000 + "
                               "8192 > 200000, decrease input length or `max_tokens` and try "
                               "again")
    assert is_context_overflow(exc)
    assert overflow_tokens(exc) == (205192, 200000)


def test_a_non_json_body_still_counts() -> None:
    exc = anthropic_error(400, "", raw=f"Bad request: {TOO_LONG}")
    assert isinstance(exc.body, str)
    assert is_context_overflow(exc)
    assert overflow_tokens(exc) == (210000, 200000)


@pytest.mark.parametrize("body", [
    {"type": "error", "error": {"type": "invalid_request_error", "message": TOO_LONG}},
    {"error": {"message": TOO_LONG}},
    json.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                           "message": TOO_LONG}}),
    TOO_LONG,
])
def test_raw_bodies_are_read(body: Any) -> None:
    assert is_context_overflow(body)
    assert overflow_tokens(body) == (210000, 200000)


def test_openai_context_length_exceeded_is_an_overflow() -> None:
    message = ("This model's maximum context length is 8192 tokens. However, your messages "
               "resulted in 8500 tokens. Please reduce the length of the messages.")
    exc = OpenAIStyleError(message, code="context_length_exceeded", body={
        "message": message, "type": "invalid_request_error", "param": "messages",
        "code": "context_length_exceeded"})
    assert is_context_overflow(exc)
    assert overflow_tokens(exc) == (8500, 8192)


def test_openai_code_alone_is_enough() -> None:
    assert is_context_overflow(OpenAIStyleError("Bad request", code="context_length_exceeded"))
    assert overflow_tokens(OpenAIStyleError("Bad request", code="context_length_exceeded")) is None
    assert is_context_overflow({"error": {"code": "context_length_exceeded", "message": "x"}})


def test_sessionfolds_own_overflow_error_counts() -> None:
    assert is_context_overflow(ContextOverflowError("window over the model's limit"))
    assert overflow_tokens(ContextOverflowError("no numbers here")) is None
    assert overflow_tokens(ContextOverflowError(TOO_LONG)) == (210000, 200000)


def test_a_wrapped_provider_error_is_followed_down_its_cause_chain() -> None:
    class AgentError(RuntimeError):
        pass

    original = anthropic_error(400, TOO_LONG)
    try:
        try:
            raise original
        except anthropic.BadRequestError as exc:
            raise AgentError("agent step failed") from exc
    except AgentError as wrapped:
        assert is_context_overflow(wrapped)
        assert overflow_tokens(wrapped) == (210000, 200000)


@pytest.mark.parametrize("exc", [
    ValueError("something else"),
    OpenAIStyleError("Rate limit", code="rate_limit_exceeded"),
    OpenAIStyleError(TOO_LONG, code=None, status_code=429),
    PermanentSummarizerError(TOO_LONG, status_code=400),
    TransientSummarizerError("overloaded", status_code=529),
], ids=["plain", "openai-rate-limit", "wrong-status", "summarizer-permanent",
        "summarizer-transient"])
def test_other_errors_are_not_overflows(exc: BaseException) -> None:
    assert not is_context_overflow(exc)
    assert overflow_tokens(exc) is None


@pytest.mark.parametrize(("status", "message", "kind"), [
    (400, "max_tokens: must be greater than 0", "invalid_request_error"),
    (429, "Number of request tokens has exceeded your per-minute rate limit",
     "rate_limit_error"),
    (529, "Overloaded", "overloaded_error"),
    (413, "Request exceeds the maximum allowed number of bytes.", "request_too_large"),
])
def test_other_anthropic_errors_are_not_overflows(status: int, message: str, kind: str) -> None:
    assert not is_context_overflow(anthropic_error(status, message, kind))


def test_a_summarizer_error_caused_by_an_overflow_is_not_the_agents_overflow() -> None:
    cause = anthropic_error(400, TOO_LONG)
    try:
        raise PermanentSummarizerError("summarizer failed", status_code=400) from cause
    except PermanentSummarizerError as exc:
        assert not is_context_overflow(exc)
        assert is_context_overflow(exc.__cause__)  # type: ignore[arg-type]


def test_numbers_with_separators_parse() -> None:
    assert overflow_tokens("prompt is too long: 1,234,567 tokens > 1,000,000 maximum") == (
        1234567, 1000000)
