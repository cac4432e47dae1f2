"""FoldPolicy: defaults, derived thresholds, and errors that say what is allowed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from sessionfold.core.errors import InvalidInputError, InvalidPolicyError
from sessionfold.core.policy import LAYERS, FoldPolicy


def test_defaults_match_the_design() -> None:
    p = FoldPolicy(budget_tokens=32_000)
    assert (p.trigger_ratio, p.target_ratio, p.keep_recent_turns, p.keep_first_user,
            p.max_item_ratio, p.layers, p.retain, p.retention_min, p.measure) == (
        0.85, 0.6, 4, True, 0.25, ("mask-tool-results", "drop-thinking", "summarize"), "ledger",
        0.8, "reported")


def test_thresholds_derive_from_the_budget() -> None:
    p = FoldPolicy(budget_tokens=32_000)
    assert (p.trigger_tokens, p.target_tokens, p.max_item_tokens) == (27_200, 19_200, 8_000)
    q = FoldPolicy(budget_tokens=10_001, trigger_ratio=0.9, target_ratio=0.5, max_item_ratio=0.1)
    assert (q.trigger_tokens, q.target_tokens, q.max_item_tokens) == (9_000, 5_000, 1_000)


def test_drop_oldest_policy_without_a_summarizer() -> None:
    p = FoldPolicy(budget_tokens=64_000, layers=["mask-tool-results", "drop-oldest"],
                   measure="estimate", retain="discard")
    assert p.layers == ("mask-tool-results", "drop-oldest")
    assert set(p.layers) <= set(LAYERS)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"budget_tokens": 500}, "budget_tokens must be at least 1000, got 500"),
    ({}, "budget_tokens: Field required"),
    ({"budget_tokens": "lots"}, "budget_tokens: Input should be a valid integer"),
    ({"budget_tokens": 32_000, "target_ratio": 0.9},
     "need 0 < target_ratio < trigger_ratio <= 1, got target_ratio=0.9, trigger_ratio=0.85"),
    ({"budget_tokens": 32_000, "trigger_ratio": 1.2}, "trigger_ratio <= 1"),
    ({"budget_tokens": 32_000, "target_ratio": 0}, "0 < target_ratio"),
    ({"budget_tokens": 32_000, "trigger_ratio": float("nan")}, "trigger_ratio=nan"),
    ({"budget_tokens": 32_000, "keep_recent_turns": -1}, "keep_recent_turns must be >= 0"),
    ({"budget_tokens": 32_000, "max_item_ratio": 0.6}, "max_item_ratio must be in (0, 0.5]"),
    ({"budget_tokens": 32_000, "retention_min": 1.5}, "retention_min must be in [0, 1]"),
    ({"budget_tokens": 32_000, "layers": ()},
     "layers must name at least one layer; allowed: mask-tool-results, drop-thinking, "
     "summarize, drop-oldest"),
    ({"budget_tokens": 32_000, "layers": ("summarize", "summarize")},
     "layers must not repeat a layer"),
    ({"budget_tokens": 32_000, "layers": ("summarize", "drop-oldest")},
     "'drop-oldest' is used instead of 'summarize', not beside it"),
    ({"budget_tokens": 32_000, "layers": ("compress",)},
     "layers.0: Input should be 'mask-tool-results', 'drop-thinking', 'summarize' or "
     "'drop-oldest' (got 'compress')"),
    ({"budget_tokens": 32_000, "retain": "forget"},
     "retain: Input should be 'ledger' or 'discard' (got 'forget')"),
    ({"budget_tokens": 32_000, "measure": "guess"}, "measure: Input should be 'reported' or"),
    ({"budget_tokens": 32_000, "budget": 1},
     "budget: unknown policy field; allowed: budget_tokens, trigger_ratio"),
])
def test_invalid_values_say_what_is_wrong_and_what_is_allowed(kwargs: dict[str, Any],
                                                              words: str) -> None:
    with pytest.raises(InvalidPolicyError) as info:
        FoldPolicy(**kwargs)
    message = str(info.value)
    assert message.startswith("invalid FoldPolicy: ")
    assert words in message
    assert "pydantic" not in message and "Value error," not in message
    assert isinstance(info.value, InvalidInputError) and isinstance(info.value, ValueError)


def test_json_round_trip_and_bad_json() -> None:
    p = FoldPolicy(budget_tokens=48_000, keep_recent_turns=2, layers=("summarize",))
    data = p.to_json()
    assert data["layers"] == ["summarize"]
    assert FoldPolicy.from_json(data) == p
    with pytest.raises(InvalidPolicyError):
        FoldPolicy.from_json({**data, "budget_tokens": 10})


def test_a_policy_is_immutable() -> None:
    p = FoldPolicy(budget_tokens=32_000)
    with pytest.raises(ValidationError):
        p.budget_tokens = 1  # type: ignore[misc]


@given(budget=st.integers(min_value=1000, max_value=10**8),
       target=st.floats(min_value=0.01, max_value=0.98),
       gap=st.floats(min_value=0.01, max_value=0.5))
def test_target_is_always_below_trigger_below_budget(budget: int, target: float,
                                                     gap: float) -> None:
    trigger = min(1.0, target + gap)
    p = FoldPolicy(budget_tokens=budget, target_ratio=target, trigger_ratio=trigger)
    assert 0 <= p.target_tokens <= p.trigger_tokens <= p.budget_tokens


def test_over_the_budget_is_strictly_past_it_and_the_trigger_is_below_it() -> None:
    policy = FoldPolicy(budget_tokens=10_000)
    assert policy.trigger_tokens == 8500
    assert not policy.over_budget(10_000) and policy.over_budget(10_001)
    assert not policy.over_budget(9000)
