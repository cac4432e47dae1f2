"""A call's tokens as billed, and the one strict reader of a provider's usage report.

Anthropic's ``input_tokens`` exclude cache reads and writes; OpenAI's ``prompt_tokens`` include
the cached ones. :func:`read_usage` reads a report in either shape into :class:`CallTokens`
(uncached, read, written by cache lifetime, output) for every caller (library, HTTP, bus), and
refuses a count that is not a whole number >= 0, naming the field: a mangled report must say
so, not measure the session wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Literal, get_args

from .errors import InvalidInputError, InvalidUsageError, UsageUnmeasurableError

__all__ = [
    "CACHE_TTLS",
    "MAX_REPORTED_TOKENS",
    "TTL_SECONDS",
    "CacheTTL",
    "CallTokens",
    "UsageShape",
    "check_tokens",
    "check_ttl",
    "read_usage",
    "usage_shape",
    "usage_tokens",
]

#: A prompt cache's lifetime: Anthropic sells 5 minutes (the default) and 1 hour; each use of a
#: cached prefix starts its lifetime again.
CacheTTL = Literal["5m", "1h"]
CACHE_TTLS: tuple[str, ...] = get_args(CacheTTL)
TTL_SECONDS: Mapping[str, float] = MappingProxyType({"5m": 300.0, "1h": 3600.0})

#: How a provider reports a call's prompt tokens. ``"anthropic"``: ``input_tokens`` EXCLUDE cache
#: reads (``cache_read_input_tokens``) and writes (``cache_creation_input_tokens``).
#: ``"openai"``: ``prompt_tokens`` (Responses API: ``input_tokens``) INCLUDE the cached ones
#: (``prompt_tokens_details.cached_tokens``); nothing is reported as written.
UsageShape = Literal["anthropic", "openai"]


def check_ttl(ttl: Any) -> CacheTTL:
    """``ttl`` as a cache lifetime; InvalidInputError when it is none."""
    if ttl == "5m":
        return "5m"
    if ttl == "1h":
        return "1h"
    raise InvalidInputError(f"a cache TTL is one of {', '.join(CACHE_TTLS)}, got {ttl!r}")


def check_tokens(name: str, value: Any) -> int:
    """``value`` as a whole number of tokens >= 0; InvalidInputError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a whole number of tokens >= 0, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class CallTokens:
    """The tokens of one call, split the way they are billed.

    ``uncached`` is input billed at the plain price (no cache involved, or OpenAI's uncached part
    of ``prompt_tokens``); the cache writes are split by lifetime. Every field is a whole
    number >= 0 (InvalidInputError otherwise).
    """

    uncached: int = 0
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
    output: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            check_tokens(f.name, getattr(self, f.name))

    @classmethod
    def predicted(cls, *, read: int = 0, written: int = 0, uncached: int = 0, output: int = 0,
                  ttl: CacheTTL = "5m") -> CallTokens:
        """A predicted call: ``read`` from a warm cache, ``written`` to it with lifetime ``ttl``."""
        one_hour = check_ttl(ttl) == "1h"
        return cls(uncached=uncached, cache_read=read,
                   cache_write_5m=0 if one_hour else written,
                   cache_write_1h=written if one_hour else 0, output=output)

    @property
    def prompt(self) -> int:
        """Every input token of the call, however billed (what the window measured)."""
        return self.uncached + self.cache_read + self.cache_write_5m + self.cache_write_1h

    def __add__(self, other: CallTokens) -> CallTokens:
        return CallTokens(*(getattr(self, f.name) + getattr(other, f.name)
                            for f in fields(self)))


#: No context window holds a billion tokens: a reported count past it is garbage (and would not
#: fit the store's integer columns on every backend), refused rather than taken.
MAX_REPORTED_TOKENS = 10**9


def _usage_value(usage: Any, name: str) -> Any:
    return usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)


def _usage_count(usage: Any, name: str, where: str = "usage") -> int | None:
    """A token count of a usage (a mapping or an SDK object); None when it is absent.

    The one strict reading of a provider's count: an int >= 0 and nothing else. A boolean, a
    float (even a whole one: no provider sends one), a numeric string, NaN or an infinity
    (``1e400`` in JSON) is refused naming the field, never rounded or read as zero: a report
    the agent's code mangled must say so, not measure the session wrong.
    """
    value = _usage_value(usage, name)
    if value is None:
        return None
    field = f"{where}.{name}"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidUsageError(f"{field} must be a whole number of tokens >= 0, got "
                                f"{_shown(value)}", field=field)
    if value > MAX_REPORTED_TOKENS:
        raise UsageUnmeasurableError(
            f"{field} is {_shown(value)} tokens, more than any context window holds (at most "
            f"{MAX_REPORTED_TOKENS:,} are taken); this report is not used")
    return value


