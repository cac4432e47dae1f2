"""One strict reader of provider usage (issue 33): every count is a whole number of tokens >= 0,
or the report is refused naming the field, whoever reads it (pricing, the prompt size, the usage
bus, the store)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from sessionfold.core.errors import InvalidUsageError, UsageUnmeasurableError
from sessionfold.core.tokens import MAX_REPORTED_TOKENS, reported_prompt_tokens
from sessionfold.core.usage import CallTokens, read_usage, usage_shape
from sessionfold.runtime.usage import UsageEvent

#: What a JSON body can carry where a count belongs, and is not one.
NOT_COUNTS = ["abc", "12", [1], {}, math.nan, math.inf, -math.inf, float("1e400"), True, False,
              12.7, 12.0, -1]


@pytest.mark.parametrize("value", NOT_COUNTS)
def test_a_count_that_is_not_a_whole_number_of_tokens_is_refused_naming_the_field(
        value: Any) -> None:
    for usage, field in (({"input_tokens": value}, "usage.input_tokens"),
                         ({"input_tokens": 5, "cache_read_input_tokens": value},
                          "usage.cache_read_input_tokens"),
                         ({"prompt_tokens": value}, "usage.prompt_tokens"),
                         ({"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": value}},
                          "usage.prompt_tokens_details.cached_tokens"),
                         ({"input_tokens": 5, "output_tokens": value}, "usage.output_tokens")):
        with pytest.raises(InvalidUsageError) as caught:
            read_usage(usage)
        assert caught.value.field == field
        assert field in str(caught.value)


@pytest.mark.parametrize("value", NOT_COUNTS)
def test_every_reader_of_usage_refuses_what_the_strict_reader_refuses(value: Any) -> None:
    usage = {"input_tokens": 100, "cache_creation_input_tokens": value}
    with pytest.raises(InvalidUsageError, match=r"usage\.cache_creation_input_tokens"):
        reported_prompt_tokens(usage)
    with pytest.raises(InvalidUsageError, match=r"usage\.cache_creation_input_tokens"):
        reported_prompt_tokens(usage, measure="estimate")
    with pytest.raises(InvalidUsageError, match=r"usage\.cache_creation_input_tokens"):
        UsageEvent.from_usage("s1", usage, seq=0, revision=0)


def test_a_count_no_context_window_could_hold_is_unmeasurable_naming_the_field() -> None:
    with pytest.raises(UsageUnmeasurableError, match=r"usage\.output_tokens.*more than any "
                                                     "context window holds"):
        read_usage({"input_tokens": 10, "output_tokens": 10**30})
    with pytest.raises(UsageUnmeasurableError, match="more than any context window holds"):
        UsageEvent.from_usage("s1", {"input_tokens": MAX_REPORTED_TOKENS,
                                     "cache_read_input_tokens": 1}, seq=0, revision=0)


def test_a_report_naming_no_count_reads_as_zero_tokens() -> None:
    for usage in (None, {}, {"input_tokens": None}, SimpleNamespace(input_tokens=None)):
        assert read_usage(usage) == CallTokens()
    assert UsageEvent.from_usage("s1", {}, seq=0, revision=0, time_s=1.0).prompt_tokens == 0


@pytest.mark.parametrize("usage", ["input_tokens=5", 5, [("input_tokens", 5)], b"{}"])
def test_a_report_that_is_no_mapping_or_usage_object_is_refused(usage: Any) -> None:
    with pytest.raises(InvalidUsageError, match="mapping or an SDK usage object"):
        read_usage(usage)


def test_the_shape_is_read_from_the_fields_a_report_names() -> None:
    anthropic = {"input_tokens": 100, "cache_read_input_tokens": 1000,
                 "cache_creation_input_tokens": 50, "output_tokens": 9}
    chat = {"prompt_tokens": 1234, "completion_tokens": 56,
            "prompt_tokens_details": {"cached_tokens": 1000}}
    responses = {"input_tokens": 1234, "output_tokens": 56,
                 "input_tokens_details": {"cached_tokens": 1000}}
    assert (usage_shape(anthropic), usage_shape(chat), usage_shape(responses)) == (
        "anthropic", "openai", "openai")
    assert read_usage(anthropic) == CallTokens(uncached=100, cache_read=1000,
                                               cache_write_5m=50, output=9)
    for usage in (chat, responses):
        assert read_usage(usage) == CallTokens(uncached=234, cache_read=1000, output=56)
        assert reported_prompt_tokens(usage) == 1234


def test_an_event_keeps_the_providers_split_of_the_prompt() -> None:
    event = UsageEvent.from_usage("s1", {"prompt_tokens": 1234, "completion_tokens": 56,
                                         "prompt_tokens_details": {"cached_tokens": 1000}},
                                  seq=3, revision=1, time_s=1.0)
    assert (event.input_tokens, event.cache_read_input_tokens, event.output_tokens,
            event.prompt_tokens) == (234, 1000, 56, 1234)


def test_a_breakdown_of_writes_without_their_total_is_what_was_written() -> None:
    usage = {"cache_read_input_tokens": 3096,
             "cache_creation": {"ephemeral_5m_input_tokens": 894, "ephemeral_1h_input_tokens": 85}}
    assert read_usage(usage) == CallTokens(cache_read=3096, cache_write_5m=894,
                                           cache_write_1h=85)
    only_written = {"cache_creation": {"ephemeral_1h_input_tokens": 1}}
    assert read_usage(only_written) == CallTokens(cache_write_1h=1)
