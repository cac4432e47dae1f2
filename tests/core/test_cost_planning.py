"""Cost-aware planning: fold_window priced with the cost model (policy economics="dollars").

A shallow fold that would not pay for its cache break is refused as ``would-not-pay`` with the
figures in the record; a deep one is taken, every layer in one rewrite; ``economics="window"``
plans exactly as before; the budget (an overflow, a window about to pass it) always wins.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sessionfold.core.compact import FoldResult, FoldVisit, fold_window
from sessionfold.core.economics import (
    FoldEconomics,
    FoldShape,
    ceiling_tokens,
    decide,
    next_trigger_tokens,
    opening_trigger_tokens,
)
from sessionfold.core.errors import InvalidPolicyError
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.core.messages import Message, parse_message
from sessionfold.core.planner import Planner
from sessionfold.core.policy import FoldPolicy, LayerName
from sessionfold.core.prices import DEFAULT_PRICES
from sessionfold.core.summarizers import ExtractiveSummarizer
from sessionfold.core.tokens import TokenCounter
from sessionfold.core.window import Trigger, WindowItem, items_from_messages

COUNTER = TokenCounter()
PRICING = FoldPricing(agent=DEFAULT_PRICES["claude-sonnet-4-5"],
                      summarizer=DEFAULT_PRICES["claude-haiku-4-5"])
WARM = FoldEconomics(PRICING)
COLD = FoldEconomics(PRICING, cold=True)
MASK_ONLY: tuple[LayerName, ...] = ("mask-tool-results",)
SUMMARIZE: tuple[LayerName, ...] = ("mask-tool-results", "summarize")


def step(n: int, words: int = 300, lines: int = 25) -> list[Message]:
    """One tool step whose reasoning (not maskable) outweighs its tool output (maskable)."""
    text = " ".join(f"reasoning{n}w{i}" for i in range(words))
    out = "\n".join(f"line {i} of step {n}: src/mod_{n}.py" for i in range(lines))
    return [
        parse_message({"role": "assistant", "content": [
            {"type": "text", "text": text},
            {"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {"command": f"ls {n}"}},
        ]}),
        parse_message({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{n}", "content": out},
        ]}),
    ]


def window(steps: int = 40, **kw: int) -> list[WindowItem]:
    task = Message(role="user", content="Fix TICKET-1 in src/app.py")
    return items_from_messages([task, *(m for n in range(1, steps + 1) for m in step(n, **kw))])


ITEMS = window()
SIZE = sum(COUNTER.message(i.message) for i in ITEMS)


def policy(layers: Sequence[LayerName], *, over: float = 0.86, **kw: object) -> FoldPolicy:
    """A policy whose trigger the window is just past (the window is ``over`` × the budget)."""
    return FoldPolicy.model_validate({"budget_tokens": int(SIZE / over),
                                      "layers": tuple(layers), **kw})


def visit(items: Sequence[WindowItem], pol: FoldPolicy, *, trigger: Trigger = "threshold",
          economics: FoldEconomics | None = WARM, force: bool = False) -> FoldResult:
    return fold_window(items, FoldVisit(
            pol, ExtractiveSummarizer(), counter=COUNTER, trigger=trigger,
            economics=economics, force=force))


# --- a shallow fold is refused, a deep one taken --------------------------------------------------

def test_a_shallow_fold_that_would_not_pay_is_refused_with_its_figures_in_the_record() -> None:
    result = visit(ITEMS, policy(MASK_ONLY))
    record = result.record
    assert not result.changed and result.window == ITEMS
    assert record.outcome == "refused"
    refusal = next(r for r in record.refusals if r.reason == "would-not-pay")
    assert refusal.start_seq == 1 and refusal.detail.startswith("would-not-pay: folding the")
    figures = record.economics
    assert figures is not None and figures["why"] == "would-not-pay" and not figures["fold"]
    assert figures["saving_now"] < 0 and figures["window_tokens"] == SIZE
    (only,) = figures["candidates"]
    assert only["label"] == "cheap-layers" and only["summary_tokens"] == 0
    # Masking leaves most of the window (the reasoning is not maskable): a shallow fold, whose
    # best time is later, close to the budget.
    assert SIZE - only["target_tokens"] < 0.25 * SIZE
    assert only["trigger_tokens"] > SIZE
    assert f"{-figures['saving_now']:.3g}" in refusal.detail and record.detail == refusal.detail


def test_a_deep_fold_is_taken_below_the_policys_target_in_one_rewrite() -> None:
    pol = policy(SUMMARIZE)
    result = visit(ITEMS, pol)
    record = result.record
    assert record.outcome == "folded"
    figures = record.economics
    assert figures is not None and figures["fold"] and figures["why"] in ("pays", "ceiling")
    assert figures["chosen"]["label"] == "summarize"
    # Deeper than the policy's target, and the window lands there: one summary span, the
    # cheap layers' masking in the same edit (one cache break, not one per layer).
    assert record.target_tokens == figures["chosen"]["target_tokens"] < pol.target_tokens
    assert record.tokens_after <= record.target_tokens
    assert len(result.spans) == 1 and record.layers_run == ("mask-tool-results", "summarize")
    assert not any(r.reason == "would-not-pay" for r in record.refusals)
    assert record.detail == (f"{figures['why']}: " + record.detail.split(": ", 1)[1])


def test_dollars_fold_deeper_than_the_window_economics_for_the_same_visit() -> None:
    dollars = visit(ITEMS, policy(SUMMARIZE)).record
    windowed = visit(ITEMS, policy(SUMMARIZE, economics="window")).record
    assert windowed.outcome == dollars.outcome == "folded"
    assert dollars.tokens_after < windowed.tokens_after <= windowed.target_tokens


@pytest.mark.parametrize("layers", [SUMMARIZE, ("mask-tool-results", "drop-thinking",
                                                 "summarize")])
def test_a_priced_visit_masks_each_item_once_and_plans_what_it_planned_without_the_memo(
        layers: tuple[LayerName, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    # The dry run that prices the visit masks every foldable output; the real pass reuses what
    # it made (the visit's layer memo) instead of masking again, and lands on the same window.
    layers_module = importlib.import_module("sessionfold.core.layers")

    calls: list[int] = []
    real_mask = layers_module.mask_item

    def counting(item: WindowItem, *args: object, **kw: object) -> WindowItem:
        calls.append(item.start_seq)
        return real_mask(item, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(layers_module, "mask_item", counting)
    pol = policy(layers)
    with_memo = visit(ITEMS, pol)
    assert with_memo.record.outcome == "folded"
    assert calls and len(calls) == len(set(calls))  # no item masked twice

    class Forgetful(dict[int, tuple[WindowItem, WindowItem]]):
        def __setitem__(self, key: int, value: tuple[WindowItem, WindowItem]) -> None:
            pass  # remembers nothing: every pass masks afresh

    monkeypatch.setattr(Planner, "cheap_layer", _forgetting(Planner.cheap_layer, Forgetful))
    calls.clear()
    without = visit(ITEMS, pol)
    assert len(calls) > len(set(calls))  # the dry run and the real pass both masked
    assert without.window == with_memo.window and without.record == with_memo.record


def _forgetting(cheap_layer: object, memo_type: type) -> object:
    def run(self: object, name: str) -> None:
        self.memos[name] = memo_type()  # type: ignore[attr-defined]
        cheap_layer(self, name)  # type: ignore[operator]
    return run


# --- "window" economics: the old planner, exactly ---------------------------------------------

@pytest.mark.parametrize("over", [0.8, 0.86, 0.95, 1.1])
@pytest.mark.parametrize("layers", [MASK_ONLY, SUMMARIZE,
                                    ("mask-tool-results", "drop-thinking", "drop-oldest")])
def test_window_economics_plans_exactly_as_an_unpriced_visit(
        over: float, layers: tuple[LayerName, ...]) -> None:
    pol = policy(layers, over=over, economics="window")
    priced = visit(ITEMS, pol, economics=COLD)
    unpriced = visit(ITEMS, pol, economics=None)
    assert priced.record == unpriced.record and priced.record.economics is None
    assert priced.window == unpriced.window and priced.edit == unpriced.edit
    # ... and what an unpriced visit does is what it did before the knob: the dollars
    # default without prices given plans the same visit.
    default = visit(ITEMS, policy(layers, over=over), economics=None)
    assert default.window == unpriced.window
    assert default.record.model_dump(exclude={"economics"}) == \
        unpriced.record.model_dump(exclude={"economics"})


# --- the budget wins over dollars -------------------------------------------------------------

def test_an_overflow_is_never_refused_for_cost() -> None:
    pol = policy(MASK_ONLY)
    assert visit(ITEMS, pol).record.outcome == "refused"  # the same visit, in the background
    inline = visit(ITEMS, pol, trigger="overflow", force=True, economics=WARM)
    assert inline.record.outcome == "folded" and inline.record.economics is None
    assert not any(r.reason == "would-not-pay" for r in inline.record.refusals)


def test_a_window_about_to_pass_the_budget_folds_however_little_it_pays() -> None:
    # 99% of the budget: the call after next would pass it, so the fold cannot wait.
    pol = policy(MASK_ONLY, over=0.99)
    record = visit(ITEMS, pol).record
    assert record.outcome == "folded" and record.economics is not None
    assert record.economics["why"] == "ceiling"
    assert record.tokens_after < record.measured_tokens


def test_the_ceiling_leaves_one_call_of_growth_under_the_guard_but_never_below_the_trigger(
        ) -> None:
    # The guard's line is 95 % of the budget: a request past it is sent with the cheap layers
    # applied to it alone (a cache break), so the fold must land before it.
    pol = FoldPolicy(budget_tokens=64_000)
    assert pol.guard_tokens == 60_800
    assert ceiling_tokens(pol, 1000) == 59_800
    assert ceiling_tokens(pol, 20_000) == pol.trigger_tokens == 54_400
    # Without the guard the budget itself is the line.
    unguarded = FoldPolicy(budget_tokens=64_000, guard=False)
    assert ceiling_tokens(unguarded, 1000) == 63_000
    assert ceiling_tokens(unguarded, 20_000) == 54_400


def test_only_options_at_or_under_the_policys_target_are_offered_when_one_reaches_it() -> None:
    pol = FoldPolicy(budget_tokens=64_000)  # target 38,400
    shape = FoldShape(window_tokens=55_000, head_tokens=2000, growth_tokens=1000,
                      cheap_tokens=45_000, folded_tokens=12_000, summary_tokens=3200,
                      summarized_fraction=0.8)
    choice = decide(pol, WARM, shape)
    assert choice is not None and [c.option.label for c in choice.candidates] == ["summarize"]
    # Nothing reaches the target: the deepest fold there is.
    shallow = FoldShape(window_tokens=55_000, head_tokens=2000, growth_tokens=1000,
                        cheap_tokens=45_000)
    choice = decide(pol, WARM, shallow)
    assert choice is not None and choice.option.target_tokens == 45_000
    assert decide(pol, WARM, FoldShape(window_tokens=55_000, head_tokens=0,
                                       growth_tokens=1000)) is None


# --- idle visits: the cache is cold anyway ------------------------------------------------------

def test_an_idle_visit_under_the_trigger_folds_when_the_cold_cache_makes_it_pay() -> None:
    pol = policy(MASK_ONLY, over=0.7)  # under the 0.85 trigger, over the 0.5 idle trigger
    assert pol.trigger_tokens >= SIZE and pol.over_idle_trigger(SIZE)
    assert visit(ITEMS, pol).record.outcome == "nothing-to-fold"  # not due in the background
    idle = visit(ITEMS, pol, trigger="idle", economics=COLD).record
    assert idle.outcome == "folded" and idle.trigger == "idle"
    assert idle.economics is not None and idle.economics["cold"]
    assert idle.economics["why"] == "pays"
    # The same shallow fold with a warm cache would not pay.
    warm = visit(ITEMS, pol, trigger="idle", economics=WARM).record
    assert warm.outcome == "refused" and warm.economics is not None
    assert warm.economics["why"] == "would-not-pay"


def test_an_idle_visit_under_the_idle_trigger_changes_nothing() -> None:
    pol = policy(SUMMARIZE, over=0.4)
    record = visit(ITEMS, pol, trigger="idle", economics=COLD).record
    assert record.outcome == "nothing-to-fold" and "idle trigger" in record.detail
    # Window economics knows no idle trigger: an idle visit is judged by the trigger.
    windowed = visit(ITEMS, policy(SUMMARIZE, over=0.7, economics="window"), trigger="idle",
                     economics=COLD).record
    assert windowed.outcome == "nothing-to-fold" and "the trigger of" in windowed.detail


# --- when the next visit comes ------------------------------------------------------------------

def test_a_deep_fold_sets_the_next_visit_where_its_cycle_is_cheapest_under_the_policys_trigger(
) -> None:
    pol = policy(SUMMARIZE)  # budget ~73k: trigger-to-target is far longer than pays
    record = visit(ITEMS, pol).record
    assert record.outcome == "folded" and record.economics is not None
    chosen = record.economics["chosen"]
    assert chosen["trigger_tokens"] > chosen["target_tokens"]
    nxt = next_trigger_tokens(pol, record)
    assert nxt == math.ceil(chosen["trigger_tokens"])
    assert record.tokens_after < nxt < pol.trigger_tokens


def test_a_visit_at_the_lowered_trigger_is_priced_too_early_refused_and_waits_for_the_optimum(
) -> None:
    pol = policy(SUMMARIZE)
    short = window(steps=12)  # far under the policy's trigger
    size = sum(COUNTER.message(i.message) for i in short)
    assert size < pol.trigger_tokens
    # Unpriced, a lowered trigger means nothing: the policy's trigger gates.
    unpriced = fold_window(short, FoldVisit(pol, ExtractiveSummarizer(), counter=COUNTER,
                           trigger="threshold", trigger_tokens=1000))
    assert unpriced.record.outcome == "nothing-to-fold" and not unpriced.changed
    assert f"the trigger of {pol.trigger_tokens}" in unpriced.record.detail
    # Priced, the visit runs; folding this early costs more than it saves.
    early = fold_window(short, FoldVisit(pol, ExtractiveSummarizer(), counter=COUNTER,
                        trigger="threshold", economics=WARM, trigger_tokens=1000))
    assert early.record.outcome == "refused" and not early.changed
    assert early.record.economics is not None
    assert early.record.economics["why"] == "would-not-pay"
    nxt = next_trigger_tokens(pol, early.record)
    assert nxt is not None and early.record.measured_tokens < nxt <= pol.trigger_tokens
    assert nxt == min(pol.trigger_tokens,
                      math.ceil(early.record.economics["chosen"]["trigger_tokens"]))
    # Past that size the same visit pays.
    grown = window(steps=40)
    later = fold_window(grown, FoldVisit(
            pol, ExtractiveSummarizer(), counter=COUNTER, trigger="threshold",
            economics=WARM, trigger_tokens=nxt))
    assert later.record.outcome == "folded"
    assert later.record.economics is not None and later.record.economics["why"] == "pays"


def test_the_next_trigger_is_the_policys_unless_a_priced_visit_set_it_and_none_after_a_lost_race(
) -> None:
    pol = policy(SUMMARIZE)
    folded = visit(ITEMS, pol).record
    assert next_trigger_tokens(pol, folded) != pol.trigger_tokens
    window_pol = pol.model_copy(update={"economics": "window"})
    assert next_trigger_tokens(window_pol, folded) == pol.trigger_tokens
    unpriced = visit(ITEMS, pol, economics=None).record
    assert unpriced.economics is None
    assert next_trigger_tokens(pol, unpriced) == pol.trigger_tokens
    assert next_trigger_tokens(pol, folded.as_stale("claimed again")) is None
    # Figures that do not parse fall back to the policy's trigger (a record is data).
    broken = folded.model_copy(update={"economics": {"why": "pays", "chosen": {}}})
    assert next_trigger_tokens(pol, broken) == pol.trigger_tokens
    at_target = folded.model_copy(update={"economics": {**folded.economics, "why": "at-target"}})
    assert next_trigger_tokens(pol, at_target) == pol.trigger_tokens


def test_a_priced_session_is_first_visited_at_half_its_target_and_a_window_one_at_its_trigger(
) -> None:
    pol = FoldPolicy(budget_tokens=64_000)
    assert opening_trigger_tokens(pol) == pol.target_tokens // 2 == 19_200
    windowed = pol.model_copy(update={"economics": "window"})
    assert opening_trigger_tokens(windowed) == windowed.trigger_tokens == 54_400
    # The first visit is priced: a deep fold that pays is taken there, long before the
    # policy's trigger (the window, ~63k, is its cost-optimal trigger's 1.6x).
    big = policy(SUMMARIZE, over=0.62)  # the window is just past the target
    assert big.target_tokens < SIZE < big.trigger_tokens
    first = fold_window(ITEMS, FoldVisit(
            big, ExtractiveSummarizer(), counter=COUNTER, trigger="threshold",
            economics=WARM, trigger_tokens=opening_trigger_tokens(big)))
    assert first.record.outcome == "folded" and first.record.economics is not None
    assert first.record.economics["why"] == "pays"
    assert first.record.economics["chosen"]["trigger_tokens"] < SIZE
    # Without the opening trigger the same visit would wait.
    assert fold_window(ITEMS, FoldVisit(big, ExtractiveSummarizer(), counter=COUNTER,
                       trigger="threshold", economics=WARM)).record.outcome == "nothing-to-fold"


def test_a_priced_visit_with_nothing_to_fold_yet_probes_again_at_twice_its_window() -> None:
    # A young session: the task and the protected recent turns, nothing foldable.
    young = ITEMS[:5]
    size = sum(COUNTER.message(i.message) for i in young)
    pol = FoldPolicy(budget_tokens=size * 8, layers=SUMMARIZE)
    assert 2 * size < pol.target_tokens
    result = fold_window(young, FoldVisit(pol, ExtractiveSummarizer(), counter=COUNTER,
                         trigger="threshold", economics=WARM, trigger_tokens=size // 2))
    record = result.record
    assert result.edit.empty and record.outcome == "nothing-to-fold"
    assert record.economics == {"why": "nothing-to-price", "fold": False,
                                "window_tokens": record.measured_tokens}
    assert next_trigger_tokens(pol, record) == 2 * record.measured_tokens
    # Never past the target (then the policy's trigger, as for any visit with no figures).
    near = record.model_copy(update={"measured_tokens": pol.target_tokens - 10})
    assert next_trigger_tokens(pol, near) == pol.target_tokens
    past = record.model_copy(update={"measured_tokens": pol.target_tokens})
    assert next_trigger_tokens(pol, past) == pol.trigger_tokens
    # The same visit unpriced (no prices) has no figures, and waits for the policy's trigger.
    unpriced = fold_window(young, FoldVisit(pol, ExtractiveSummarizer(), counter=COUNTER,
                           trigger="threshold", trigger_tokens=size // 2)).record
    assert unpriced.economics is None
    assert next_trigger_tokens(pol, unpriced) == pol.trigger_tokens


@given(after=st.integers(0, 200_000), growth=st.floats(0, 1e6), why=st.sampled_from(
    ["pays", "ceiling", "would-not-pay"]))
@settings(max_examples=200, deadline=None)
def test_the_next_trigger_is_never_above_the_policys_and_always_above_what_the_visit_left(
        after: int, growth: float, why: str) -> None:
    pol = FoldPolicy(budget_tokens=64_000)
    record = visit(ITEMS, policy(SUMMARIZE)).record.model_copy(update={
        "tokens_after": after, "measured_tokens": after, "outcome": "folded",
        "economics": {"why": why, "chosen": {"target_tokens": 10_000,
                                             "trigger_tokens": 10_000 + growth}}})
    nxt = next_trigger_tokens(pol, record)
    assert nxt is not None and nxt <= pol.trigger_tokens
    assert nxt > after or nxt == pol.trigger_tokens


# --- the knob --------------------------------------------------------------------------------

def test_the_economics_knob_and_idle_ratio_are_validated_like_the_other_fields() -> None:
    assert FoldPolicy(budget_tokens=10_000).economics == "dollars"
    with pytest.raises(InvalidPolicyError, match=r"economics: .*'dollars'.*got 'cheap'"):
        FoldPolicy.model_validate({"budget_tokens": 10_000, "economics": "cheap"})
    with pytest.raises(InvalidPolicyError, match=r"idle_trigger_ratio must be in \(0, 1\]"):
        FoldPolicy(budget_tokens=10_000, idle_trigger_ratio=0)
    assert FoldPolicy(budget_tokens=10_000, idle_trigger_ratio=None).idle_trigger_tokens is None
    assert FoldPolicy(budget_tokens=10_000, economics="window").idle_trigger_tokens is None
    # Never above the trigger: past it a visit is due anyway.
    assert FoldPolicy(budget_tokens=10_000, idle_trigger_ratio=1).idle_trigger_tokens == 8500


# --- invariants -----------------------------------------------------------------------------

@settings(max_examples=40, deadline=None, database=None)
@given(steps=st.integers(6, 30), lines=st.integers(2, 60), words=st.integers(20, 300),
       over=st.floats(0.86, 1.3), summarize=st.booleans(), cold=st.booleans())
def test_a_refusal_for_cost_changes_nothing_and_a_window_past_the_budget_is_never_refused(
        steps: int, lines: int, words: int, over: float, summarize: bool, cold: bool) -> None:
    items = window(steps, words=words, lines=lines)
    size = sum(COUNTER.message(i.message) for i in items)
    pol = FoldPolicy(budget_tokens=max(1000, int(size / over)),
                     layers=SUMMARIZE if summarize else MASK_ONLY)
    result = visit(items, pol, economics=COLD if cold else WARM)
    refused = [r for r in result.record.refusals if r.reason == "would-not-pay"]
    if refused:
        assert not result.changed and result.window == list(items)
        assert result.record.outcome == "refused" and result.spans == []
        assert result.record.economics is not None and not result.record.economics["fold"]
    if pol.over_budget(result.record.measured_tokens):
        assert not refused


def _planner(items: Sequence[WindowItem], pol: FoldPolicy) -> Planner:
    from sessionfold.core.sizes import Sizes
    from sessionfold.core.turns import protect
    total = float(sum(COUNTER.message(i.message) for i in items))
    planner = Planner(items=list(items), policy=pol, summarizer=None, sizes=Sizes(COUNTER),
                      target=0, slope=1.0, current=total, force=False, pinned=(), latched=())
    planner.protection = protect(planner.items, pol, turns=planner.turns())
    return planner


def test_a_fold_that_brings_the_recall_tool_prices_the_whole_prompt_as_rewritten() -> None:
    # Nothing is out of sight yet: the first stub or summary brings the recall tool, and the
    # tools lead the prompt, so no part of the window stays cached across that fold.
    pol = policy(SUMMARIZE)
    assert _planner(ITEMS, pol).head_tokens() == 0
    # Recall off, or the tool offered from the first request: the task and system stay cached.
    assert _planner(ITEMS, policy(SUMMARIZE, recall=False)).head_tokens() > 0
    assert _planner(ITEMS, policy(SUMMARIZE, recall_offer="always")).head_tokens() > 0
    # Once something is out of sight the tool already rides on every request.
    folded = visit(ITEMS, pol, force=True, economics=None)
    assert folded.record.outcome == "folded"
    assert _planner(folded.window, pol).head_tokens() > 0


def test_a_cheap_fold_of_a_short_session_without_recall_yet_is_refused_as_not_paying() -> None:
    """A customer-service session (a long system prompt of rules) with one large output:
    masking it would rewrite the whole prompt, system included (the recall tool comes with the
    stub), to save a few reads over the calls it has left; priced so, it does not pay."""
    system = " ".join(f"rule{n}: never change a basic-economy flight {n}." for n in range(150))
    big = "\n".join(f"flight HAT{n:03d} 2024-05-{n % 28 + 1:02d} seats {n}" for n in range(120))
    msgs = [Message(role="user", content="Change the flight of reservation ZFA04Y.")]
    for n in range(1, 6):
        msgs += [
            parse_message({"role": "assistant", "content": [
                {"type": "text", "text": f"Looking up step {n}."},
                {"type": "tool_use", "id": f"t{n}", "name": "search", "input": {"n": n}}]}),
            parse_message({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"t{n}",
                 "content": big if n == 2 else f"result {n}"}]}),
        ]

    def priced(pol: FoldPolicy) -> FoldResult:
        return fold_window(items_from_messages(msgs), FoldVisit(
            pol, None, system=system, counter=COUNTER, trigger="threshold", trigger_tokens=2000,
            economics=FoldEconomics(PRICING, remaining_calls=8)))

    pol = FoldPolicy(budget_tokens=16_000, layers=MASK_ONLY, keep_recent_turns=2)
    result = priced(pol)
    assert result.record.outcome == "refused", result.record.economics
    assert result.record.economics and result.record.economics["why"] == "would-not-pay"
    # With the tool on every request already (recall_offer="always") the system prompt and
    # the task stay cached across the same mask, and it pays.
    result = priced(pol.model_copy(update={"recall_offer": "always"}))
    assert result.record.outcome == "folded", result.record.economics
