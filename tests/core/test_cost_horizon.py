"""Folds priced over the session's expected remaining life, and ceilings that leave room for a
slow summarizer: a session about to end is not folded to save reads it will never make, and a
fold that lands several calls late is decided that much earlier."""

from __future__ import annotations

import pytest
from sessionfold.core.cycles import FoldOption, choose_fold
from sessionfold.core.economics import (
    HORIZON_SHARE,
    MIN_HORIZON_CALLS,
    ceiling_tokens,
    expected_calls_left,
    next_trigger_tokens,
)
from sessionfold.core.errors import InvalidPolicyError
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.prices import DEFAULT_PRICES
from sessionfold.core.window import CompactionRecord

PRICING = FoldPricing(agent=DEFAULT_PRICES["claude-sonnet-4-5"],
                      summarizer=DEFAULT_PRICES["claude-haiku-4-5"])
SUMMARY = FoldOption(target_tokens=4_000, summary_tokens=300, label="summarize")


def choose(window: int, horizon: float | None, **kwargs: float) -> object:
    return choose_fold(PRICING, [SUMMARY], window_tokens=window, ceiling_tokens=60_000,
                       growth_tokens=800, stable_prefix_tokens=2_000, horizon_calls=horizon,
                       **kwargs)


def test_a_fold_the_long_run_pays_for_is_refused_when_the_session_is_about_to_end() -> None:
    long_run = choose(14_000, None)
    assert long_run.why == "pays"  # type: ignore[attr-defined]
    ending = choose(14_000, 2)
    assert ending.why == "would-not-pay"  # type: ignore[attr-defined]
    assert ending.saving_now < 0  # type: ignore[attr-defined]
    assert "before the session ends" in ending.explain()  # type: ignore[attr-defined]
    assert ending.to_json()["horizon_calls"] == 2  # type: ignore[attr-defined]


def test_a_fold_that_pays_back_within_the_calls_left_is_made() -> None:
    choice = choose(14_000, 6)
    assert choice.why == "pays"  # type: ignore[attr-defined]
    assert "before the session ends" in choice.explain()  # type: ignore[attr-defined]


def test_the_budget_wins_over_a_short_life() -> None:
    # The next call would pass the ceiling: fold, however few calls are left.
    choice = choose(59_500, 1)
    assert choice.why == "ceiling"  # type: ignore[attr-defined]


def test_a_refused_fold_is_looked_at_again_where_it_would_pay_or_one_call_short_of_the_ceiling(
        ) -> None:
    growing = choose(9_000, 8, horizon_growth=1.0)
    assert growing.why == "would-not-pay"  # type: ignore[attr-defined]
    revisit = growing.revisit_tokens  # type: ignore[attr-defined]
    assert 9_000 < revisit < 60_000 - 800
    # There the fold pays with the horizon grown as the session aged; a call earlier it did not.
    k = round((revisit - 9_000) / 800)
    assert choose(int(revisit), 8 + k).why == "pays"  # type: ignore[attr-defined]
    assert choose(int(revisit) - 800, 8 + k - 1).why == "would-not-pay"  # type: ignore[attr-defined]
    # Counting down to the end the agent gave: it never pays, so the next look is the ceiling's.
    counting_down = choose(9_000, 3, horizon_growth=-1.0)
    assert counting_down.revisit_tokens == 60_000 - 800  # type: ignore[attr-defined]


def test_the_next_trigger_after_a_refusal_for_a_short_life_is_the_revisit() -> None:
    policy = FoldPolicy(budget_tokens=64_000)
    choice = choose(9_000, 8)
    record = CompactionRecord(trigger="threshold", outcome="refused", budget_tokens=64_000,
                              target_tokens=policy.target_tokens, measured_tokens=9_000,
                              measured_by="reported", tokens_after=9_000,
                              economics=choice.to_json())  # type: ignore[attr-defined]
    revisit = choice.revisit_tokens  # type: ignore[attr-defined]
    assert next_trigger_tokens(policy, record) == min(policy.trigger_tokens, round(revisit))


def test_the_age_is_the_prior_unless_the_agent_says_how_long_it_runs() -> None:
    policy = FoldPolicy(budget_tokens=16_000)
    assert expected_calls_left(policy, 40) == (HORIZON_SHARE * 40, HORIZON_SHARE)
    assert expected_calls_left(policy, 2) == (float(MIN_HORIZON_CALLS), HORIZON_SHARE)
    assert 0 < HORIZON_SHARE <= 1  # priced on no more than the median remaining life
    told = FoldPolicy(budget_tokens=16_000, expected_calls=50)
    assert expected_calls_left(told, 40) == (10.0, -1.0)
    assert expected_calls_left(told, 80) == (1.0, -1.0)  # past its estimate: a call at a time
    with pytest.raises(InvalidPolicyError, match="expected_calls"):
        FoldPolicy(budget_tokens=16_000, expected_calls=0)


def test_the_ceiling_leaves_room_for_the_calls_a_late_fold_takes_to_land() -> None:
    policy = FoldPolicy(budget_tokens=16_000)
    next_call = ceiling_tokens(policy, 700, 1.0)
    late = ceiling_tokens(policy, 700, 6.0)
    assert next_call == policy.guard_tokens - 700
    assert late == policy.guard_tokens - 6 * 700 < next_call
    # Never below the target: a fold has to have something to fold down to.
    assert ceiling_tokens(policy, 5_000, 6.0) == policy.target_tokens
    # Landing by the next call it never goes below the trigger, as before.
    assert ceiling_tokens(policy, 5_000, 1.0) == policy.trigger_tokens
