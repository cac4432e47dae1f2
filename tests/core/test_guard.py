"""The pre-send guard's stages on window items (no store, no client): the best shrink is what
goes out, the protected turns are clipped oldest first and the newest last, the older history
can be left as a notice, and the cut stays put for several calls."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from sessionfold.core.guard import MIN_CLIP_TOKENS, guard_window
from sessionfold.core.messages import Message, parse_message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import Calibration, TokenCounter
from sessionfold.core.window import WindowItem, items_from_messages

COUNTER = TokenCounter()
NO_CALIBRATION = Calibration()


def output(n: int, lines: int) -> str:
    return "\n".join(f"line {j} of file_{n}.py: total={j * n}" for j in range(lines))


def step(n: int, lines: int = 60, thought: str = "") -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": [
            {"type": "text", "text": thought or f"THOUGHT: read file_{n}.py"},
            {"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {"cmd": f"cat {n}"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{n}", "content": output(n, lines)}]},
    ]


def window(*steps: list[dict[str, Any]]) -> list[WindowItem]:
    raw: list[dict[str, Any]] = [{"role": "user", "content": "Fix the totals in the report."}]
    for s in steps:
        raw += s
    messages: list[Message] = [parse_message(m, i) for i, m in enumerate(raw)]
    return items_from_messages(messages)


def size(items: list[WindowItem]) -> int:
    return sum(COUNTER.message(i.message) for i in items)


def guard(items: list[WindowItem], policy: FoldPolicy, **kwargs: Any) -> Any:
    return guard_window(items, policy, NO_CALIBRATION, system_tokens=0, counter=COUNTER,
                        **kwargs)


def test_a_request_the_cheap_layers_cannot_bring_under_goes_out_as_their_best_shrink() -> None:
    # Old outputs to mask, and kept turns that alone are over the line (each output just
    # under the quarter of the budget that clip-oversized allows an item).
    items = window(*(step(n) for n in range(6)), *(step(n, 145) for n in range(6, 10)))
    policy = FoldPolicy(budget_tokens=8000, keep_recent_turns=4)
    result = guard(items, policy, last_stage="cheap")
    assert result.outcome == "over-budget"
    assert result.tokens_before > result.tokens_after > policy.guard_tokens
    assert result.items != items and size(result.items) < size(items)
    assert "mask-tool-results" in result.layers


def test_protected_outputs_are_clipped_oldest_first_until_the_request_fits() -> None:
    items = window(*(step(n) for n in range(4)), *(step(n, 145) for n in range(4, 8)))
    policy = FoldPolicy(budget_tokens=8000, keep_recent_turns=4)
    result = guard(items, policy)
    assert result.outcome == "guarded" and result.tokens_after <= policy.guard_tokens
    assert "clip-protected" in result.layers
    clipped = [i.start_seq for i in result.items if "clipped" in i.edits]
    newest = result.items[-1]
    # The oldest kept output was clipped; the newest one, clipped last, was not needed.
    assert clipped and min(clipped) < newest.start_seq
    assert "clipped" not in newest.edits and newest == items[-1]


def test_the_newest_output_is_clipped_last_when_nothing_older_is_enough() -> None:
    items = window(step(0, 20), step(1, 20), step(2, 900))
    policy = FoldPolicy(budget_tokens=4000, keep_recent_turns=3)
    result = guard(items, policy)
    assert result.outcome == "guarded" and result.tokens_after <= policy.guard_tokens
    assert "clipped" in result.items[-1].edits
    assert COUNTER.message(result.items[-1].message) >= MIN_CLIP_TOKENS // 2


def test_a_reply_larger_than_the_budget_goes_out_clipped_on_the_request_alone() -> None:
    # A model that wrote a 12k-token thought: its own words are clipped last, and only here.
    huge = "THOUGHT: " + " ".join(f"word{n}" for n in range(6000))
    items = window(step(0), step(1, 20, thought=huge))
    policy = FoldPolicy(budget_tokens=4000, keep_recent_turns=2)
    result = guard(items, policy)
    assert result.outcome == "guarded" and result.tokens_after <= policy.guard_tokens
    reply = result.items[3]
    assert "clipped" in reply.edits and reply.message.role == "assistant"
    text = reply.message.text()
    assert text.startswith("THOUGHT: word0") and "ledger #3 holds the whole message" in text
    assert [b.type for b in reply.message.blocks()] == ["text", "tool_use"]  # the call stays
    assert items[3].edits == ()  # the items given are untouched


def test_what_no_stage_may_shrink_is_over_budget_with_the_largest_item_named() -> None:
    # Thinking is never cut (its signature would fail): a reply whose thinking alone is over
    # the budget cannot be sent under it.
    thinking = {"type": "thinking", "thinking": " ".join(f"idea{n}" for n in range(6000)),
                "signature": "sig"}
    last = step(1, 20)
    last[0]["content"].insert(0, thinking)
    items = window(step(0), last)
    policy = FoldPolicy(budget_tokens=4000, keep_recent_turns=2)
    result = guard(items, policy, last_stage="drop-history")
    assert result.outcome == "over-budget"
    assert result.largest_seq == 3 and result.largest_tokens > policy.budget_tokens


def test_drop_history_leaves_the_older_history_as_one_notice_on_the_request() -> None:
    # Long thoughts in the history: nothing to mask, nothing protected to clip.
    thought = "THOUGHT: " + " ".join(f"idea{n}" for n in range(700))
    items = window(*(step(n, 5, thought=thought) for n in range(8)), step(8, 5), step(9, 5))
    policy = FoldPolicy(budget_tokens=6000, keep_recent_turns=2)
    assert guard(items, policy).outcome == "over-budget"
    result = guard(items, policy, last_stage="drop-history")
    assert result.outcome == "guarded" and "drop-history" in result.layers
    notices = [i for i in result.items if i.kind == "notice"]
    assert len(notices) == 1 and notices[0].start_seq == 1
    assert result.items[0] == items[0]  # the task stays


def test_the_cut_stays_put_while_turns_leave_the_kept_ones() -> None:
    # Between two moves of the cut the guarded requests only grow at their end: each one's
    # items are the previous one's plus what was appended (its cached prefix holds).
    policy = FoldPolicy(budget_tokens=6000, keep_recent_turns=4)
    shrunk = []
    for steps in range(12, 24):
        result = guard(window(*(step(n, 40) for n in range(steps))), policy)
        assert result.outcome == "guarded"
        shrunk.append(result.items)
    extended = sum(later[:len(earlier)] == earlier for earlier, later in pairwise(shrunk))
    # The plain cut (the last four turns kept) moves on every call: never an extension.
    assert extended >= len(shrunk) // 2


def test_a_clipped_reply_stays_the_same_bytes_while_the_window_grows() -> None:
    # A reply of ~40k tokens in the protected turns of a 64k session (one agent wrote a
    # 200k-character answer): every request after it must carry it clipped, and the clip must
    # not move with each call, or each call writes the cache again from that reply on.
    thought = "THOUGHT: " + " ".join(f"consider option_{k} of the estimator" for k in range(8000))
    policy = FoldPolicy(budget_tokens=64_000, keep_recent_turns=4)
    steps = [step(0), step(1, thought=thought)]
    sent = []
    for n in range(2, 5):  # while the reply is inside the four protected turns
        steps.append(step(n, lines=150))  # the window grows by ~2k tokens a call
        result = guard(window(*steps), policy)
        assert result.outcome == "guarded" and result.tokens_after <= policy.guard_tokens
        sent.append(result.items[3])  # the reply of step 1, as each request carries it
    assert all(item == sent[0] for item in sent), "the clip moved"
    assert size([sent[0]]) <= policy.max_item_tokens
