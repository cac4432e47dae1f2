"""Recognising a provider's "your prompt is longer than my context window" error.

The inline fallback folds a session and retries once when, and only when, the provider rejected a
call as too long. No provider gives this one error a class of its own, so it is recognised by its
shape:

- Anthropic: ``400 invalid_request_error`` with the message ``prompt is too long: 210000 tokens >
  200000 maximum`` (there is no error code for it), or ``input length and `max_tokens` exceed
  context limit: 197000 + 8192 > 200000``; as an ``anthropic.BadRequestError``, or its raw body
  (a dict or a string);
- OpenAI: the error code ``context_length_exceeded`` (read from ``exc.code`` or the body; the
  ``openai`` package is not imported), with the message ``maximum context length is 8192 tokens.
  However, your messages resulted in 8500 tokens``;
- sessionfold's own :class:`~sessionfold.core.errors.ContextOverflowError`.

Errors wrapped with ``raise Wrapper(...) from provider_error`` are followed down their
``__cause__`` chain. A :class:`~sessionfold.core.errors.SummarizerError` is never an overflow of
the agent's call, whatever its cause: it is about the summarizer's own request.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import ContextOverflowError, SessionfoldError

__all__ = ["is_context_overflow", "overflow_tokens"]

_NUMBER = r"(\d[\d,_]*)"
_ANTHROPIC_TOO_LONG = re.compile(r"prompt is too long", re.IGNORECASE)
_ANTHROPIC_TOKENS = re.compile(
    rf"prompt is too long:?\s*{_NUMBER}\s*tokens?\s*>\s*{_NUMBER}\s*maximum", re.IGNORECASE
)
_ANTHROPIC_LIMIT = re.compile(
    rf"exceeds? (?:the )?context limit:?\s*{_NUMBER}\s*\+\s*{_NUMBER}\s*>\s*{_NUMBER}",
    re.IGNORECASE,
)
_OPENAI_CODE = "context_length_exceeded"
_OPENAI_TOKENS = re.compile(
    rf"maximum context length is {_NUMBER} tokens.*?(?:resulted in|requested) {_NUMBER} tokens",
    re.IGNORECASE | re.DOTALL,
)
# A status that cannot be "too long" (429, 500...) is not an overflow whatever its text says.
_OVERFLOW_STATUSES = frozenset({400, 413})


def _int(text: str) -> int:
    return int(text.replace(",", "").replace("_", ""))


def _body_texts(body: Any) -> Iterator[str]:
    """Message and code strings of an error body: ``{"error": {"message", "code", "type"}}``."""
    if isinstance(body, str):
        yield body
    elif isinstance(body, Mapping):
        for key in ("message", "code", "type"):
            value = body.get(key)
            if isinstance(value, str):
                yield value
        inner = body.get("error")
        if inner is not None and inner is not body:
            yield from _body_texts(inner)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


def _texts(error: BaseException | Mapping[str, Any] | str) -> Iterator[str]:
    """Every string that may carry the overflow signal, following the cause chain."""
    if not isinstance(error, BaseException):
        yield from _body_texts(error)
        return
    for exc in _chain(error):
        if isinstance(exc, SessionfoldError) and not isinstance(exc, ContextOverflowError):
            return  # sessionfold's other errors (summarizer failures...) are not the agent's call
        status = getattr(exc, "status_code", None)
        if isinstance(status, int) and status not in _OVERFLOW_STATUSES:
            continue
        code = getattr(exc, "code", None)
        if isinstance(code, str):
            yield code
        yield from _body_texts(getattr(exc, "body", None))
        message = getattr(exc, "message", None)
        if isinstance(message, str):
            yield message
        yield str(exc)


def is_context_overflow(error: BaseException | Mapping[str, Any] | str) -> bool:
    """True if ``error`` says the request was longer than the model's context window.

    ``error`` is an exception (anthropic's, openai's, a wrapper raised ``from`` one, or
    :class:`ContextOverflowError`) or a raw error body (dict or string).
    """
    if isinstance(error, BaseException) and any(
        isinstance(e, ContextOverflowError) for e in _chain(error)
    ):
        return True
    for text in _texts(error):
        if (text == _OPENAI_CODE or _ANTHROPIC_TOO_LONG.search(text)
                or _ANTHROPIC_LIMIT.search(text) or _OPENAI_CODE in text):
            return True
    return False


def overflow_tokens(error: BaseException | Mapping[str, Any] | str) -> tuple[int, int] | None:
    """``(prompt_tokens, maximum_tokens)`` named by an overflow error, when it names them.

    For Anthropic's ``input length and max_tokens exceed context limit: A + B > M`` the first
    number is ``A + B`` (what the request asked the window to hold).
    """
    if not is_context_overflow(error):
        return None
    for text in _texts(error):
        match = _ANTHROPIC_TOKENS.search(text)
        if match:
            return _int(match[1]), _int(match[2])
        match = _ANTHROPIC_LIMIT.search(text)
        if match:
            return _int(match[1]) + _int(match[2]), _int(match[3])
        match = _OPENAI_TOKENS.search(text)
        if match:
            return _int(match[2]), _int(match[1])
    return None
