"""The cost model: what a call, a cached prefix and a fold cost in dollars, and when a fold pays.

Pure arithmetic (no I/O, no clock): the planner prices its visits with it
(:mod:`.economics`, policy ``economics="dollars"``), and the settings' price table is built
with :func:`price_table`. Prices are data
(:class:`ModelPrices`, a default table that settings override), never constants in the formulas.

Notation used throughout (all token counts are the provider's)::

    p      the agent model's input price per token (input_per_mtok / 1e6)
    r      cache-read multiplier (Anthropic 0.1; OpenAI 0.5 gpt-4o, 0.25 gpt-4.1, 0.1 gpt-5)
    w      cache-write multiplier of the TTL (Anthropic 1.25 for 5 minutes, 2 for 1 hour;
           1 where the provider charges no write premium: OpenAI)
    W      tokens a fold keeps in the window (the summary included)
    S      tokens a fold removes (the window shrinks from W + S to W)
    H      the stable head: system prompt, tools and any window items before the first one a fold
           can change, still read from the cache after a fold (0 unless the caller knows it)
    g      tokens the window grows by per call (the answer and the next user/tool message)
    σ      the summarizer's price for one fold: its input (≈ the folded tokens) and output
           (≈ the summary) at its own model's prices

**One call.** ``uncached·p + read·r·p + write·w·p + output·p_out``
(:meth:`ModelPrices.cost`, :func:`call_cost` from a provider's usage in either shape,
:func:`request_cost` from predicted counts). Anthropic's ``input_tokens`` exclude cache reads and
writes; OpenAI's ``prompt_tokens`` include ``prompt_tokens_details.cached_tokens``.

**The prefix cache.** A request reads from the cache the prefix it shares with the previous one
and writes the rest, unless the prefix was unused for longer than the TTL: then it is cold and the
whole request is written again (:func:`simulate_prefix_cache`, :func:`cache_is_cold`).

**One fold** (:func:`fold_cost`). With a warm cache, the next call writes the kept window instead
of reading it and reads nothing of the removed tokens::

    break premium       (w − r)·(W − H)·p      the cache break on what the fold keeps
    first-call saving   r·S·p                  the removed tokens are not read on the next call
    per-call saving     r·S·p                  ... nor on any later one
    net cost            break premium + σ − first-call saving
    payback             net cost / per-call saving   calls after the first

With the issue's numbers (Anthropic 5-minute cache, W = 38k, S = 16k, H = 0, σ = 0) the payback
is ``(w − r)/r · W/S − 1 = 11.5·38/16 − 1 = 26.3`` calls. With a **cold** cache (idle longer than
the TTL) the next call writes its whole prefix anyway: the break premium is 0 and the first call
saves a write of S (``w·S·p``), so a fold made during an idle gap costs only its summarizer. With
**no write premium** (OpenAI, w = 1) the break premium is the lost read discount
``(1 − r)·(W − H)·p``.

**A policy** (:func:`cycle_rate`, :func:`best_cycle`). Folding from trigger T down to W, with
growth g, gives cycles of ``n = (T − W)/g`` calls: the first writes the kept window (reading H),
each later one reads the previous request and writes g, and the cycle ends with a fold removing
``n·g`` tokens (calls within a cycle are assumed closer together than the TTL). Its cost per
call, the rate a planner minimises, is::

    ρ(n) = a/n + b + c·n
    a = (w − r)·(W − H)·p + (σ_in + σ_out)·s        fixed price of one fold (s: summary tokens)
    b = (r·W + w·g − r·g/2)·p + σ_in·f·g            per call (f: share of S the summarizer reads)
    c = r·g·p / 2                                   the growing window, read once per call

(the output the agent writes is the same whatever the window, so it is left out). The best cycle
length is ``n* = √(a/c)`` (the economic-order-quantity rule: fold when the window's extra reads
have paid for one fold), clamped to ``[1, (ceiling − W)/g]``. Deep and rare beats shallow and
frequent: ``a`` and ``b`` grow with W, so at equal summary terms a lower target never has a
higher best rate, and the trigger follows from ``n*``, not from the budget alone. Against that
optimum, folding after n calls instead of n* costs ``E(n) = a + b·n + c·n² − ρ*·n``
(= ``c·(n − n*)²`` when n* is not clamped; :meth:`CycleRate.extra_cost`).

**The choice** (:func:`choose_fold`): among candidate targets, the one with the lowest ``ρ*``;
then fold now if that saves money against folding at the optimal trigger (at least one call
later) — ``E(n_wait) − E(n_now)``, plus, when the cache is cold, ``(w − r)·(X − H)·p`` for the
prefix the next call would rewrite anyway — and refuse as ``would-not-pay`` otherwise.
``docs/cost-model.md`` walks through the numbers.

Not modelled: the providers' minimum cacheable prefix (1024+ tokens) and Anthropic's 20-block
lookback, long-context price tiers, batch discounts, and the summarizer's own prompt cache.
Prices are refused with :class:`InvalidPolicyError` (they are settings); token counts, usages
and the session figures with :class:`InvalidInputError`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Literal, Self, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .errors import (
    InvalidInputError,
    InvalidPolicyError,
    InvalidUsageError,
    UsageUnmeasurableError,
)
from .pydantic_errors import explain

__all__ = [
    "CACHE_TTLS",
    "DEFAULT_PRICES",
    "MAX_REPORTED_TOKENS",
    "TTL_SECONDS",
    "CacheTTL",
    "CallCost",
    "CallTokens",
    "ChoiceReason",
    "CycleRate",
    "FoldChoice",
    "FoldCost",
    "FoldOption",
    "FoldPricing",
    "ModelPrices",
    "PrefixCache",
    "UsageShape",
    "best_cycle",
    "cache_is_cold",
    "call_cost",
    "calls_between_folds",
    "choose_fold",
    "cycle_rate",
    "fold_cost",
    "price_table",
    "prices_for",
    "read_usage",
    "request_cost",
    "simulate_prefix_cache",
    "summarizer_dollars",
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

_PER_MTOK = 1_000_000


# --- settings: validation shared by the price and option models -------------------------------

class _Setting(BaseModel):
    """A frozen settings value whose invalid fields raise InvalidPolicyError, naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidPolicyError(explain(type(self).__name__, exc)) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        """Like pydantic's, but invalid values raise InvalidPolicyError (as the constructor)."""
        if not isinstance(obj, Mapping | cls):
            raise InvalidPolicyError(
                f"{cls.__name__} is read from a mapping of its fields, got {type(obj).__name__}")
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            # pydantic runs the custom __init__ and wraps what it raised: unwrap ours.
            for err in exc.errors(include_url=False):
                inner = (err.get("ctx") or {}).get("error")
                if isinstance(inner, InvalidPolicyError):
                    raise inner from None
            raise InvalidPolicyError(explain(cls.__name__, exc)) from None

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads True as 1: a price or a token count of "true" is a mistake.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in (int, float):
            raise ValueError(f"must be a number, got {value!r}")
        return value