def _shown(value: Any) -> str:
    """``value`` for an error message (Python refuses to print an int of 4,300+ digits)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if value.bit_length() < 128 else \
            f"an integer of {value.bit_length()} bits"
    return f"{value!r:.60}"


_ANTHROPIC_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens",
                     "cache_creation_input_tokens")
_OPENAI_FIELDS = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
#: Fields only one provider's reports name: they tell the shape of a report.
_ANTHROPIC_ONLY = ("cache_read_input_tokens", "cache_creation_input_tokens", "cache_creation")
_OPENAI_ONLY = ("prompt_tokens", "completion_tokens", "prompt_tokens_details",
                "input_tokens_details")


def usage_shape(usage: Any) -> UsageShape:
    """The shape a usage report is in, read from the fields it names: ``"openai"`` when it names
    one only OpenAI's reports have (``prompt_tokens``, ``completion_tokens`` or a ``*_details``
    breakdown of the cached tokens), else ``"anthropic"`` (a report of ``input_tokens`` and
    ``output_tokens`` alone reads the same in both). InvalidUsageError for a report naming
    fields of both, or that is no report at all."""
    _check_report(usage)
    named = [n for n in _ANTHROPIC_ONLY if _usage_value(usage, n) is not None]
    openai = [n for n in _OPENAI_ONLY if _usage_value(usage, n) is not None]
    if named and openai:
        raise InvalidUsageError(
            f"this usage names fields of both Anthropic's shape ({named[0]}) and OpenAI's "
            f"({openai[0]}); a report is one provider's", field=f"usage.{openai[0]}")
    return "openai" if openai else "anthropic"


def read_usage(usage: Any, shape: UsageShape | None = None, *,
               ttl: CacheTTL = "5m") -> CallTokens:
    """The one strict reader of a provider's usage report, for every caller: the billed split
    of the call (:class:`CallTokens`; ``.prompt`` is its whole prompt).

    ``usage`` is a mapping or an SDK usage object in either provider's shape (``shape`` None:
    :func:`usage_shape` reads it from the fields); it is read as :func:`usage_tokens` reads
    it. A report naming no count at all (None, ``{}``, an SDK object whose counts are None)
    reads as zero tokens: whether an unmeasured call is an error is the caller's rule
    (:func:`~sessionfold.core.tokens.measured_prompt_tokens`). A count that is not a whole
    number >= 0 raises InvalidUsageError naming it (``usage.input_tokens``); one past
    :data:`MAX_REPORTED_TOKENS`, UsageUnmeasurableError.
    """
    if usage is None:
        return CallTokens()
    if shape is None:
        shape = usage_shape(usage)
    _check_report(usage)
    if all(_usage_value(usage, n) is None
           for n in (*_ANTHROPIC_FIELDS, *_OPENAI_FIELDS, *_ANTHROPIC_ONLY, *_OPENAI_ONLY)):
        return CallTokens()
    return usage_tokens(usage, shape, ttl=ttl)


def usage_tokens(usage: Any, shape: UsageShape, *, ttl: CacheTTL = "5m") -> CallTokens:
    """The billed split of a provider's usage report (a mapping or the SDK's usage object).

    ``shape="anthropic"``: ``input_tokens`` are uncached, ``cache_read_input_tokens`` read,
    ``cache_creation_input_tokens`` written — split by ``cache_creation.ephemeral_5m_input_tokens``
    and ``ephemeral_1h_input_tokens`` when present, any rest at lifetime ``ttl``.
    ``shape="openai"``: ``prompt_tokens`` (or ``input_tokens``) minus
    ``prompt_tokens_details.cached_tokens`` (or ``input_tokens_details.cached_tokens``) are
    uncached, the cached ones read; ``completion_tokens`` (or ``output_tokens``) are output.
    A report in the other shape, one naming none of the shape's fields, or a count that is not a
    whole number >= 0 raises InvalidInputError (InvalidUsageError, naming the field, for a
    count).
    """
    if shape == "anthropic":
        return _anthropic_tokens(usage, check_ttl(ttl))
    if shape == "openai":
        return _openai_tokens(usage)
    raise InvalidInputError(f"a usage shape is 'anthropic' or 'openai', got {shape!r}")


def _check_report(usage: Any) -> None:
    # Text, numbers and sequences have no count attributes: they are no report, whatever
    # getattr would say of them.
    if usage is None or isinstance(usage, str | bytes | bytearray | int | float | list | tuple
                                   | set | frozenset):
        raise InvalidUsageError(f"a usage report is a mapping or an SDK usage object, got "
                                f"{type(usage).__name__}", field="usage")


def _require_fields(usage: Any, names: Sequence[str], shape: str) -> None:
    _check_report(usage)
    if all(_usage_value(usage, n) is None for n in names):
        raise InvalidUsageError(f"this usage names none of {', '.join(names)}: it is not an "
                                f"{shape} usage report", field="usage")


def _anthropic_tokens(usage: Any, ttl: CacheTTL) -> CallTokens:
    if _usage_value(usage, "input_tokens") is None and (
            _usage_value(usage, "prompt_tokens") is not None):
        raise InvalidInputError(
            "this usage is in OpenAI's shape (prompt_tokens, which include the cached tokens) "
            "but the prices say usage_shape='anthropic'")
    if _usage_value(usage, "input_tokens_details") is not None:
        raise InvalidInputError(
            "this usage is an OpenAI Responses report (its input_tokens include "
            "input_tokens_details.cached_tokens) but the prices say usage_shape='anthropic'")
    _require_fields(usage, (*_ANTHROPIC_FIELDS, "cache_creation"), "Anthropic")
    created = _usage_count(usage, "cache_creation_input_tokens")
    w5, w1h = _ttl_breakdown(usage, created)
    # Without the total, the breakdown is all that was written.
    rest = created - w5 - w1h if created is not None else 0
    return CallTokens(
        uncached=_usage_count(usage, "input_tokens") or 0,
        cache_read=_usage_count(usage, "cache_read_input_tokens") or 0,
        cache_write_5m=w5 + (rest if ttl == "5m" else 0),
        cache_write_1h=w1h + (rest if ttl == "1h" else 0),
        output=_usage_count(usage, "output_tokens") or 0,
    )


def _ttl_breakdown(usage: Any, created: int | None) -> tuple[int, int]:
    """The writes by lifetime that ``usage.cache_creation`` names: (5-minute, 1-hour)."""
    breakdown = _usage_part(usage, "cache_creation")
    if breakdown is None:
        return 0, 0
    where = "usage.cache_creation"
    w5 = _usage_count(breakdown, "ephemeral_5m_input_tokens", where) or 0
    w1h = _usage_count(breakdown, "ephemeral_1h_input_tokens", where) or 0
    if created is not None and w5 + w1h > created:
        raise InvalidUsageError(
            f"{where} names {w5 + w1h:,} written tokens by lifetime, more than "
            f"cache_creation_input_tokens ({created:,})", field=where)
    return w5, w1h


def _usage_part(usage: Any, name: str) -> Any:
    """A breakdown inside a report (``cache_creation``, ``prompt_tokens_details``), or None;
    InvalidUsageError when it is there but no mapping or object of counts."""
    part = _usage_value(usage, name)
    if part is not None and isinstance(part, str | bytes | bytearray | int | float | list
                                       | tuple | set | frozenset):
        raise InvalidUsageError(f"usage.{name} is a breakdown of counts (an object), got "
                                f"{type(part).__name__}", field=f"usage.{name}")
    return part


def _openai_tokens(usage: Any) -> CallTokens:
    for name in ("cache_read_input_tokens", "cache_creation_input_tokens"):
        if _usage_value(usage, name) is not None:
            raise InvalidInputError(
                f"this usage is in Anthropic's shape ({name}; its input_tokens exclude cache "
                "reads and writes) but the prices say usage_shape='openai'")
    _require_fields(usage, _OPENAI_FIELDS, "OpenAI")
    prompt_name = "prompt_tokens" if _usage_value(usage, "prompt_tokens") is not None \
        else "input_tokens"
    prompt = _usage_count(usage, prompt_name) or 0
    details_name = f"{prompt_name}_details"
    details = _usage_part(usage, details_name)
    cached = 0 if details is None else (
        _usage_count(details, "cached_tokens", f"usage.{details_name}") or 0)
    if cached > prompt:
        raise InvalidUsageError(f"usage.{details_name}.cached_tokens ({cached:,}) exceeds "
                                f"{prompt_name} ({prompt:,}), which include them",
                                field=f"usage.{details_name}.cached_tokens")
    output = _usage_count(usage, "completion_tokens")
    if output is None:
        output = _usage_count(usage, "output_tokens") or 0
    return CallTokens(uncached=prompt - cached, cache_read=cached, output=output)
