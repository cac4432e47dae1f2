"""Whether a fold can wait for a provider's batch API (core.batching), priced at its rate.

An idle session with a cold cache waits for one; a busy one waits only when the headroom before
the limit covers the batch's delay in calls and the discount pays for the reads the wait costs;
a summarizer whose batch API gives no discount never waits; a visit with no batch summarizer
to ask is priced as before. The choice says ``batch`` in the record, and the planner asks the
batch summarizer for the summary (which may stop the visit: SummaryDeferred).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from sessionfold.core.batching import (
    BatchTerms,
    batch_pricing,
    batch_saving,
    covers_delay,
    request_key,
)
from sessionfold.core.compact import FoldResult, FoldVisit, fold_window
from sessionfold.core.cycles import FoldOption
from sessionfold.core.economics import FoldEconomics
from sessionfold.core.errors import InvalidInputError, SummaryDeferred
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.core.messages import Message
from sessionfold.core.prices import DEFAULT_PRICES
from sessionfold.core.summarizers import ExtractiveSummarizer, Summary
from sessionfold.core.window import SummarizerUsage, Trigger

sys.path.insert(0, str(Path(__file__).parent))
from test_cost_planning import COUNTER, ITEMS, PRICING, SUMMARIZE, policy


class Recorder:
    """A batch summarizer that keeps what it was asked and stops the visit there."""

    model = "recorder"
    context_tokens = 100_000

    def __init__(self) -> None:
        self.asked: list[tuple[int, str | None, tuple[str, ...]]] = []

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        self.asked.append((len(messages), previous_summary, tuple(must_keep)))
        raise SummaryDeferred("sent to the batch API")


def plan(economics: FoldEconomics, *, over: float = 0.86, trigger: Trigger = "threshold",
         batch: Recorder | None = None) -> FoldResult:
    return fold_window(ITEMS, FoldVisit(
        policy(SUMMARIZE, over=over), ExtractiveSummarizer(), counter=COUNTER, trigger=trigger,
        economics=economics, batch_summarizer=batch))


def test_an_idle_session_with_a_cold_cache_waits_for_the_batch_api() -> None:
    recorder = Recorder()
    with pytest.raises(SummaryDeferred):
        plan(FoldEconomics(PRICING, cold=True, batch=BatchTerms(delay_calls=50)),
             over=0.6, trigger="idle", batch=recorder)
    (asked,) = recorder.asked  # the first summary the fold needs, and nothing after it
    assert asked[0] > 0


def test_a_busy_session_waits_only_when_the_headroom_covers_the_delay() -> None:
    waits = Recorder()
    with pytest.raises(SummaryDeferred):
        plan(FoldEconomics(PRICING, batch=BatchTerms(delay_calls=1)), batch=waits)
    assert len(waits.asked) == 1
    # The same visit with a batch that takes a thousand of its calls folds now, at list price.
    live = Recorder()
    result = plan(FoldEconomics(PRICING, batch=BatchTerms(delay_calls=1000)), batch=live)
    assert live.asked == [] and result.record.outcome == "folded"
    figures = result.record.economics
    assert figures is not None and figures["why"] == "pays" and "batch" not in figures


def test_the_wait_is_chosen_only_when_the_discount_pays_for_the_reads_it_costs() -> None:
    option = FoldOption(target_tokens=10_000, summary_tokens=500, summarized_fraction=1.0)
    # No wait (an idle session): half the summary's dollars.
    full = batch_saving(PRICING, option, 30_000, 0.0)
    haiku = DEFAULT_PRICES["claude-haiku-4-5"]
    sigma = (haiku.input_per_token + haiku.output_per_token) * 500 \
        + haiku.input_per_token * 20_000
    assert full == pytest.approx(0.5 * sigma)
    # Each call of waiting reads the 20,000 tokens the fold removes from Sonnet's cache.
    per_call = 0.1 * 3e-6 * 20_000
    assert batch_saving(PRICING, option, 30_000, 3.0) == pytest.approx(0.5 * sigma - 3 * per_call)
    assert batch_saving(PRICING, option, 30_000, 20.0) < 0


def test_a_summarizer_without_a_batch_discount_never_waits() -> None:
    undiscounted = FoldPricing(agent=DEFAULT_PRICES["claude-sonnet-4-5"],
                               summarizer=DEFAULT_PRICES["claude-haiku-4-5"].model_copy(
                                   update={"batch_multiplier": 1.0}))
    assert batch_pricing(undiscounted) is None
    recorder = Recorder()
    result = plan(FoldEconomics(undiscounted, cold=True, batch=BatchTerms(0)), over=0.6,
                  trigger="idle", batch=recorder)
    assert recorder.asked == [] and result.record.outcome == "folded"


def test_batch_terms_without_a_batch_summarizer_price_the_visit_as_before() -> None:
    offered = plan(FoldEconomics(PRICING, cold=True, batch=BatchTerms(0)), over=0.6,
                   trigger="idle")
    plain = plan(FoldEconomics(PRICING, cold=True), over=0.6, trigger="idle")
    assert offered.record.economics == plain.record.economics
    assert offered.window == plain.window


def test_a_waited_fold_is_priced_at_the_batch_rate_and_says_so_in_its_record() -> None:
    class Answering:
        model = "answering"
        context_tokens = 100_000

        def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                      must_keep: Sequence[str] = ()) -> Summary:
            return Summary(text="TICKET-1 src/app.py: the agent listed the modules.",
                           usage=SummarizerUsage(model="answering", calls=1, input_tokens=900,
                                                 output_tokens=40).through_batch())

    result = plan(FoldEconomics(PRICING, cold=True, batch=BatchTerms(0)), over=0.6,
                  trigger="idle", batch=Answering())  # type: ignore[arg-type]
    record = result.record
    assert record.outcome == "folded"
    figures = record.economics
    assert figures is not None and figures["batch"] is True and figures["batch_saving"] > 0
    assert "through the batch API" in figures["explain"]
    assert record.summarizer_usage.batch_calls == record.summarizer_usage.calls == 1
    assert record.summarizer_usage.batch_input_tokens == 900


def test_the_headroom_rule_counts_the_delay_and_one_more_call() -> None:
    pol = policy(SUMMARIZE, guard=False)
    limit = pol.budget_tokens
    assert covers_delay(pol, limit - 1000, 100, 9)       # 1000 = (9 + 1) × 100
    assert not covers_delay(pol, limit - 999, 100, 9)
    with pytest.raises(InvalidInputError):
        BatchTerms(delay_calls=float("inf"))


def test_a_request_is_named_by_what_it_asks_never_by_its_wording() -> None:
    span = [Message(role="user", content="fix TICKET-1"), Message(role="assistant", content="ok")]
    key = request_key(span, "earlier", ["TICKET-1"])
    assert key == request_key(list(span), "earlier", ("TICKET-1",))
    assert len(key) == 64 and key.isalnum()
    assert key != request_key(span, "earlier", ["TICKET-2"])
    assert key != request_key(span, None, ["TICKET-1"])
    assert key != request_key(span[:1], "earlier", ["TICKET-1"])


def test_usage_through_a_batch_adds_up_and_keeps_its_batch_part() -> None:
    live = SummarizerUsage(model="m", calls=1, input_tokens=100, output_tokens=10)
    batched = SummarizerUsage(model="m", calls=1, input_tokens=900, output_tokens=40
                              ).through_batch()
    both = live + batched
    assert (both.calls, both.input_tokens, both.output_tokens) == (2, 1000, 50)
    assert (both.batch_calls, both.batch_input_tokens, both.batch_output_tokens) == (1, 900, 40)