# --- prices -------------------------------------------------------------------------------------

_BOOL = TypeAdapter(bool)


class ModelPrices(_Setting):
    """One model's published prices, in US dollars per million tokens, and its cache's terms.

    The defaults are Anthropic's terms (read 0.1×, write 1.25× for 5 minutes and 2× for an hour,
    usage in Anthropic's shape). A provider without a write premium sets
    ``write_premium=False``, and its write multipliers default to 1 (a write costs plain
    input; giving them another value is refused as a contradiction)::

        ModelPrices(input_per_mtok=3, output_per_mtok=15)                      # Sonnet 4.5
        ModelPrices(input_per_mtok=2.5, output_per_mtok=10, cache_read_multiplier=0.5,
                    write_premium=False, usage_shape="openai")                 # gpt-4o
    """

    input_per_mtok: float
    output_per_mtok: float
    cache_read_multiplier: float = 0.1
    cache_write_5m_multiplier: float = 1.25
    cache_write_1h_multiplier: float = 2.0
    write_premium: bool = True
    usage_shape: UsageShape = "anthropic"

    @model_validator(mode="before")
    @classmethod
    def _writes_at_plain_price_without_a_premium(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or "write_premium" not in data:
            return data
        try:
            premium = _BOOL.validate_python(data["write_premium"])
        except ValidationError:
            return data  # the field's own validation names the bad value
        if premium:
            return data
        return {"cache_write_5m_multiplier": 1.0, "cache_write_1h_multiplier": 1.0, **data}

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in ("input_per_mtok", "output_per_mtok"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 dollars, got {getattr(self, name)}")
        if not 0 <= self.cache_read_multiplier <= 1:
            raise ValueError("cache_read_multiplier is a discount on input: it must be in "
                             f"[0, 1], got {self.cache_read_multiplier}")
        if self.cache_write_5m_multiplier < 1:
            raise ValueError("cache_write_5m_multiplier must be >= 1 (a write costs at least "
                             f"plain input), got {self.cache_write_5m_multiplier}")
        if not self.write_premium and (self.cache_write_5m_multiplier != 1
                                       or self.cache_write_1h_multiplier != 1):
            raise ValueError(
                "write_premium=False means a cache write costs plain input: the write "
                "multipliers must be 1 (or left out), got "
                f"{self.cache_write_5m_multiplier} and {self.cache_write_1h_multiplier}")
        if self.cache_write_1h_multiplier < self.cache_write_5m_multiplier:
            raise ValueError(
                "cache_write_1h_multiplier must be >= cache_write_5m_multiplier (a longer "
                f"lifetime never costs less), got {self.cache_write_1h_multiplier} < "
                f"{self.cache_write_5m_multiplier}")
        return self

    @property
    def input_per_token(self) -> float:
        return self.input_per_mtok / _PER_MTOK

    @property
    def output_per_token(self) -> float:
        return self.output_per_mtok / _PER_MTOK

    def write_multiplier(self, ttl: CacheTTL) -> float:
        """What a cache write of lifetime ``ttl`` costs, as a multiple of the input price."""
        return (self.cache_write_1h_multiplier if _ttl(ttl) == "1h"
                else self.cache_write_5m_multiplier)

    def cost(self, tokens: CallTokens) -> CallCost:
        """The dollars of one call whose tokens are ``tokens``."""
        p = self.input_per_token
        writes = (tokens.cache_write_5m * self.cache_write_5m_multiplier
                  + tokens.cache_write_1h * self.cache_write_1h_multiplier)
        return CallCost(
            tokens=tokens,
            uncached=tokens.uncached * p,
            cache_read=tokens.cache_read * self.cache_read_multiplier * p,
            cache_write=writes * p,
            output=tokens.output * self.output_per_token,
        )


_ANTHROPIC = {"cache_read_multiplier": 0.1, "cache_write_5m_multiplier": 1.25,
              "cache_write_1h_multiplier": 2.0, "write_premium": True,
              "usage_shape": "anthropic"}
_OPENAI = {"write_premium": False, "usage_shape": "openai"}

#: Published list prices (USD per million tokens) the settings start from; override them with
#: :func:`price_table`. Keys are model ids without a date suffix (see :func:`prices_for`).
DEFAULT_PRICES: Mapping[str, ModelPrices] = MappingProxyType({
    "claude-sonnet-4-5": ModelPrices(input_per_mtok=3.0, output_per_mtok=15.0, **_ANTHROPIC),
    "claude-haiku-4-5": ModelPrices(input_per_mtok=1.0, output_per_mtok=5.0, **_ANTHROPIC),
    # The summarizer's default model (Settings.summarizer_model), at Haiku's prices.
    "claude-haiku-5-5": ModelPrices(input_per_mtok=1.0, output_per_mtok=5.0, **_ANTHROPIC),
    "claude-opus-4-1": ModelPrices(input_per_mtok=15.0, output_per_mtok=75.0, **_ANTHROPIC),
    "gpt-4o": ModelPrices(input_per_mtok=2.5, output_per_mtok=10.0,
                          cache_read_multiplier=0.5, **_OPENAI),
    "gpt-4o-mini": ModelPrices(input_per_mtok=0.15, output_per_mtok=0.6,
                               cache_read_multiplier=0.5, **_OPENAI),
    "gpt-4.1": ModelPrices(input_per_mtok=2.0, output_per_mtok=8.0,
                           cache_read_multiplier=0.25, **_OPENAI),
    "gpt-5": ModelPrices(input_per_mtok=1.25, output_per_mtok=10.0,
                         cache_read_multiplier=0.1, **_OPENAI),
})

_WRITE_FIELDS = ("cache_write_5m_multiplier", "cache_write_1h_multiplier")


def price_table(overrides: Mapping[str, ModelPrices | Mapping[str, Any]] | None = None, *,
                base: Mapping[str, ModelPrices] = DEFAULT_PRICES) -> Mapping[str, ModelPrices]:
    """``base`` with ``overrides`` applied: what settings turn into the table the code prices with.

    An override is a whole :class:`ModelPrices` or a mapping of some of its fields: for a model
    already in ``base`` the mapping changes only the fields it names (turning ``write_premium``
    off resets the write multipliers to 1 unless the mapping names them); for a new model it must
    name at least ``input_per_mtok`` and ``output_per_mtok``::

        price_table({"claude-haiku-4-5": {"input_per_mtok": 0.8},
                     "claude-haiku-5-5": {"input_per_mtok": 1, "output_per_mtok": 5}})
    """
    table = dict(base)
    if overrides is None:
        return MappingProxyType(table)
    if not isinstance(overrides, Mapping):
        raise InvalidPolicyError(
            f"price overrides are a mapping of model id to prices, got {type(overrides).__name__}")
    for model, entry in overrides.items():
        if not isinstance(model, str) or not model.strip():
            raise InvalidPolicyError(f"a price override needs a model id, got {model!r}")
        table[model] = _override(model, table.get(model), entry)
    return MappingProxyType(table)


def _override(model: str, current: ModelPrices | None,
              entry: ModelPrices | Mapping[str, Any]) -> ModelPrices:
    if isinstance(entry, ModelPrices):
        return entry
    if not isinstance(entry, Mapping):
        raise InvalidPolicyError(f"prices of {model!r} must be ModelPrices or a mapping of its "
                                 f"fields, got {type(entry).__name__}")
    start = current.model_dump() if current is not None else {}
    if "write_premium" in entry:
        # Turning the premium off must not inherit 1.25/2 from the entry it overrides.
        start = {k: v for k, v in start.items() if k not in _WRITE_FIELDS}
    try:
        return ModelPrices.model_validate({**start, **entry})
    except InvalidPolicyError as exc:
        raise InvalidPolicyError(f"prices of {model!r}: {exc}") from None


# A dated snapshot id is priced as its alias: "-20250929" (Anthropic), "-2024-08-06" (OpenAI).
_DATE_SUFFIX = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")


def prices_for(model: str, table: Mapping[str, ModelPrices] = DEFAULT_PRICES) -> ModelPrices:
    """The prices of ``model`` in ``table``: its exact id, else the id without a date suffix.

    No other prefix matching: ``gpt-5-pro`` is not ``gpt-5`` (it costs twelve times as much).
    An unknown model raises InvalidPolicyError naming the known ones.
    """
    if not isinstance(model, str):
        raise InvalidPolicyError(f"a model id is a string, got {type(model).__name__}")
    found = table.get(model) or table.get(_DATE_SUFFIX.sub("", model))
    if found is None:
        raise InvalidPolicyError(
            f"no prices for model {model!r}; known: {', '.join(sorted(table)) or 'none'}. "
            "Add its prices to the settings (input_per_mtok, output_per_mtok, and its cache "
            "terms if they are not Anthropic's)")
    return found


# --- one call -------------------------------------------------------------------------------------

def _ttl(ttl: Any) -> CacheTTL:
    if ttl == "5m":
        return "5m"
    if ttl == "1h":
        return "1h"
    raise InvalidInputError(f"a cache TTL is one of {', '.join(CACHE_TTLS)}, got {ttl!r}")


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a whole number of tokens >= 0, got {value!r}")
    return value


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


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
            _count(f.name, getattr(self, f.name))

    @classmethod
    def predicted(cls, *, read: int = 0, written: int = 0, uncached: int = 0, output: int = 0,
                  ttl: CacheTTL = "5m") -> CallTokens:
        """A predicted call: ``read`` from a warm cache, ``written`` to it with lifetime ``ttl``."""
        one_hour = _ttl(ttl) == "1h"
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


@dataclass(frozen=True, slots=True)
class CallCost:
    """The dollars of one call, by what they paid for."""

    tokens: CallTokens
    uncached: float
    cache_read: float
    cache_write: float
    output: float

    @property
    def total(self) -> float:
        return self.uncached + self.cache_read + self.cache_write + self.output


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
        return _anthropic_tokens(usage, _ttl(ttl))
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


def call_cost(prices: ModelPrices, usage: Any, *, ttl: CacheTTL = "5m") -> CallCost:
    """The dollars of one call from the provider's usage, read in ``prices.usage_shape``.

    ``ttl`` prices the writes a report does not break down by lifetime. A summarizer's
    :class:`~sessionfold.core.window.SummarizerUsage` is read like an Anthropic report.
    Example (Sonnet 4.5: $3 in, $15 out)::

        call_cost(DEFAULT_PRICES["claude-sonnet-4-5"], {"input_tokens": 1000,
                  "cache_read_input_tokens": 50_000, "cache_creation_input_tokens": 2000,
                  "output_tokens": 500}).total
        # (1000 + 0.1·50_000 + 1.25·2000)·3e-6 + 500·15e-6 = 0.033
    """
    return prices.cost(usage_tokens(usage, prices.usage_shape, ttl=ttl))


def request_cost(prices: ModelPrices, *, read: int = 0, written: int = 0, uncached: int = 0,
                 output: int = 0, ttl: CacheTTL = "5m") -> CallCost:
    """The dollars of a predicted request: ``read`` from a warm cache, ``written`` to it."""
    return prices.cost(CallTokens.predicted(read=read, written=written, uncached=uncached,
                                            output=output, ttl=ttl))


def summarizer_dollars(prices: ModelPrices, *, input_tokens: int, output_tokens: int) -> float:
    """One summarizer call at its own model's prices (its input is not cached)::

        summarizer_dollars(DEFAULT_PRICES["claude-haiku-4-5"], input_tokens=10_000,
                           output_tokens=1000)      # 10_000·1e-6 + 1000·5e-6 = 0.015
    """
    return request_cost(prices, uncached=input_tokens, output=output_tokens).total


# --- the prefix cache ----------------------------------------------------------------------------

def cache_is_cold(seconds_since_use: float | None, ttl: CacheTTL = "5m") -> bool:
    """Whether a prefix last used ``seconds_since_use`` ago has expired (None: never cached).

    A prefix unused for longer than the TTL is cold; at exactly the TTL it is still warm. The
    scheduler passes the time since the session's last call (each call refreshes the lifetime).
    """
    limit = TTL_SECONDS[_ttl(ttl)]
    if seconds_since_use is None:
        return True
    if isinstance(seconds_since_use, bool) or not isinstance(seconds_since_use, int | float) \
            or not math.isfinite(seconds_since_use) or seconds_since_use < 0:
        raise InvalidInputError("seconds_since_use must be a finite number of seconds >= 0 (or "
                                f"None: never cached), got {seconds_since_use!r}")
    return seconds_since_use > limit


@dataclass(frozen=True, slots=True)
class PrefixCache:
    """What a request reads from the prompt cache and what it writes to it."""

    read: int
    written: int
    cold: bool
    ttl: CacheTTL

    def call_tokens(self, *, output: int = 0) -> CallTokens:
        """The request as billed tokens (the writes at this simulation's lifetime)."""
        return CallTokens.predicted(read=self.read, written=self.written, output=output,
                                    ttl=self.ttl)


def simulate_prefix_cache(*, previous_tokens: int, request_tokens: int,
                          common_prefix_tokens: int, seconds_since_use: float | None,
                          ttl: CacheTTL = "5m") -> PrefixCache:
    """The cache's answer to a request, given the previous request of the same session.

    The previous request (``previous_tokens`` long, cached up to its end) was last used
    ``seconds_since_use`` ago (None: there was none). The new request is ``request_tokens`` long
    and shares its first ``common_prefix_tokens`` with it. Warm: the shared prefix is read and the
    rest written. Cold (unused for longer than the TTL, or nothing cached): the whole request is
    written again::

        simulate_prefix_cache(previous_tokens=40_000, request_tokens=41_000,
                              common_prefix_tokens=40_000, seconds_since_use=10)
        # read 40_000, written 1000
        simulate_prefix_cache(previous_tokens=40_000, request_tokens=41_000,
                              common_prefix_tokens=40_000, seconds_since_use=301)
        # read 0, written 41_000
    """
    previous = _count("previous_tokens", previous_tokens)
    request = _count("request_tokens", request_tokens)
    common = _count("common_prefix_tokens", common_prefix_tokens)
    if common > min(previous, request):
        raise InvalidInputError(
            f"common_prefix_tokens ({common:,}) cannot exceed the previous request "
            f"({previous:,}) or the new one ({request:,})")
    ttl = _ttl(ttl)
    cold = previous == 0 or cache_is_cold(seconds_since_use, ttl)
    read = 0 if cold else common
    return PrefixCache(read=read, written=request - read, cold=cold, ttl=ttl)


# --- one fold ------------------------------------------------------------------------------------

class FoldPricing(_Setting):
    """What fold economics are priced with: the agent's model, the summarizer's, the cache TTL.

    Built once from settings, e.g.::

        FoldPricing(agent=prices_for("claude-sonnet-4-5"),
                    summarizer=prices_for("claude-haiku-4-5"))

    ``summarizer`` may be None when no option calls one (masking and dropping are free).
    """

    agent: ModelPrices
    summarizer: ModelPrices | None = None
    ttl: CacheTTL = "5m"

    @property
    def read(self) -> float:
        """r: the agent's cache-read multiplier."""
        return self.agent.cache_read_multiplier

    @property
    def write(self) -> float:
        """w: the agent's cache-write multiplier at this TTL (1 without a write premium)."""
        return self.agent.write_multiplier(self.ttl)


@dataclass(frozen=True, slots=True)
class FoldCost:
    """What one fold costs and saves, in dollars, against not folding (see the module doc).

    ``payback_calls`` counts the calls after the first one until the fold has paid for itself
    (0 if its first call already did, ``inf`` if it never does). The issue's example::

        fold_cost(FoldPricing(agent=prices_for("claude-sonnet-4-5")), kept_tokens=38_000,
                  removed_tokens=16_000).payback_calls        # 11.5·38/16 − 1 = 26.3125
    """

    kept_tokens: int
    removed_tokens: int
    cold: bool
    break_premium: float
    first_call_saving: float
    per_call_saving: float
    summarizer: float

    @property
    def net_cost(self) -> float:
        """What the fold costs up to and including its first call: premium + σ − first saving."""
        return self.break_premium + self.summarizer - self.first_call_saving

    @property
    def payback_calls(self) -> float:
        if self.net_cost <= 0:
            return 0.0
        if self.per_call_saving <= 0:
            return math.inf
        return self.net_cost / self.per_call_saving

    def net_saving(self, calls: int) -> float:
        """Dollars saved over ``calls`` calls after the fold (negative: it cost more).

        0 calls: only the summarizer was paid. From the first call on:
        ``(calls − 1)·per_call_saving − net_cost`` (the cache assumed warm after the first).
        """
        n = _count("calls", calls)
        if n == 0:
            return -self.summarizer
        return (n - 1) * self.per_call_saving - self.net_cost


def fold_cost(pricing: FoldPricing, *, kept_tokens: int, removed_tokens: int,
              stable_prefix_tokens: int = 0, cold: bool = False,
              summarizer_dollars: float = 0.0) -> FoldCost:
    """The economics of a fold that leaves ``kept_tokens`` (W) and removes ``removed_tokens`` (S).

    ``stable_prefix_tokens`` (H <= W) stay cached across the fold (the system prompt, tools and
    the items before the fold). ``cold``: the cache expired before the next call (the session was
    idle longer than the TTL), so the break premium is 0 and the first call saves a write of S.
    ``summarizer_dollars`` is σ (see :func:`summarizer_dollars`: input ≈ the folded tokens,
    output ≈ the summary). Formulas in the module doc.
    """
    kept = _count("kept_tokens", kept_tokens)
    removed = _count("removed_tokens", removed_tokens)
    head = _count("stable_prefix_tokens", stable_prefix_tokens)
    if head > kept:
        raise InvalidInputError(f"stable_prefix_tokens ({head:,}) is part of what the fold "
                                f"keeps: it cannot exceed kept_tokens ({kept:,})")
    sigma = _dollars("summarizer_dollars", summarizer_dollars)
    p, r, w = pricing.agent.input_per_token, pricing.read, pricing.write
    return FoldCost(
        kept_tokens=kept, removed_tokens=removed, cold=bool(cold),
        break_premium=0.0 if cold else (w - r) * (kept - head) * p,
        first_call_saving=(w if cold else r) * removed * p,
        per_call_saving=r * removed * p,
        summarizer=sigma,
    )


def _dollars(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"{name} must be a finite number of dollars >= 0, got {value!r}")
    return float(value)


def calls_between_folds(*, trigger_tokens: float, target_tokens: float,
                        growth_tokens: float) -> float:
    """``(T − W)/g``: the calls a window takes to grow from the target back to the trigger."""
    g = _positive("growth_tokens", growth_tokens)
    if trigger_tokens < target_tokens:
        raise InvalidInputError(f"trigger_tokens ({trigger_tokens:,}) is below target_tokens "
                                f"({target_tokens:,})")
    return (trigger_tokens - target_tokens) / g


# --- a policy: the cost rate of folding from T to W -----------------------------------------------

class FoldOption(_Setting):
    """One way to fold: the window it leaves, and what its summary costs.

    ``summary_tokens`` (s) is the summary the fold writes (part of the target); 0 means no
    summarizer call (masking, thinning, dropping: free). ``summarized_fraction`` (f) is the share
    of the removed tokens the summarizer reads (the rest is masked or dropped); its input is
    ``f·S + s`` (the span, and the previous summary rolled in) and its output ``s``::

        FoldOption(target_tokens=38_000, label="mask-tool-results")
        FoldOption(target_tokens=16_000, summary_tokens=2000, label="summarize")
    """

    target_tokens: int
    summary_tokens: int = 0
    summarized_fraction: float = 1.0
    label: str = ""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.target_tokens < 1:
            raise ValueError(f"target_tokens must be >= 1, got {self.target_tokens}")
        if not 0 <= self.summary_tokens <= self.target_tokens:
            raise ValueError("summary_tokens must be in [0, target_tokens] (the summary is part "
                             f"of the window), got {self.summary_tokens}")
        if not 0 <= self.summarized_fraction <= 1:
            raise ValueError(
                f"summarized_fraction must be in [0, 1], got {self.summarized_fraction}")
        return self

    @property
    def calls_summarizer(self) -> bool:
        return self.summary_tokens > 0


@dataclass(frozen=True, slots=True)
class CycleRate:
    """The cost rate of a policy: fold to ``option.target_tokens`` every ``calls`` calls.

    ``rate = a/calls + b + c·calls`` dollars per call (``fold_fixed`` = a, ``per_call`` = b,
    ``growth_cost`` = c; module doc). ``trigger_tokens = target + calls·growth``. ``feasible`` is
    False when not even one call of growth fits between the target and the ceiling (the figures
    are then those of folding after every call).
    """

    option: FoldOption
    trigger_tokens: float
    growth_tokens: float
    calls: float
    fold_fixed: float
    per_call: float
    growth_cost: float
    feasible: bool = True

    @property
    def rate(self) -> float:
        return self.fold_fixed / self.calls + self.per_call + self.growth_cost * self.calls

    @property
    def cycle_dollars(self) -> float:
        """One whole cycle: its calls' input and its fold."""
        return self.rate * self.calls

    def extra_cost(self, calls: float) -> float:
        """Dollars lost by ending one cycle after ``calls`` calls instead of ``self.calls``.

        ``E(n) = a + b·n + c·n² − rate·n``: the cost of an n-call cycle less what n calls cost at
        this rate. ``E(self.calls) = 0``; at the unclamped optimum ``E(n) = c·(n − n*)²``.
        """
        n = float(calls)
        return self.fold_fixed + self.per_call * n + self.growth_cost * n * n - self.rate * n

    def to_json(self) -> dict[str, Any]:
        return {"target_tokens": self.option.target_tokens, "label": self.option.label,
                "summary_tokens": self.option.summary_tokens,
                "trigger_tokens": self.trigger_tokens, "calls": self.calls,
                "rate": self.rate, "feasible": self.feasible}


def _coefficients(pricing: FoldPricing, option: FoldOption, growth: float,
                  head: int) -> tuple[float, float, float]:
    """(a, b, c) of ``ρ(n) = a/n + b + c·n`` for ``option`` at ``growth`` tokens per call."""
    if head > option.target_tokens:
        raise InvalidInputError(
            f"stable_prefix_tokens ({head:,}) is part of every window: it cannot exceed the "
            f"target ({option.target_tokens:,}{_label(option)})")
    p, r, w = pricing.agent.input_per_token, pricing.read, pricing.write
    target = option.target_tokens
    a = (w - r) * (target - head) * p
    b = (r * target + w * growth - r * growth / 2) * p
    c = r * growth * p / 2
    if option.calls_summarizer:
        if pricing.summarizer is None:
            raise InvalidInputError(f"the option{_label(option)} writes a summary: "
                                    "FoldPricing.summarizer is needed to price it")
        s_in = pricing.summarizer.input_per_token
        a += (s_in + pricing.summarizer.output_per_token) * option.summary_tokens
        b += s_in * option.summarized_fraction * growth
    return a, b, c


def _label(option: FoldOption) -> str:
    return f" {option.label!r}" if option.label else ""


def _option(option: FoldOption | int) -> FoldOption:
    if isinstance(option, FoldOption):
        return option
    if isinstance(option, bool) or not isinstance(option, int):
        raise InvalidInputError(f"a fold option is a FoldOption or a target in tokens, got "
                                f"{option!r}")
    return FoldOption(target_tokens=option)


def cycle_rate(pricing: FoldPricing, option: FoldOption | int, *, trigger_tokens: float,
               growth_tokens: float, stable_prefix_tokens: int = 0) -> CycleRate:
    """The cost rate of folding from ``trigger_tokens`` (T) down to the option's target (W).

    ``n = (T − W)/g`` calls per cycle must be at least 1. Hand-checked example (Sonnet 4.5,
    5 minutes, W = 10k, T = 20k, g = 1k, no summarizer): a cycle costs
    ``(1.25·10k + 0.1·9·10k + 1.25·1k·10 + 0.1·1k·45)·3e-6 = $0.1155``, a rate of $0.01155.
    """
    opt = _option(option)
    g = _positive("growth_tokens", growth_tokens)
    head = _count("stable_prefix_tokens", stable_prefix_tokens)
    n = calls_between_folds(trigger_tokens=trigger_tokens, target_tokens=opt.target_tokens,
                            growth_tokens=g)
    if n < 1 - 1e-9:  # (the tolerance: a trigger of target + growth, rounded, is one call)
        raise InvalidInputError(
            f"trigger_tokens ({trigger_tokens:,}) leaves less than one call of growth ({g:,}) "
            f"above the target ({opt.target_tokens:,})")
    n = max(n, 1.0)
    a, b, c = _coefficients(pricing, opt, g, head)
    return CycleRate(option=opt, trigger_tokens=opt.target_tokens + n * g, growth_tokens=g,
                     calls=n, fold_fixed=a, per_call=b, growth_cost=c)


def best_cycle(pricing: FoldPricing, option: FoldOption | int, *, ceiling_tokens: int,
               growth_tokens: float, stable_prefix_tokens: int = 0) -> CycleRate:
    """The cheapest cycle for ``option``: the trigger that minimises its rate, up to the ceiling.

    ``n* = √(a/c)`` clamped to ``[1, (ceiling − W)/g]`` (``n_max`` when reads are free, c = 0).
    ``ceiling_tokens`` is the largest window a call may send: the policy's trigger when folds run
    in the background (so they land before the budget), else the budget.
    """
    opt = _option(option)
    g = _positive("growth_tokens", growth_tokens)
    ceiling = _count("ceiling_tokens", ceiling_tokens)
    head = _count("stable_prefix_tokens", stable_prefix_tokens)
    a, b, c = _coefficients(pricing, opt, g, head)
    most = (ceiling - opt.target_tokens) / g
    if most < 1:
        n = 1.0
    elif c <= 0:
        n = most
    else:
        n = min(max(math.sqrt(a / c), 1.0), most)
    return CycleRate(option=opt, trigger_tokens=opt.target_tokens + n * g, growth_tokens=g,
                     calls=n, fold_fixed=a, per_call=b, growth_cost=c, feasible=most >= 1)


# --- the choice ---------------------------------------------------------------------------------

#: Why :func:`choose_fold` decided as it did. ``ceiling``: fold, the next call would pass the
#: ceiling. ``pays``: fold, now is cheaper than later. ``would-not-pay``: wait, folding later is
#: cheaper (record it as a refusal). ``at-target``: wait, the window is already at or under the
#: chosen target.
ChoiceReason = Literal["ceiling", "pays", "would-not-pay", "at-target"]


@dataclass(frozen=True, slots=True)
class FoldChoice:
    """The planner's cost answer: which option, fold now or wait, and the figures behind it.

    ``chosen`` is the candidate with the lowest long-run rate (its cost-optimal cycle);
    ``saving_now`` the dollars folding now saves against folding at ``chosen.trigger_tokens``
    (at least one call later), cold-cache bonus included — negative: it would not pay.
    """

    why: ChoiceReason
    window_tokens: int
    cold: bool
    chosen: CycleRate
    saving_now: float
    candidates: tuple[CycleRate, ...]
    #: The calls the session is expected to make from now on (None: not bounded, the long-run
    #: rate decides); when it is shorter than the chosen cycle, the fold is priced over it.
    horizon_calls: float | None = None
    #: ``would-not-pay`` only: the window at which folding is next worth a look (None: at the
    #: chosen cycle's trigger).
    revisit_tokens: float | None = None

    @property
    def fold(self) -> bool:
        return self.why in ("ceiling", "pays")

    @property
    def option(self) -> FoldOption:
        return self.chosen.option

    @property
    def refusal(self) -> Literal["would-not-pay"] | None:
        """The refusal reason to record when the choice is not to fold for money."""
        return "would-not-pay" if self.why == "would-not-pay" else None

    @property
    def short_horizon(self) -> bool:
        """The session is expected to end before the chosen cycle would complete."""
        return self.horizon_calls is not None and self.horizon_calls < self.chosen.calls

    def explain(self) -> str:
        """One sentence with the numbers, for the record and the logs."""
        c, x = self.chosen, self.window_tokens
        target = f"{c.option.target_tokens:,}{_label(c.option)}"
        cycle = (f"best rate {_usd(c.rate)}/call folding at {c.trigger_tokens:,.0f} every "
                 f"{c.calls:.1f} calls; cache {'cold' if self.cold else 'warm'}")
        if self.short_horizon:
            cycle += f"; about {self.horizon_calls:.0f} calls left in the session"
            if self.why == "would-not-pay":
                return (f"would-not-pay: folding the {x:,}-token window to {target} costs "
                        f"{_usd(-self.saving_now)} more than it saves before the session "
                        f"ends ({cycle})")
            if self.why == "pays":
                return (f"pays: folding the {x:,}-token window to {target} saves "
                        f"{_usd(self.saving_now)} before the session ends ({cycle})")
        if self.why == "at-target":
            return f"at-target: the window ({x:,}) is at or under the target {target} ({cycle})"
        if self.why == "ceiling":
            return (f"ceiling: the next call ({x:,} + {c.growth_tokens:,.0f}) would pass the "
                    f"ceiling; fold to {target} ({cycle})")
        if self.why == "pays":
            return (f"pays: folding the {x:,}-token window to {target} now saves "
                    f"{_usd(self.saving_now)} against folding later ({cycle})")
        return (f"would-not-pay: folding the {x:,}-token window to {target} now costs "
                f"{_usd(-self.saving_now)} more than folding at {c.trigger_tokens:,.0f} "
                f"({cycle})")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "why": self.why, "fold": self.fold, "window_tokens": self.window_tokens,
            "cold": self.cold, "saving_now": self.saving_now, "chosen": self.chosen.to_json(),
            "candidates": [c.to_json() for c in self.candidates], "explain": self.explain()}
        if self.horizon_calls is not None:
            data["horizon_calls"] = self.horizon_calls
        if self.revisit_tokens is not None:
            data["revisit_tokens"] = self.revisit_tokens
        return data


def _usd(dollars: float) -> str:
    return f"${dollars:.3g}"


def choose_fold(pricing: FoldPricing, options: Sequence[FoldOption | int], *, window_tokens: int,
                ceiling_tokens: int, growth_tokens: float, cold: bool = False,
                stable_prefix_tokens: int = 0, horizon_calls: float | None = None,
                horizon_growth: float = 1.0) -> FoldChoice:
    """Choose the fold target with the lowest cost, and whether to fold now.

    Each option gets its cost-optimal cycle (:func:`best_cycle`); the lowest rate among those
    that fit under the ceiling wins (ties: the first listed; if none fits, the lowest of all).
    Then, with the window at X and ``n = (X − W)/g`` calls of growth above the target:

    - ``X <= W``: ``at-target``;
    - ``X + g > ceiling``: ``ceiling`` (fold whatever it costs);
    - else fold now iff ``saving_now = E(max(n*, n + 1)) − E(n) + cold bonus > 0`` (``pays``),
      where the cold bonus ``(w − r)·(X − H)·p`` is the prefix the next call rewrites anyway;
      otherwise ``would-not-pay``.

    **A short life.** ``horizon_calls`` (L) is the calls the session is expected to make from
    now on; when L is shorter than the chosen cycle, a fold is priced over the calls left, not
    over a long run of cycles: the options are compared by one fold and L calls after it
    (``a + b·L + c·L²``), and when waiting L calls would not reach the ceiling, the fold is made
    only if it saves more than it costs before the session ends,
    ``saving_now = L·r·(X − W)·p − a − σ_in·f·g·L`` (plus the cold bonus): a session about to end
    is not folded to save reads it will never make. (When the ceiling comes first, a fold is
    coming anyway and the long-run timing rule above decides.) ``horizon_growth`` is how L
    moves per call from here: +1 when L is the session's age (a session that has lived n calls
    is expected to live about n more), −1 when it counts down to a number the agent gave; it
    sets where a refused fold is next worth a look (:attr:`FoldChoice.revisit_tokens`).

    With a warm cache a window at least one call below the optimal trigger never pays; a cold
    one usually does (fold idle sessions before they wake). For a continuous range of targets
    with the same summary terms pass its low end: the rate never falls as the target rises
    (``a``, ``b`` grow with W and the room for cycles shrinks).
    """
    if isinstance(options, str | bytes) or not isinstance(options, Sequence) or not options:
        raise InvalidInputError("choose_fold needs at least one fold option (a FoldOption or a "
                                "target in tokens)")
    window = _count("window_tokens", window_tokens)
    head = _count("stable_prefix_tokens", stable_prefix_tokens)
    ceiling = _count("ceiling_tokens", ceiling_tokens)
    g = _positive("growth_tokens", growth_tokens)
    horizon = None if horizon_calls is None else _positive("horizon_calls", horizon_calls)
    if head > window:
        raise InvalidInputError(f"stable_prefix_tokens ({head:,}) cannot exceed the window "
                                f"({window:,})")
    candidates = tuple(best_cycle(pricing, _option(o), ceiling_tokens=ceiling, growth_tokens=g,
                                  stable_prefix_tokens=head) for o in options)
    fitting = [c for c in candidates if c.feasible]
    chosen = min(fitting or candidates, key=lambda c: c.rate)
    short = horizon is not None and horizon < chosen.calls
    if short:
        assert horizon is not None
        life = horizon
        chosen = min(fitting or candidates, key=lambda c: _served(c, life))
    target = chosen.option.target_tokens
    bonus = ((pricing.write - pricing.read) * (window - head) * pricing.agent.input_per_token
             if cold else 0.0)
    if window <= target:
        return FoldChoice("at-target", window, bool(cold), chosen, 0.0, candidates, horizon)
    if window + g > ceiling:
        return FoldChoice("ceiling", window, bool(cold), chosen, 0.0, candidates, horizon)
    if short and horizon is not None and window + horizon * g <= ceiling:
        saving = _saving_by_end(pricing, chosen, window, horizon) + bonus
        revisit = None
        if saving <= 0:
            revisit = _revisit(pricing, chosen, window, horizon, horizon_growth, ceiling)
        return FoldChoice("pays" if saving > 0 else "would-not-pay", window, bool(cold), chosen,
                          saving, candidates, horizon, revisit)
    now = (window - target) / g
    saving = chosen.extra_cost(max(chosen.calls, now + 1)) - chosen.extra_cost(now) + bonus
    why: ChoiceReason = "pays" if saving > 0 else "would-not-pay"
    return FoldChoice(why, window, bool(cold), chosen, saving, candidates, horizon)


def _served(cycle: CycleRate, calls: float) -> float:
    """One fold to the cycle's target and ``calls`` calls after it: ``a + b·L + c·L²``."""
    return cycle.fold_fixed + cycle.per_call * calls + cycle.growth_cost * calls * calls


def _saving_by_end(pricing: FoldPricing, cycle: CycleRate, window: float,
                   calls: float) -> float:
    """What folding ``window`` to the cycle's target now saves over the ``calls`` left, against
    never folding: the reads of what it removes, less the fold's fixed price and the
    summarizer's per-call share (the ``a`` and the summarizer part of ``b`` of the cycle)."""
    p, r = pricing.agent.input_per_token, pricing.read
    option = cycle.option
    reads = calls * r * (window - option.target_tokens) * p
    summarizer_per_call = 0.0
    if option.calls_summarizer and pricing.summarizer is not None:
        summarizer_per_call = (pricing.summarizer.input_per_token * option.summarized_fraction
                               * cycle.growth_tokens)
    return reads - cycle.fold_fixed - summarizer_per_call * calls


def _revisit(pricing: FoldPricing, cycle: CycleRate, window: float, horizon: float,
             horizon_growth: float, ceiling: int) -> float:
    """The smallest window, growing by the cycle's g a call (and the horizon by
    ``horizon_growth``), at which :func:`_saving_by_end` turns positive or the ceiling is one
    call away; at most that."""
    g = cycle.growth_tokens
    last = max(window + 1.0, ceiling - g)
    k = 1
    while window + k * g < last:
        left = horizon + horizon_growth * k
        if left <= 0:
            break
        if _saving_by_end(pricing, cycle, window + k * g, left) > 0:
            return window + k * g
        k += 1
    return last
