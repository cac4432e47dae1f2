"""FoldPolicy refuses values no backend can store, saying the allowed range."""

from __future__ import annotations

import pytest
from sessionfold.core.errors import InvalidPolicyError
from sessionfold.core.policy import MAX_POLICY_INT, FoldPolicy


@pytest.mark.parametrize("field", ["budget_tokens", "keep_recent_turns"])
def test_an_integer_past_what_a_database_column_holds_is_refused_with_the_range(
        field: str) -> None:
    values = {"budget_tokens": 32_000, field: 10**30}
    with pytest.raises(InvalidPolicyError) as info:
        FoldPolicy(**values)
    assert field in str(info.value)
    assert f"{MAX_POLICY_INT:,}" in str(info.value)


def test_the_largest_budget_is_accepted() -> None:
    policy = FoldPolicy(budget_tokens=MAX_POLICY_INT, keep_recent_turns=MAX_POLICY_INT)
    assert policy.trigger_tokens < 2**63


def test_a_stored_policy_past_the_range_is_refused_on_load() -> None:
    with pytest.raises(InvalidPolicyError, match="budget_tokens"):
        FoldPolicy.from_json({"budget_tokens": 2**64})
