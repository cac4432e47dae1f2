"""What models charge, and what one call costs at those prices.

Prices are data, never constants in the formulas: :data:`DEFAULT_PRICES` holds published list
prices and :func:`price_table` applies the settings' overrides. One call costs
``uncached·p + read·r·p + write·w·p + output·p_out`` (:meth:`ModelPrices.cost`;
:func:`call_cost` from a provider's usage, :func:`request_cost` from predicted counts). A call
through a provider's batch API (Anthropic's Message Batches, OpenAI's Batch API) costs
``batch_multiplier`` of that, every part alike: :meth:`ModelPrices.batched` gives the prices
it is billed at. Prices are settings: invalid ones raise InvalidPolicyError naming the field.
:func:`summarizer_prices` finds a summarizer model's entry, or its family's. ``docs/cost-model.md``
walks through the numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .errors import InvalidPolicyError
from .pydantic_errors import explain
from .usage import CacheTTL, CallTokens, UsageShape, check_ttl, usage_tokens

__all__ = [
    "DEFAULT_PRICES",
    "SUMMARIZER_FAMILIES",
    "CallCost",
    "ModelPrices",
    "SettingsValue",
    "call_cost",
    "price_table",
    "prices_for",
    "request_cost",
    "summarizer_dollars",
    "summarizer_prices",
]

_PER_MTOK = 1_000_000


class SettingsValue(BaseModel):
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


_BOOL = TypeAdapter(bool)


class ModelPrices(SettingsValue):
    """One model's published prices, in US dollars per million tokens, and its cache's terms.

    The cache defaults are Anthropic's terms (read 0.1×, write 1.25× for 5 minutes and 2× for an
    hour, usage in Anthropic's shape). A provider without a write premium sets
    ``write_premium=False``, and its write multipliers default to 1 (a write costs plain
    input; giving them another value is refused as a contradiction). ``batch_multiplier`` is
    what a call through the provider's batch API pays of the list price, every part alike
    (0.5 for both providers' batch APIs); it defaults to 1, no discount, for a model whose
    entry does not say it has one::

        ModelPrices(input_per_mtok=3, output_per_mtok=15, batch_multiplier=0.5)  # Sonnet 4.5
        ModelPrices(input_per_mtok=2.5, output_per_mtok=10, cache_read_multiplier=0.5,
                    write_premium=False, usage_shape="openai")                   # gpt-4o
    """

    input_per_mtok: float
    output_per_mtok: float
    cache_read_multiplier: float = 0.1
    cache_write_5m_multiplier: float = 1.25
    cache_write_1h_multiplier: float = 2.0
    write_premium: bool = True
    usage_shape: UsageShape = "anthropic"
    batch_multiplier: float = 1.0

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
        if not 0 < self.batch_multiplier <= 1:
            raise ValueError("batch_multiplier is what a batch call pays of the list price: it "
                             f"must be in (0, 1], got {self.batch_multiplier}")
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

    def batched(self) -> ModelPrices:
        """The prices a call through the provider's batch API is billed at: input and output
        times ``batch_multiplier``, the cache's multipliers unchanged (so a cache read or write
        in a batch is discounted alike), and no further discount.

        Example (Haiku 4.5 at $1/$5 in a batch)::

            DEFAULT_PRICES["claude-haiku-4-5"].batched().output_per_mtok   # 2.5
        """
        if self.batch_multiplier == 1:
            return self
        return self.model_copy(update={
            "input_per_mtok": self.input_per_mtok * self.batch_multiplier,
            "output_per_mtok": self.output_per_mtok * self.batch_multiplier,
            "batch_multiplier": 1.0})

    def write_multiplier(self, ttl: CacheTTL) -> float:
        """What a cache write of lifetime ``ttl`` costs, as a multiple of the input price."""
        return (self.cache_write_1h_multiplier if check_ttl(ttl) == "1h"
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


# Both batch APIs bill half the list price (Anthropic's Message Batches: every part of a call,
# its cache reads and writes included; OpenAI's Batch API: input and output).
_ANTHROPIC = {"cache_read_multiplier": 0.1, "cache_write_5m_multiplier": 1.25,
              "cache_write_1h_multiplier": 2.0, "write_premium": True,
              "usage_shape": "anthropic", "batch_multiplier": 0.5}
_OPENAI = {"write_premium": False, "usage_shape": "openai", "batch_multiplier": 0.5}

#: Published list prices (USD per million tokens) the settings start from; override them with
#: :func:`price_table`. Keys are model ids without a date suffix (see :func:`prices_for`).
#:
#: Sources, as stored copies of the providers' pages read on 2026-12 (this machine has no web
#: access): Anthropic, platform.claude.com/docs/en/about-claude/pricing and each model's
#: overview page, and the batch-processing page (50 %); OpenAI, developers.openai.com/api/docs/
#: pricing and each model's page (the "Batch API price" tab: half). Check them before billing.
DEFAULT_PRICES: Mapping[str, ModelPrices] = MappingProxyType({
    # Anthropic. Sonnet 4.5 $3/$15; Opus 4.1 $15/$75 (the pricing page: retired on the Claude
    # API, still served on Bedrock and Google Cloud; batch $7.50 / $37.50).
    "claude-sonnet-4-5": ModelPrices(input_per_mtok=3.0, output_per_mtok=15.0, **_ANTHROPIC),
    "claude-opus-4-1": ModelPrices(input_per_mtok=15.0, output_per_mtok=75.0, **_ANTHROPIC),
    # Haiku 4.5 (claude-haiku-4-5-20251001): $1 in, $5 out, writes $1.25 / $2, reads $0.10;
    # batch $0.50 / $2.50. Model overview page, 2026-12.
    "claude-haiku-4-5": ModelPrices(input_per_mtok=1.0, output_per_mtok=5.0, **_ANTHROPIC),
    # Haiku 3.5 (claude-3-5-haiku-20241022): $0.80 in, $4 out, writes $1, reads $0.08; batch
    # $0.40 / $2 (docs.anthropic.com batch-processing page, a 2025 copy; no 2026 copy lists it).
    # Retired on the Claude API on 2026-02-19 (Google Cloud: 2026-07-05): kept for Bedrock and
    # for settings that still name it.
    "claude-3-5-haiku": ModelPrices(input_per_mtok=0.8, output_per_mtok=4.0, **_ANTHROPIC),
    # The summarizer's default model (Settings.summarizer_model). Haiku 5.5 (2026-10-07) is
    # published at $0.10 in / $0.50 out for prompts up to 100K tokens and $0.50 / $2.50 (every
    # token of the call) above; reads and writes at 0.1× / 1.25× / 2× of either. This table has
    # no prompt-length tier, and B1 bills and plans its summaries at Haiku 4.5's prices, so the
    # entry stays at Haiku 4.5's $1/$5 until both move: it over-counts, never under-counts.
    "claude-haiku-5-5": ModelPrices(input_per_mtok=1.0, output_per_mtok=5.0, **_ANTHROPIC),
    # OpenAI: cached input is a discount on input with no write premium, read at 0.5× (gpt-4o
    # family), 0.25× (gpt-4.1 family) or 0.1× (gpt-5 family). Not sure: whether the Batch API
    # halves cached input too on the older families (the gpt-5 pages say so for theirs).
    # gpt-4o $2.50 / cached $1.25 / $10; gpt-4o-mini $0.15 / $0.075 / $0.60.
    "gpt-4o": ModelPrices(input_per_mtok=2.5, output_per_mtok=10.0,
                          cache_read_multiplier=0.5, **_OPENAI),
    "gpt-4o-mini": ModelPrices(input_per_mtok=0.15, output_per_mtok=0.6,
                               cache_read_multiplier=0.5, **_OPENAI),
    # gpt-4.1 $2 / $0.50 / $8; gpt-4.1-mini $0.40 / $0.10 / $1.60 (batch $0.20 / $0.80);
    # gpt-4.1-nano $0.10 / $0.025 / $0.40 (batch $0.05 / $0.20). OpenAI's own pricing page no
    # longer lists the 4.x models (2026); these are their last published figures.
    "gpt-4.1": ModelPrices(input_per_mtok=2.0, output_per_mtok=8.0,
                           cache_read_multiplier=0.25, **_OPENAI),
    "gpt-4.1-mini": ModelPrices(input_per_mtok=0.4, output_per_mtok=1.6,
                                cache_read_multiplier=0.25, **_OPENAI),
    "gpt-4.1-nano": ModelPrices(input_per_mtok=0.1, output_per_mtok=0.4,
                                cache_read_multiplier=0.25, **_OPENAI),
    # gpt-5 $1.25 / $0.125 / $10; gpt-5-mini $0.25 / $0.025 / $2 and gpt-5-nano $0.05 / $0.005
    # / $0.40 (their model pages, 2026-12, which mark both deprecated). Reasoning tokens are
    # billed as output.
    "gpt-5": ModelPrices(input_per_mtok=1.25, output_per_mtok=10.0,
                         cache_read_multiplier=0.1, **_OPENAI),
    "gpt-5-mini": ModelPrices(input_per_mtok=0.25, output_per_mtok=2.0,
                              cache_read_multiplier=0.1, **_OPENAI),
    "gpt-5-nano": ModelPrices(input_per_mtok=0.05, output_per_mtok=0.4,
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


#: Summarizer model families: a part of a model id that names one, and the entry that prices a
#: model of it the table does not list (a gateway's ``openai/gpt-4.1-mini``, Bedrock's
#: ``anthropic.claude-haiku-4-5-…-v1:0``, a new snapshot name). Most specific first. Only
#: families whose unlisted members cost no more than the entry are here: ``gpt-5`` is not one
#: (``gpt-5-pro`` costs twelve times as much), nor ``gpt-4o`` (its realtime models cost double).
SUMMARIZER_FAMILIES: tuple[tuple[str, str], ...] = (
    ("3-5-haiku", "claude-3-5-haiku"),
    ("haiku", "claude-haiku-4-5"),
    ("sonnet", "claude-sonnet-4-5"),
    ("opus", "claude-opus-4-1"),
    ("gpt-4o-mini", "gpt-4o-mini"),
    ("gpt-4.1-mini", "gpt-4.1-mini"),
    ("gpt-4.1-nano", "gpt-4.1-nano"),
    ("gpt-5-mini", "gpt-5-mini"),
    ("gpt-5-nano", "gpt-5-nano"),
)


def summarizer_prices(model: str,
                      table: Mapping[str, ModelPrices] = DEFAULT_PRICES) -> ModelPrices:
    """The prices of a summarizer ``model``: its own entry (:func:`prices_for`), else its
    family's (:data:`SUMMARIZER_FAMILIES`), as ``table`` has it.

    Any other model raises InvalidPolicyError saying to add it to ``SESSIONFOLD_PRICES``: the
    settings refuse it at start rather than let the spend cap count it at a guess.
    """
    try:
        return prices_for(model, table)
    except InvalidPolicyError:
        pass
    name = model.lower()
    for family, entry in SUMMARIZER_FAMILIES:
        if family in name and entry in table:
            return table[entry]
    raise InvalidPolicyError(
        f"no prices for summarizer model {model!r}: neither its id nor a family it names "
        f"({', '.join(f for f, _ in SUMMARIZER_FAMILIES)}) is in the price table. Add it to "
        'SESSIONFOLD_PRICES, e.g. {"' + model + '": {"input_per_mtok": 0.4, '
        '"output_per_mtok": 1.6, "usage_shape": "openai", "write_premium": false}} '
        "(all 0 for a model you serve yourself)")


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
