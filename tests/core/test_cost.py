"""The cost model: call prices in both usage shapes, the TTL-aware prefix cache, fold economics
(the issue's break-even arithmetic), policy cost rates and the planner's choice."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sessionfold.core.cycles import (
    FoldOption,
    best_cycle,
    calls_between_folds,
    choose_fold,
    cycle_rate,
)
from sessionfold.core.errors import InvalidInputError, InvalidPolicyError
from sessionfold.core.fold_cost import FoldPricing, fold_cost
from sessionfold.core.prefix_cache import cache_is_cold, simulate_prefix_cache
from sessionfold.core.prices import (
    DEFAULT_PRICES,
    ModelPrices,
    call_cost,
    price_table,
    prices_for,
    request_cost,
    summarizer_dollars,
)
from sessionfold.core.usage import CallTokens, usage_tokens

SONNET = DEFAULT_PRICES["claude-sonnet-4-5"]
HAIKU = DEFAULT_PRICES["claude-haiku-4-5"]
GPT4O = DEFAULT_PRICES["gpt-4o"]
ANTHROPIC = FoldPricing(agent=SONNET, summarizer=HAIKU)
ONE_HOUR = FoldPricing(agent=SONNET, summarizer=HAIKU, ttl="1h")
OPENAI = FoldPricing(agent=GPT4O, summarizer=DEFAULT_PRICES["gpt-4o-mini"])
P = 3e-6  # Sonnet's input price per token
EXACT = 1e-12

PROPERTIES = settings(max_examples=200, deadline=None, database=None)


# --- prices --------------------------------------------------------------------------------------

def test_the_default_table_holds_the_published_prices_and_cache_terms() -> None:
    assert (SONNET.input_per_mtok, SONNET.output_per_mtok) == (3.0, 15.0)
    assert (HAIKU.input_per_mtok, HAIKU.output_per_mtok) == (1.0, 5.0)
    for claude in (SONNET, HAIKU):
        assert (claude.cache_read_multiplier, claude.cache_write_5m_multiplier,
                claude.cache_write_1h_multiplier) == (0.1, 1.25, 2.0)
        assert claude.write_premium and claude.usage_shape == "anthropic"
    assert GPT4O.cache_read_multiplier == 0.5
    assert DEFAULT_PRICES["gpt-5"].cache_read_multiplier == 0.1
    for name in ("gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-5"):
        openai = DEFAULT_PRICES[name]
        assert not openai.write_premium and openai.usage_shape == "openai"
        assert openai.write_multiplier("5m") == openai.write_multiplier("1h") == 1.0


def test_a_dated_snapshot_is_priced_as_its_alias() -> None:
    assert prices_for("claude-sonnet-4-5-20250929") is SONNET
    assert prices_for("gpt-4o-2024-08-06") is GPT4O
    assert prices_for("gpt-4o-mini-2024-07-18") is DEFAULT_PRICES["gpt-4o-mini"]


def test_a_model_that_only_starts_like_a_known_one_has_no_prices() -> None:
    with pytest.raises(InvalidPolicyError,
                       match=r"'gpt-5-pro'.*known: claude-3-5-haiku, claude-haiku-4-5"):
        prices_for("gpt-5-pro")


def test_an_override_changes_only_the_fields_it_names_and_can_add_a_model() -> None:
    table = price_table({"claude-haiku-4-5": {"input_per_mtok": 0.8},
                         "claude-haiku-5-5": {"input_per_mtok": 1, "output_per_mtok": 5}})
    assert table["claude-haiku-4-5"] == HAIKU.model_copy(update={"input_per_mtok": 0.8})
    assert table["claude-haiku-5-5"].cache_write_5m_multiplier == 1.25
    assert table["claude-sonnet-4-5"] is SONNET
    assert DEFAULT_PRICES["claude-haiku-4-5"].input_per_mtok == 1.0  # the defaults stay


def test_turning_the_write_premium_off_prices_writes_as_plain_input() -> None:
    no_premium = price_table({"claude-haiku-4-5": {"write_premium": False}})["claude-haiku-4-5"]
    assert no_premium.write_multiplier("5m") == no_premium.write_multiplier("1h") == 1.0
    env_style = ModelPrices.model_validate(
        {"input_per_mtok": "2", "output_per_mtok": "8", "write_premium": "false"})
    assert env_style.cache_write_1h_multiplier == 1.0
    assert request_cost(GPT4O, written=1000).total == request_cost(GPT4O, uncached=1000).total


@pytest.mark.parametrize(("fields", "named"), [
    ({"input_per_mtok": -1}, "input_per_mtok must be >= 0"),
    ({"output_per_mtok": float("nan")}, "output_per_mtok"),
    ({"input_per_mtok": float("inf")}, "input_per_mtok"),
    ({"output_per_mtok": True}, "output_per_mtok: must be a number"),
    ({"cache_read_multiplier": 1.5}, "cache_read_multiplier is a discount"),
    ({"cache_write_5m_multiplier": 0.9}, "cache_write_5m_multiplier must be >= 1"),
    ({"cache_write_1h_multiplier": 1.1}, "a longer lifetime never costs less"),
    ({"write_premium": False, "cache_write_5m_multiplier": 1.25}, r"must be 1 \(or left out\)"),
    ({"usage_shape": "gemini"}, "usage_shape"),
    ({"cache_write_multiplier": 1.25}, "cache_write_multiplier"),
])
def test_a_bad_price_is_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidPolicyError, match=named):
        ModelPrices(**{"input_per_mtok": 3, "output_per_mtok": 15, **fields})


def test_a_bad_price_inside_the_pricing_names_where_it_is() -> None:
    with pytest.raises(InvalidPolicyError, match=r"agent: .*cache_read_multiplier"):
        FoldPricing.model_validate(
            {"agent": {"input_per_mtok": 3, "output_per_mtok": 15, "cache_read_multiplier": 2}})
    with pytest.raises(InvalidPolicyError, match="ttl"):
        FoldPricing(agent=SONNET, ttl="10m")


@pytest.mark.parametrize("overrides", [
    ["claude-haiku-4-5"], {"": {"input_per_mtok": 1}}, {"claude-haiku-4-5": 0.8},
    {"new-model": {"input_per_mtok": 1}},
])
def test_malformed_price_overrides_are_refused(overrides: Any) -> None:
    with pytest.raises(InvalidPolicyError):
        price_table(overrides)


# --- one call ------------------------------------------------------------------------------------

def test_an_anthropic_usage_is_priced_with_input_tokens_excluding_the_cache() -> None:
    cost = call_cost(SONNET, {"input_tokens": 1000, "cache_read_input_tokens": 50_000,
                              "cache_creation_input_tokens": 2000, "output_tokens": 500})
    # (1000 + 0.1·50_000 + 1.25·2000)·3 + 500·15 = 33_000 µ$
    assert cost.total == pytest.approx(0.033, rel=EXACT)
    assert cost.tokens.prompt == 53_000
    assert cost.cache_read == pytest.approx(0.015, rel=EXACT)


def test_anthropic_writes_are_priced_by_the_lifetime_the_usage_names() -> None:
    usage = {"input_tokens": 1000, "cache_read_input_tokens": 50_000,
             "cache_creation_input_tokens": 2000, "output_tokens": 500,
             "cache_creation": {"ephemeral_5m_input_tokens": 1500,
                                "ephemeral_1h_input_tokens": 500}}
    # writes: (1.25·1500 + 2·500)·3 = 8625 µ$ instead of 7500
    assert call_cost(SONNET, usage).total == pytest.approx(0.034125, rel=EXACT)
    assert call_cost(SONNET, usage, ttl="1h").total == call_cost(SONNET, usage).total


def test_writes_the_breakdown_leaves_out_are_priced_at_the_given_lifetime() -> None:
    usage = {"input_tokens": 0, "cache_creation_input_tokens": 2000,
             "cache_creation": {"ephemeral_5m_input_tokens": 500}}
    assert usage_tokens(usage, "anthropic", ttl="1h") == CallTokens(cache_write_5m=500,
                                                                    cache_write_1h=1500)
    assert call_cost(SONNET, usage, ttl="1h").total == pytest.approx(
        (1.25 * 500 + 2 * 1500) * P, rel=EXACT)


def test_an_openai_usage_is_priced_with_prompt_tokens_including_the_cached_ones() -> None:
    chat = {"prompt_tokens": 10_000, "completion_tokens": 200,
            "prompt_tokens_details": {"cached_tokens": 8000}}
    responses = {"input_tokens": 10_000, "output_tokens": 200,
                 "input_tokens_details": {"cached_tokens": 8000}}
    # 2000·2.5 + 8000·1.25 + 200·10 = 17_000 µ$
    for usage in (chat, responses):
        cost = call_cost(GPT4O, usage)
        assert cost.total == pytest.approx(0.017, rel=EXACT)
        assert cost.tokens == CallTokens(uncached=2000, cache_read=8000, output=200)


def test_sdk_usage_objects_with_absent_fields_are_read_like_mappings() -> None:
    anthropic = SimpleNamespace(input_tokens=1000, output_tokens=10,
                                cache_read_input_tokens=None, cache_creation_input_tokens=None,
                                cache_creation=None)
    assert call_cost(SONNET, anthropic).total == pytest.approx(1000 * P + 10 * 15e-6, rel=EXACT)
    openai = SimpleNamespace(prompt_tokens=100, completion_tokens=1, prompt_tokens_details=None)
    assert usage_tokens(openai, "openai") == CallTokens(uncached=100, output=1)


def test_a_usage_in_the_other_providers_shape_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="OpenAI's shape"):
        call_cost(SONNET, {"prompt_tokens": 10, "completion_tokens": 1})
    with pytest.raises(InvalidInputError, match="OpenAI Responses"):
        call_cost(SONNET, {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 5}})
    with pytest.raises(InvalidInputError, match="Anthropic's shape"):
        call_cost(GPT4O, {"input_tokens": 10, "cache_read_input_tokens": 90})


@pytest.mark.parametrize(("usage", "named"), [
    ({"input_tokens": -1}, "usage.input_tokens must be a whole number"),
    ({"input_tokens": 1.5}, "usage.input_tokens"),
    ({"input_tokens": True}, "usage.input_tokens"),
    ({"input_tokens": "12"}, "usage.input_tokens"),
    ({"input_tokens": 1, "cache_creation": {"ephemeral_1h_input_tokens": -3}},
     "usage.cache_creation.ephemeral_1h_input_tokens"),
    ({"input_tokens": 1, "cache_creation_input_tokens": 10,
      "cache_creation": {"ephemeral_5m_input_tokens": 11}}, "more than cache_creation"),
    ({}, "names none of"),
    ("input_tokens=5", "a mapping or an SDK usage object"),
    (None, "a mapping or an SDK usage object"),
])
def test_a_malformed_anthropic_usage_is_refused(usage: Any, named: str) -> None:
    with pytest.raises(InvalidInputError, match=named):
        call_cost(SONNET, usage)


def test_cached_tokens_beyond_the_prompt_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="exceeds prompt_tokens"):
        call_cost(GPT4O, {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 11}})


def test_a_predicted_request_pays_the_write_of_its_lifetime() -> None:
    five = request_cost(SONNET, read=40_000, written=10_000, output=100)
    hour = request_cost(SONNET, read=40_000, written=10_000, output=100, ttl="1h")
    assert five.cache_write == pytest.approx(1.25 * 10_000 * P, rel=EXACT)
    assert hour.cache_write == pytest.approx(2.0 * 10_000 * P, rel=EXACT)
    assert hour.total - five.total == pytest.approx(0.75 * 10_000 * P, rel=EXACT)
    assert five.cache_read == pytest.approx(0.1 * 40_000 * P, rel=EXACT)


def test_the_summarizer_is_priced_at_its_own_models_input_and_output() -> None:
    assert summarizer_dollars(HAIKU, input_tokens=10_000, output_tokens=1000) == \
        pytest.approx(0.015, rel=EXACT)


@pytest.mark.parametrize("bad", [{"read": -1}, {"written": 2.0}, {"output": None},
                                 {"ttl": "10m"}])
def test_bad_predicted_counts_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        request_cost(SONNET, **bad)


tokens = st.integers(min_value=0, max_value=10**7)
call_tokens = st.builds(CallTokens, uncached=tokens, cache_read=tokens, cache_write_5m=tokens,
                        cache_write_1h=tokens, output=tokens)
multipliers = st.tuples(st.floats(0, 1), st.floats(1, 3), st.floats(0, 2)).map(
    lambda t: (t[0], t[1], t[1] + t[2]))
any_prices = st.builds(
    lambda m, i, o: ModelPrices(input_per_mtok=i, output_per_mtok=o, cache_read_multiplier=m[0],
                                cache_write_5m_multiplier=m[1], cache_write_1h_multiplier=m[2]),
    multipliers, st.floats(0, 100), st.floats(0, 500))


@PROPERTIES
@given(prices=any_prices, base=call_tokens, more=call_tokens)
def test_a_call_never_costs_less_for_more_tokens(prices: ModelPrices, base: CallTokens,
                                                 more: CallTokens) -> None:
    assert prices.cost(base + more).total >= prices.cost(base).total


@PROPERTIES
@given(prices=any_prices, split=st.tuples(tokens, tokens), moved=tokens)
def test_a_longer_lifetime_never_makes_a_write_cheaper(prices: ModelPrices,
                                                       split: tuple[int, int],
                                                       moved: int) -> None:
    five, hour = split
    base = {"input_tokens": 0, "cache_creation_input_tokens": five + hour + moved}
    shorter = {**base, "cache_creation": {"ephemeral_5m_input_tokens": five + moved,
                                          "ephemeral_1h_input_tokens": hour}}
    longer = {**base, "cache_creation": {"ephemeral_5m_input_tokens": five,
                                         "ephemeral_1h_input_tokens": hour + moved}}
    # equal multipliers may round the two sums one ulp apart
    assert call_cost(prices, longer).total >= call_cost(prices, shorter).total * (1 - 1e-12)


# --- the prefix cache ----------------------------------------------------------------------------

def test_a_warm_prefix_is_read_and_the_rest_written() -> None:
    hit = simulate_prefix_cache(previous_tokens=40_000, request_tokens=41_000,
                                common_prefix_tokens=40_000, seconds_since_use=10)
    assert (hit.read, hit.written, hit.cold) == (40_000, 1000, False)
    folded = simulate_prefix_cache(previous_tokens=41_000, request_tokens=20_000,
                                   common_prefix_tokens=4000, seconds_since_use=10)
    assert (folded.read, folded.written) == (4000, 16_000)
    assert folded.call_tokens(output=7) == CallTokens(cache_read=4000, cache_write_5m=16_000,
                                                      output=7)


@pytest.mark.parametrize(("ttl", "seconds", "cold"), [
    ("5m", 0, False), ("5m", 300, False), ("5m", 300.001, True), ("5m", 301, True),
    ("1h", 301, False), ("1h", 3600, False), ("1h", 3601, True), ("5m", None, True),
])
def test_a_prefix_unused_for_longer_than_the_ttl_is_written_again_whole(
        ttl: Any, seconds: float | None, cold: bool) -> None:
    result = simulate_prefix_cache(previous_tokens=40_000, request_tokens=41_000,
                                   common_prefix_tokens=40_000, seconds_since_use=seconds,
                                   ttl=ttl)
    assert cache_is_cold(seconds, ttl) is cold
    assert result.cold is cold
    assert (result.read, result.written) == ((0, 41_000) if cold else (40_000, 1000))
    assert result.call_tokens().cache_write_1h == (result.written if ttl == "1h" else 0)


def test_a_first_request_has_nothing_to_read() -> None:
    first = simulate_prefix_cache(previous_tokens=0, request_tokens=5000,
                                  common_prefix_tokens=0, seconds_since_use=0)
    assert (first.read, first.written, first.cold) == (0, 5000, True)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"common_prefix_tokens": 40_001}, "cannot exceed the previous request"),
    ({"request_tokens": 30_000, "common_prefix_tokens": 35_000}, "or the new one"),
    ({"seconds_since_use": -1}, "seconds_since_use"),
    ({"seconds_since_use": float("nan")}, "seconds_since_use"),
    ({"ttl": "10m"}, "a cache TTL is one of 5m, 1h"),
    ({"previous_tokens": -5}, "previous_tokens"),
])
def test_an_impossible_prefix_is_refused(kwargs: dict[str, Any], named: str) -> None:
    args: dict[str, Any] = {"previous_tokens": 40_000, "request_tokens": 41_000,
                            "common_prefix_tokens": 40_000, "seconds_since_use": 10, **kwargs}
    with pytest.raises(InvalidInputError, match=named):
        simulate_prefix_cache(**args)


# --- one fold ------------------------------------------------------------------------------------

def test_the_issues_fold_pays_back_after_11_5_w_over_s_minus_1_calls() -> None:
    fold = fold_cost(ANTHROPIC, kept_tokens=38_000, removed_tokens=16_000)
    assert fold.break_premium == pytest.approx(1.15 * 38_000 * P, rel=EXACT)
    assert fold.first_call_saving == fold.per_call_saving == pytest.approx(1600 * P, rel=EXACT)
    assert fold.payback_calls == pytest.approx(11.5 * 38_000 / 16_000 - 1, rel=EXACT)
    assert fold.payback_calls == pytest.approx(26.3125, rel=EXACT)
    assert round(fold.payback_calls) == 26


def test_a_one_hour_cache_makes_a_fold_pay_back_later() -> None:
    fold = fold_cost(ONE_HOUR, kept_tokens=38_000, removed_tokens=16_000)
    assert fold.payback_calls == pytest.approx(19 * 38_000 / 16_000 - 1, rel=EXACT)


def test_the_summarizers_price_lengthens_the_payback() -> None:
    sigma = summarizer_dollars(HAIKU, input_tokens=18_000, output_tokens=2000)  # $0.028
    fold = fold_cost(ANTHROPIC, kept_tokens=38_000, removed_tokens=16_000,
                     summarizer_dollars=sigma)
    assert sigma == pytest.approx(0.028, rel=EXACT)
    assert fold.payback_calls == pytest.approx(26.3125 + 0.028 / (1600 * P), rel=EXACT)


def test_a_fold_during_an_idle_gap_costs_no_write_premium() -> None:
    fold = fold_cost(ANTHROPIC, kept_tokens=38_000, removed_tokens=16_000, cold=True,
                     summarizer_dollars=0.028)
    assert fold.break_premium == 0
    assert fold.first_call_saving == pytest.approx(1.25 * 16_000 * P, rel=EXACT)  # $0.06
    assert fold.net_cost == pytest.approx(0.028 - 0.06, rel=EXACT)
    assert fold.payback_calls == 0


def test_without_a_write_premium_a_fold_costs_the_lost_read_discount() -> None:
    fold = fold_cost(OPENAI, kept_tokens=38_000, removed_tokens=16_000)
    assert fold.break_premium == pytest.approx(0.5 * 38_000 * 2.5e-6, rel=EXACT)
    # (w − r)/r · W/S − 1 with w = 1, r = 0.5
    assert fold.payback_calls == pytest.approx(38_000 / 16_000 - 1, rel=EXACT)


def test_the_stable_head_stays_cached_across_a_fold() -> None:
    fold = fold_cost(ANTHROPIC, kept_tokens=38_000, removed_tokens=16_000,
                     stable_prefix_tokens=6000)
    assert fold.break_premium == pytest.approx(1.15 * 32_000 * P, rel=EXACT)
    assert fold.payback_calls == pytest.approx(11.5 * 32_000 / 16_000 - 1, rel=EXACT)


def test_the_net_saving_over_a_horizon_counts_the_first_call_and_each_later_one() -> None:
    fold = fold_cost(ANTHROPIC, kept_tokens=38_000, removed_tokens=16_000,
                     summarizer_dollars=0.01)
    assert fold.net_saving(0) == -0.01
    assert fold.net_saving(1) == pytest.approx(-(0.1311 + 0.01 - 0.0048), rel=EXACT)
    assert fold.net_saving(50) == pytest.approx(49 * 0.0048 - 0.1363, rel=EXACT)
    assert fold.net_saving(1) < 0 < fold.net_saving(math.ceil(1 + fold.payback_calls))
    assert fold.net_saving(math.floor(1 + fold.payback_calls)) < 0


def test_a_fold_that_removes_nothing_never_pays_back() -> None:
    assert fold_cost(ANTHROPIC, kept_tokens=38_000, removed_tokens=0).payback_calls == math.inf
    assert fold_cost(ANTHROPIC, kept_tokens=0, removed_tokens=10).payback_calls == 0


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"stable_prefix_tokens": 40_000}, "cannot exceed kept_tokens"),
    ({"summarizer_dollars": -0.01}, "summarizer_dollars"),
    ({"summarizer_dollars": float("inf")}, "summarizer_dollars"),
    ({"removed_tokens": -1}, "removed_tokens"),
])
def test_an_impossible_fold_is_refused(kwargs: dict[str, Any], named: str) -> None:
    args: dict[str, Any] = {"kept_tokens": 38_000, "removed_tokens": 16_000, **kwargs}
    with pytest.raises(InvalidInputError, match=named):
        fold_cost(ANTHROPIC, **args)


def test_net_saving_refuses_a_negative_horizon() -> None:
    with pytest.raises(InvalidInputError, match="calls"):
        fold_cost(ANTHROPIC, kept_tokens=1, removed_tokens=1).net_saving(-1)


pricings = st.sampled_from([ANTHROPIC, ONE_HOUR, OPENAI])


@st.composite
def two_depths(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """A window X, a stable head H, and two targets H <= deep < shallow < X."""
    head = draw(st.integers(0, 20_000))
    deep = draw(st.integers(head, 200_000))
    shallow = draw(st.integers(deep + 1, 300_000))
    window = draw(st.integers(shallow + 1, 400_000))
    return window, head, deep, shallow


@PROPERTIES
@given(pricing=pricings, depths=two_depths(), summary=st.integers(0, 5000), cold=st.booleans())
def test_a_deeper_fold_never_pays_back_later_with_the_same_summary_terms(
        pricing: FoldPricing, depths: tuple[int, int, int, int], summary: int,
        cold: bool) -> None:
    window, head, deep, shallow = depths
    summarizer = pricing.summarizer
    assert summarizer is not None

    def payback(kept: int) -> float:
        removed = window - kept
        sigma = summarizer_dollars(summarizer, input_tokens=removed + summary,
                                   output_tokens=summary) if summary else 0.0
        return fold_cost(pricing, kept_tokens=kept, removed_tokens=removed, cold=cold,
                         stable_prefix_tokens=head, summarizer_dollars=sigma).payback_calls

    assert payback(deep) <= payback(shallow) * (1 + 1e-9)


def test_a_deeper_fold_pays_back_later_when_only_it_needs_a_dear_summarizer() -> None:
    # Precisely: the deeper fold (S2 > S1) pays back later iff σ2/S2 − σ1/S1 exceeds
    # p·(w − r)·((W1 − H)/S1 − (W2 − H)/S2): its summarizer's price per removed token grows by
    # more than the break premium per removed token falls. Equal summary terms never do that.
    dear = ModelPrices(input_per_mtok=15, output_per_mtok=75)
    pricing = FoldPricing(agent=SONNET, summarizer=dear)
    mask = fold_cost(pricing, kept_tokens=30_000, removed_tokens=10_000)
    sigma = summarizer_dollars(dear, input_tokens=22_000, output_tokens=2000)  # $0.48
    summarize = fold_cost(pricing, kept_tokens=20_000, removed_tokens=20_000,
                          summarizer_dollars=sigma)
    assert mask.payback_calls == pytest.approx(11.5 * 3 - 1, rel=EXACT)
    assert summarize.payback_calls == pytest.approx(11.5 - 1 + 0.48 / (2000 * P), rel=EXACT)
    assert summarize.payback_calls > mask.payback_calls
    lhs = sigma / 20_000 - 0 / 10_000
    rhs = P * 1.15 * (30_000 / 10_000 - 20_000 / 20_000)
    assert lhs > rhs


@PROPERTIES
@given(pricing=pricings, depths=two_depths(), sigma=st.floats(0, 1))
def test_a_cold_cache_makes_the_fold_premium_zero_and_the_fold_no_dearer(
        pricing: FoldPricing, depths: tuple[int, int, int, int], sigma: float) -> None:
    window, head, kept, _ = depths
    args: dict[str, Any] = {"kept_tokens": kept, "removed_tokens": window - kept,
                            "stable_prefix_tokens": head, "summarizer_dollars": sigma}
    cold, warm = fold_cost(pricing, cold=True, **args), fold_cost(pricing, **args)
    assert cold.break_premium == 0
    assert cold.net_cost <= warm.net_cost
    assert cold.payback_calls <= warm.payback_calls


@PROPERTIES
@given(pricing=pricings, kept=st.integers(1, 10**6), removed=st.integers(1, 10**6))
def test_the_payback_is_the_issues_formula_for_any_window(pricing: FoldPricing, kept: int,
                                                          removed: int) -> None:
    w, r = pricing.write, pricing.read
    expected = max(0.0, (w - r) / r * kept / removed - 1)
    assert fold_cost(pricing, kept_tokens=kept, removed_tokens=removed).payback_calls == \
        pytest.approx(expected, rel=1e-9, abs=1e-9)


# --- a policy: the cost rate -----------------------------------------------------------------

def test_the_cost_rate_of_a_policy_matches_the_hand_computed_cycle() -> None:
    cycle = cycle_rate(ANTHROPIC, 10_000, trigger_tokens=20_000, growth_tokens=1000)
    # call 1 writes 10k; calls 2..10 read 10k..18k and write 1k each:
    # 1.25·10k + 0.1·(9·10k + 1k·36) + 1.25·1k·9 = 38_350 tokens at $3/MTok ... plus the
    # 1.25·1k the first call writes beyond the target: 38_500 in all.
    assert cycle.calls == 10
    assert cycle.cycle_dollars == pytest.approx(38_500 * P, rel=EXACT)
    assert cycle.rate == pytest.approx(0.01155, rel=EXACT)
    assert cycle.trigger_tokens == 20_000
    assert calls_between_folds(trigger_tokens=20_000, target_tokens=10_000,
                               growth_tokens=1000) == 10


@st.composite
def integer_cycles(draw: st.DrawFn) -> tuple[int, int, int, int, int, float]:
    head = draw(st.integers(0, 5000))
    target = draw(st.integers(max(head, 1), 60_000))
    growth = draw(st.integers(1, 5000))
    calls = draw(st.integers(1, 40))
    summary = draw(st.integers(0, min(target, 3000)))
    fraction = draw(st.sampled_from([0.0, 1.0]))
    return head, target, growth, calls, summary, fraction


@PROPERTIES
@given(pricing=pricings, cycle=integer_cycles())
def test_the_closed_form_rate_equals_pricing_each_call_of_the_cycle(
        pricing: FoldPricing, cycle: tuple[int, int, int, int, int, float]) -> None:
    head, target, growth, calls, summary, fraction = cycle
    assert pricing.summarizer is not None
    total, previous = 0.0, target + calls * growth  # the request before the last fold
    for k in range(1, calls + 1):
        request = target + k * growth
        common = head if k == 1 else previous
        hit = simulate_prefix_cache(previous_tokens=previous, request_tokens=request,
                                    common_prefix_tokens=common, seconds_since_use=4,
                                    ttl=pricing.ttl)
        total += pricing.agent.cost(hit.call_tokens()).total
        previous = request
    if summary:
        total += summarizer_dollars(pricing.summarizer,
                                    input_tokens=int(fraction * calls * growth) + summary,
                                    output_tokens=summary)
    option = FoldOption(target_tokens=target, summary_tokens=summary,
                        summarized_fraction=fraction)
    rate = cycle_rate(pricing, option, trigger_tokens=target + calls * growth,
                      growth_tokens=growth, stable_prefix_tokens=head)
    assert rate.cycle_dollars == pytest.approx(total, rel=1e-9)


def test_the_best_trigger_balances_the_folds_price_against_the_growing_reads() -> None:
    option = FoldOption(target_tokens=16_000, summary_tokens=2000)
    best = best_cycle(ANTHROPIC, option, ceiling_tokens=200_000, growth_tokens=1000,
                      stable_prefix_tokens=4000)
    a = 1.15 * 12_000 * P + 6e-6 * 2000
    c = 0.1 * 1000 * P / 2
    assert best.fold_fixed == pytest.approx(a, rel=EXACT)
    assert best.growth_cost == pytest.approx(c, rel=EXACT)
    assert best.calls == pytest.approx(math.sqrt(a / c), rel=EXACT)
    assert best.extra_cost(best.calls) == pytest.approx(0, abs=1e-12)
    assert best.extra_cost(best.calls + 5) == pytest.approx(25 * c, rel=1e-9)


def test_the_best_trigger_is_capped_by_the_ceiling() -> None:
    best = best_cycle(ANTHROPIC, 16_000, ceiling_tokens=20_000, growth_tokens=1000)
    assert (best.calls, best.trigger_tokens, best.feasible) == (4, 20_000, True)
    cramped = best_cycle(ANTHROPIC, 19_500, ceiling_tokens=20_000, growth_tokens=1000)
    assert (cramped.calls, cramped.feasible) == (1, False)


def test_with_free_cache_reads_the_best_cycle_is_the_longest() -> None:
    free = FoldPricing(agent=ModelPrices(input_per_mtok=3, output_per_mtok=15,
                                         cache_read_multiplier=0))
    best = best_cycle(free, 10_000, ceiling_tokens=50_000, growth_tokens=1000)
    assert best.calls == 40


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"trigger_tokens": 10_500}, "less than one call of growth"),
    ({"trigger_tokens": 9000}, "below target_tokens"),
    ({"growth_tokens": 0}, "growth_tokens must be a finite number > 0"),
    ({"growth_tokens": float("nan")}, "growth_tokens"),
    ({"stable_prefix_tokens": 10_001}, "cannot exceed the target"),
])
def test_an_impossible_cycle_is_refused(kwargs: dict[str, Any], named: str) -> None:
    args: dict[str, Any] = {"trigger_tokens": 20_000, "growth_tokens": 1000, **kwargs}
    with pytest.raises(InvalidInputError, match=named):
        cycle_rate(ANTHROPIC, 10_000, **args)


def test_a_summarizing_option_needs_the_summarizers_prices() -> None:
    with pytest.raises(InvalidInputError, match="'deep' writes a summary"):
        cycle_rate(FoldPricing(agent=SONNET),
                   FoldOption(target_tokens=10_000, summary_tokens=500, label="deep"),
                   trigger_tokens=20_000, growth_tokens=1000)


@pytest.mark.parametrize(("fields", "named"), [
    ({"target_tokens": 0}, "target_tokens must be >= 1"),
    ({"summary_tokens": 20_000}, "summary_tokens must be in"),
    ({"summarized_fraction": 1.5}, "summarized_fraction"),
    ({"target_tokens": True}, "must be a number"),
])
def test_a_bad_fold_option_is_refused(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidPolicyError, match=named):
        FoldOption(**{"target_tokens": 10_000, **fields})


@st.composite
def policies(draw: st.DrawFn) -> tuple[int, int, int, float]:
    head = draw(st.integers(0, 8000))
    target = draw(st.integers(max(head, 1), 100_000))
    growth = draw(st.floats(50, 8000))
    ceiling = draw(st.integers(target + math.ceil(growth), 250_000))
    return head, target, ceiling, growth


@PROPERTIES
@given(pricing=pricings, policy=policies(), summary=st.integers(0, 3000),
       share=st.floats(0, 1))
def test_no_trigger_under_the_ceiling_has_a_lower_rate_than_the_best(
        pricing: FoldPricing, policy: tuple[int, int, int, float], summary: int,
        share: float) -> None:
    head, target, ceiling, growth = policy
    option = FoldOption(target_tokens=target, summary_tokens=min(summary, target))
    best = best_cycle(pricing, option, ceiling_tokens=ceiling, growth_tokens=growth,
                      stable_prefix_tokens=head)
    assert best.feasible and best.trigger_tokens <= ceiling * (1 + 1e-12)
    trigger = target + growth + share * (ceiling - target - growth)
    other = cycle_rate(pricing, option, trigger_tokens=trigger, growth_tokens=growth,
                       stable_prefix_tokens=head)
    assert best.rate <= other.rate * (1 + 1e-12)


@PROPERTIES
@given(pricing=pricings, policy=policies(), deeper_by=st.integers(0, 50_000),
       summary=st.integers(0, 1000), fraction=st.floats(0, 1))
def test_the_best_rate_never_falls_as_the_target_rises(
        pricing: FoldPricing, policy: tuple[int, int, int, float], deeper_by: int,
        summary: int, fraction: float) -> None:
    # Why a continuous range of targets is decided by its low end (choose_fold's doc).
    head, target, ceiling, growth = policy
    summary = min(summary, target)
    deeper = max(head, summary, 1, target - deeper_by)

    def best(t: int) -> float:
        option = FoldOption(target_tokens=t, summary_tokens=summary,
                            summarized_fraction=fraction)
        return best_cycle(pricing, option, ceiling_tokens=ceiling, growth_tokens=growth,
                          stable_prefix_tokens=head).rate

    assert best(deeper) <= best(target) * (1 + 1e-12)


# --- the choice ----------------------------------------------------------------------------------

MASK = FoldOption(target_tokens=38_000, label="mask-tool-results")
SUMMARIZE = FoldOption(target_tokens=16_000, summary_tokens=2000, label="summarize")
CHOICE: dict[str, Any] = {"ceiling_tokens": 54_400, "growth_tokens": 1000,
                          "stable_prefix_tokens": 4000}


def test_the_planner_chooses_the_lowest_long_run_rate_deep_and_rare() -> None:
    choice = choose_fold(ANTHROPIC, [MASK, SUMMARIZE], window_tokens=45_000, **CHOICE)
    mask, summarize = choice.candidates
    assert choice.option is SUMMARIZE
    assert summarize.rate < mask.rate
    assert mask.trigger_tokens == 54_400  # shallow: as late as the ceiling allows
    # deep: a fold's fixed price a = 1.15·12k·3e-6 + 6e-6·2k against c = 0.1·1k·3e-6/2
    assert summarize.calls == pytest.approx(math.sqrt(0.0534 / 0.00015), rel=1e-9)
    assert choice.why == "pays" and choice.fold and choice.refusal is None


def test_folding_before_the_best_trigger_is_refused_as_would_not_pay_with_its_figures() -> None:
    choice = choose_fold(ANTHROPIC, [MASK, SUMMARIZE], window_tokens=30_000, **CHOICE)
    assert choice.why == "would-not-pay" and not choice.fold
    assert choice.refusal == "would-not-pay"
    n_now = (30_000 - 16_000) / 1000
    c = choice.chosen
    assert choice.saving_now == pytest.approx(-c.growth_cost * (n_now - c.calls) ** 2, rel=1e-9)
    record = choice.to_json()
    assert record["why"] == "would-not-pay" and record["chosen"]["label"] == "summarize"
    assert len(record["candidates"]) == 2
    assert record["explain"].startswith("would-not-pay: folding the 30,000-token window to "
                                        "16,000 'summarize' now costs $")


def test_an_idle_session_past_its_cache_lifetime_folds_now_because_the_rewrite_is_free() -> None:
    warm = choose_fold(ANTHROPIC, [MASK, SUMMARIZE], window_tokens=30_000, **CHOICE)
    cold = choose_fold(ANTHROPIC, [MASK, SUMMARIZE], window_tokens=30_000, cold=True, **CHOICE)
    assert cold.why == "pays"
    assert cold.saving_now - warm.saving_now == pytest.approx(1.15 * 26_000 * P, rel=1e-9)
    assert "cache cold" in cold.explain()


def test_the_next_call_passing_the_ceiling_forces_the_fold() -> None:
    choice = choose_fold(ANTHROPIC, [MASK, SUMMARIZE], window_tokens=53_500, **CHOICE)
    assert choice.why == "ceiling" and choice.fold
    assert choice.explain().startswith("ceiling: the next call (53,500 + 1,000)")


def test_a_window_already_at_the_target_is_left_alone() -> None:
    choice = choose_fold(ANTHROPIC, [MASK, SUMMARIZE], window_tokens=15_000, **CHOICE)
    assert choice.why == "at-target" and not choice.fold and choice.refusal is None
    assert choice.saving_now == 0


def test_without_a_write_premium_a_folds_fixed_price_is_the_lost_read_discount() -> None:
    anthropic = choose_fold(ANTHROPIC, [MASK], window_tokens=50_000, **CHOICE)
    openai = choose_fold(OPENAI, [MASK], window_tokens=50_000, **CHOICE)
    # a = (w − r)·(W − H)·p: 1.15 at Anthropic's 5-minute cache, 1 − 0.5 at gpt-4o.
    assert anthropic.chosen.fold_fixed == pytest.approx(1.15 * 34_000 * P, rel=EXACT)
    assert openai.chosen.fold_fixed == pytest.approx(0.5 * 34_000 * 2.5e-6, rel=EXACT)
    # and the cold bonus of an idle fold is the same discount on the whole prefix
    cold = choose_fold(OPENAI, [MASK], window_tokens=50_000, cold=True, **CHOICE)
    assert cold.saving_now - openai.saving_now == pytest.approx(0.5 * 46_000 * 2.5e-6,
                                                                rel=1e-9)


def test_when_no_option_leaves_room_for_a_call_the_cheapest_is_still_named() -> None:
    choice = choose_fold(ANTHROPIC, [54_000, 53_900], window_tokens=54_300, **CHOICE)
    assert not any(c.feasible for c in choice.candidates)
    assert choice.option.target_tokens == 53_900 and choice.why == "ceiling"


@pytest.mark.parametrize(("options", "kwargs", "named"), [
    ([], {}, "at least one fold option"),
    ([True], {}, "a fold option is a FoldOption"),
    ([MASK], {"growth_tokens": 0}, "growth_tokens"),
    ([MASK], {"window_tokens": 3000}, "cannot exceed the window"),
    ([MASK], {"ceiling_tokens": -1}, "ceiling_tokens"),
    ([SUMMARIZE], {"window_tokens": 40_000, "stable_prefix_tokens": 20_000},
     "cannot exceed the target"),
])
def test_a_choice_on_impossible_figures_is_refused(options: list[Any], kwargs: dict[str, Any],
                                                   named: str) -> None:
    args: dict[str, Any] = {**CHOICE, "window_tokens": 40_000, **kwargs}
    with pytest.raises(InvalidInputError, match=named):
        choose_fold(ANTHROPIC, options, **args)


target_lists = st.lists(
    st.builds(lambda t, s, f: FoldOption(target_tokens=t, summary_tokens=min(s, t),
                                         summarized_fraction=f),
              st.integers(8000, 60_000), st.integers(0, 3000), st.floats(0, 1)),
    min_size=1, max_size=6)


@PROPERTIES
@given(pricing=pricings, options=target_lists, window=st.integers(8000, 80_000),
       growth=st.floats(100, 5000), cold=st.booleans(), head=st.integers(0, 8000))
def test_the_chosen_targets_rate_is_no_higher_than_any_candidates(
        pricing: FoldPricing, options: list[FoldOption], window: int, growth: float,
        cold: bool, head: int) -> None:
    choice = choose_fold(pricing, options, window_tokens=window, ceiling_tokens=64_000,
                         growth_tokens=growth, cold=cold, stable_prefix_tokens=head)
    pool = [c for c in choice.candidates if c.feasible] or list(choice.candidates)
    assert all(choice.chosen.rate <= c.rate for c in pool)
    assert choice.fold == (choice.refusal is None and choice.why != "at-target")


@PROPERTIES
@given(pricing=pricings, options=target_lists, window=st.integers(8000, 80_000),
       growth=st.floats(100, 5000), head=st.integers(0, 8000))
def test_a_warm_window_a_call_or_more_below_the_best_trigger_never_pays_and_cold_pays_more(
        pricing: FoldPricing, options: list[FoldOption], window: int, growth: float,
        head: int) -> None:
    args: dict[str, Any] = {"window_tokens": window, "ceiling_tokens": 64_000,
                            "growth_tokens": growth, "stable_prefix_tokens": head}
    warm = choose_fold(pricing, options, **args)
    cold = choose_fold(pricing, options, cold=True, **args)
    assert cold.saving_now >= warm.saving_now
    if warm.chosen.feasible and window + growth <= warm.chosen.trigger_tokens:
        assert warm.why in ("would-not-pay", "at-target")
