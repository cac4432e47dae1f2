"""What the runtime prices a summarizer's calls and its folds with: the model's own entry or its
family's, whichever provider serves it; never $0 for a paid model, never Haiku for an unknown."""

from __future__ import annotations

import logging

import pytest
from sessionfold.core.prices import DEFAULT_PRICES
from sessionfold.core.window import SummarizerUsage
from sessionfold.runtime import prices as runtime_prices
from sessionfold.runtime.prices import fold_pricing, summarizer_cost_usd
from sessionfold.runtime.settings import Settings

MILLION = 1_000_000


@pytest.fixture(autouse=True)
def no_inherited_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "SESSIONFOLD_SUMMARIZER",
                 "SESSIONFOLD_SUMMARIZER_MODEL", "SESSIONFOLD_PRICES"):
        monkeypatch.delenv(name, raising=False)


def test_an_openai_summarizer_prices_folds_at_its_own_models_prices() -> None:
    pricing = fold_pricing(Settings(summarizer="openai", openai_api_key="k",
                                    summarizer_model="gpt-5-nano"))
    assert pricing.summarizer == DEFAULT_PRICES["gpt-5-nano"]
    assert pricing.summarizer is not None and pricing.summarizer.input_per_mtok == 0.05
    default = fold_pricing(Settings(summarizer="openai", openai_api_key="k"))
    assert default.summarizer == DEFAULT_PRICES["gpt-4.1-mini"]


def test_a_model_of_a_known_family_is_priced_as_the_family() -> None:
    pricing = fold_pricing(Settings(summarizer="openai", openai_api_key="k",
                                    summarizer_model="openrouter/openai/gpt-4o-mini"))
    assert pricing.summarizer == DEFAULT_PRICES["gpt-4o-mini"]


def test_a_model_priced_in_the_settings_prices_its_folds() -> None:
    settings = Settings(summarizer="openai", openai_api_key="k", summarizer_model="qwen3:8b",
                        prices={"qwen3:8b": {"input_per_mtok": 0, "output_per_mtok": 0,
                                             "usage_shape": "openai", "write_premium": False}})
    pricing = fold_pricing(settings)
    assert pricing.summarizer is not None and pricing.summarizer.output_per_mtok == 0


def test_openai_usage_is_counted_at_openai_prices_cached_input_included() -> None:
    # The provider keeps usage in the summarizer's shape: input_tokens are the uncached part.
    usage = SummarizerUsage(model="gpt-4.1-mini", input_tokens=MILLION, output_tokens=MILLION,
                            cache_read_input_tokens=MILLION)
    assert summarizer_cost_usd(usage) == pytest.approx(0.40 + 1.60 + 0.10)


def test_usage_of_no_tokens_costs_nothing_whatever_its_model() -> None:
    assert summarizer_cost_usd(SummarizerUsage(model="extractive", calls=1)) == 0


def test_an_unpriced_model_is_counted_at_the_dearest_entry_and_named_once(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_prices, "_warned", set())  # this process has warned of none
    usage = SummarizerUsage(model="my-inline-summarizer", input_tokens=MILLION,
                            output_tokens=MILLION)
    dearest = max(DEFAULT_PRICES.values(), key=lambda p: p.output_per_mtok)
    with caplog.at_level(logging.WARNING, logger="sessionfold.runtime.prices"):
        first = summarizer_cost_usd(usage)
        again = summarizer_cost_usd(usage)
    assert first == again == pytest.approx(dearest.input_per_mtok + dearest.output_per_mtok)
    assert first > summarizer_cost_usd(usage.model_copy(update={"model": "claude-haiku-4-5"}))
    warnings = [r for r in caplog.records if "my-inline-summarizer" in r.getMessage()]
    assert len(warnings) == 1 and "SESSIONFOLD_PRICES" in warnings[0].getMessage()
