"""The price table's cheap models of both providers, their batch discount, and how a summarizer
model is priced by its own entry or its family's."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sessionfold.core.errors import InvalidPolicyError
from sessionfold.core.prices import (
    DEFAULT_PRICES,
    ModelPrices,
    call_cost,
    price_table,
    summarizer_prices,
)
from sessionfold.core.usage import CallTokens

#: The published figures the table is meant to hold: (input, cached-input multiplier, output).
PUBLISHED = {
    "claude-haiku-4-5": (1.0, 0.1, 5.0),
    "claude-3-5-haiku": (0.8, 0.1, 4.0),
    "gpt-4o-mini": (0.15, 0.5, 0.6),
    "gpt-4.1-mini": (0.4, 0.25, 1.6),
    "gpt-4.1-nano": (0.1, 0.25, 0.4),
    "gpt-5-mini": (0.25, 0.1, 2.0),
    "gpt-5-nano": (0.05, 0.1, 0.4),
}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_the_cheap_models_of_both_providers_have_their_published_prices(model: str) -> None:
    prices = DEFAULT_PRICES[model]
    assert (prices.input_per_mtok, prices.cache_read_multiplier,
            prices.output_per_mtok) == PUBLISHED[model]
    openai = model.startswith("gpt-")
    assert prices.usage_shape == ("openai" if openai else "anthropic")
    assert prices.write_premium is not openai


def test_every_default_entry_is_half_price_in_a_batch() -> None:
    for model, prices in DEFAULT_PRICES.items():
        batch = prices.batched()
        assert prices.batch_multiplier == 0.5, model
        assert batch.input_per_mtok == prices.input_per_mtok / 2
        assert batch.output_per_mtok == prices.output_per_mtok / 2
        assert batch.batch_multiplier == 1.0  # applied once, not again
    assert DEFAULT_PRICES["gpt-4.1-mini"].batched().output_per_mtok == pytest.approx(0.8)


def test_a_batch_call_costs_half_of_every_part_caching_included() -> None:
    haiku = DEFAULT_PRICES["claude-haiku-4-5"]
    usage = {"input_tokens": 1000, "output_tokens": 500, "cache_read_input_tokens": 40_000,
             "cache_creation_input_tokens": 2000}
    live, batch = call_cost(haiku, usage), call_cost(haiku.batched(), usage)
    for part in ("uncached", "cache_read", "cache_write", "output", "total"):
        assert getattr(batch, part) == pytest.approx(getattr(live, part) / 2), part
    # (1000 + 0.1·40_000 + 1.25·2000)·1e-6 + 500·5e-6 = 0.01, halved.
    assert batch.total == pytest.approx(0.005)


def test_a_model_without_a_stated_discount_pays_the_list_price_in_a_batch() -> None:
    mine = ModelPrices(input_per_mtok=2, output_per_mtok=8)
    assert mine.batch_multiplier == 1 and mine.batched() is mine


def test_the_batch_discount_is_a_setting_like_any_price() -> None:
    table = price_table({"gpt-4.1-mini": {"batch_multiplier": 1},
                         "my-model": {"input_per_mtok": 1, "output_per_mtok": 2,
                                      "batch_multiplier": 0.4}})
    assert table["gpt-4.1-mini"].batched().input_per_mtok == 0.4  # no discount now
    assert table["my-model"].batched().output_per_mtok == pytest.approx(0.8)
    assert table["gpt-4.1-mini"].input_per_mtok == 0.4  # the rest unchanged


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, True])
def test_an_impossible_batch_discount_is_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(InvalidPolicyError, match="batch_multiplier"):
        ModelPrices(input_per_mtok=1, output_per_mtok=5, batch_multiplier=bad)


@settings(max_examples=100, deadline=None, database=None)
@given(model=st.sampled_from(sorted(DEFAULT_PRICES)),
       uncached=st.integers(0, 10**6), read=st.integers(0, 10**6),
       written=st.integers(0, 10**6), output=st.integers(0, 10**5))
def test_a_batch_call_never_costs_more_than_the_same_call_live(
        model: str, uncached: int, read: int, written: int, output: int) -> None:
    prices = DEFAULT_PRICES[model]
    tokens = CallTokens(uncached=uncached, cache_read=read, cache_write_5m=written,
                        output=output)
    assert prices.batched().cost(tokens).total <= prices.cost(tokens).total


# --- a summarizer model's prices -----------------------------------------------------------------

@pytest.mark.parametrize(("model", "entry"), [
    ("gpt-4.1-nano", "gpt-4.1-nano"),
    ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
    ("openai/gpt-4o-mini", "gpt-4o-mini"),
    ("azure-gpt-4.1-mini-prod", "gpt-4.1-mini"),
    ("anthropic.claude-haiku-4-5-20251001-v1:0", "claude-haiku-4-5"),
    ("claude-haiku-4-5@20251001", "claude-haiku-4-5"),
    ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
    ("claude-sonnet-4", "claude-sonnet-4-5"),
])
def test_a_summarizer_model_is_priced_by_its_entry_or_its_familys(model: str,
                                                                   entry: str) -> None:
    assert summarizer_prices(model) is DEFAULT_PRICES[entry]


@pytest.mark.parametrize("model", ["gpt-5-pro", "gpt-4o-realtime-preview", "gpt-5.4-mini",
                                   "llama3.1:8b", "qwen2.5-coder"])
def test_any_other_summarizer_model_is_refused_naming_the_setting(model: str) -> None:
    # gpt-5-pro and the realtime gpt-4o cost more than gpt-5 and gpt-4o: no family covers them.
    with pytest.raises(InvalidPolicyError, match=rf"'{model}'.*SESSIONFOLD_PRICES"):
        summarizer_prices(model)


def test_the_family_entry_is_the_tables_own_so_an_override_prices_the_family() -> None:
    table = price_table({"claude-haiku-4-5": {"input_per_mtok": 0.5}})
    assert summarizer_prices("anthropic.claude-haiku-4-5-v1:0", table).input_per_mtok == 0.5
    own = price_table({"llama3.1:8b": {"input_per_mtok": 0, "output_per_mtok": 0}})
    assert summarizer_prices("llama3.1:8b", own).output_per_mtok == 0
