"""Turns, protection and foldable runs."""

from __future__ import annotations

from typing import Any

from sessionfold.core.frame import summary_message
from sessionfold.core.messages import Message, parse_message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.turns import foldable_runs, group_turns, protect, protection_refusals
from sessionfold.core.window import WindowItem, items_from_messages


def user(text: str) -> Message:
    return Message(role="user", content=text)


def call(n: int, text: str = "looking") -> Message:
    return parse_message({"role": "assistant", "content": [
        {"type": "text", "text": text},
        {"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {"command": f"ls {n}"}},
    ]})


def result(n: int, *, extra_text: str | None = None) -> Message:
    blocks: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": f"t{n}",
                                     "content": f"output {n}"}]
    if extra_text is not None:
        blocks.append({"type": "text", "text": extra_text})
    return parse_message({"role": "user", "content": blocks})


def answer(text: str = "done") -> Message:
    return Message(role="assistant", content=text)


def agent_run(steps: int) -> list[Message]:
    """One user request, then ``steps`` tool steps (the shape of a coding agent)."""
    out = [user("fix the bug in src/app.py")]
    for n in range(steps):
        out += [call(n), result(n)]
    return out


def spans(turns: Any) -> list[tuple[int, int]]:
    return [(t.start_seq, t.end_seq) for t in turns]


POLICY = FoldPolicy(budget_tokens=10_000)


def test_an_assistant_message_and_its_tool_results_are_one_turn() -> None:
    items = items_from_messages(agent_run(3))
    assert spans(group_turns(items)) == [(0, 0), (1, 2), (3, 4), (5, 6)]


def test_tool_results_beside_text_still_join_the_call_they_answer() -> None:
    items = items_from_messages([user("go"), call(0), result(0, extra_text="and also this"),
                                 answer()])
    assert spans(group_turns(items)) == [(0, 0), (1, 2), (3, 3)]


def test_a_plain_user_message_stands_alone_and_a_chat_answer_is_its_own_turn() -> None:
    items = items_from_messages([user("hi"), answer("hello"), user("how?"), answer("so")])
    assert spans(group_turns(items)) == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_a_summary_item_is_a_unit_of_its_own() -> None:
    summary = WindowItem(start_seq=1, end_seq=4, kind="summary", message=summary_message(
        "earlier", start_seq=1, end_seq=4, message_count=4, model="m"))
    items = [*items_from_messages([user("task")]), summary,
             *items_from_messages([call(5), result(5)], first_seq=5)]
    turns = group_turns(items)
    assert spans(turns) == [(0, 0), (1, 4), (5, 6)]
    assert [t.is_fold for t in turns] == [False, True, False]


def test_keep_window_counts_assistant_messages_not_user_requests() -> None:
    # One request and ten tool steps: counting user requests would protect everything.
    items = items_from_messages(agent_run(10))
    protection = protect(items, FoldPolicy(budget_tokens=10_000, keep_recent_turns=4))
    assert protection.keep_from_seq == 1 + 2 * 6  # the 4th assistant message from the end
    turns = group_turns(items)
    reasons = [protection.reason(t) for t in turns]
    assert reasons == ["first-user"] + [None] * 6 + ["inside-keep-window"] * 4


def test_keep_window_starts_at_the_question_a_kept_answer_replies_to() -> None:
    items = items_from_messages([user("task"), answer("a"), user("q1"), answer("a1"),
                                 user("q2"), answer("a2")])
    protection = protect(items, FoldPolicy(budget_tokens=10_000, keep_recent_turns=2))
    assert protection.keep_from_seq == 2


def test_fewer_assistant_messages_than_the_keep_window_protects_everything() -> None:
    items = items_from_messages(agent_run(2))
    protection = protect(items, FoldPolicy(budget_tokens=10_000, keep_recent_turns=4))
    assert foldable_runs(group_turns(items), protection) == []


def test_no_keep_window_when_keep_recent_turns_is_zero() -> None:
    items = items_from_messages(agent_run(3))
    protection = protect(items, FoldPolicy(budget_tokens=10_000, keep_recent_turns=0))
    assert protection.keep_from_seq is None
    assert spans(foldable_runs(group_turns(items), protection)[0].turns) == [
        (1, 2), (3, 4), (5, 6)]


def test_an_unanswered_tool_call_is_protected_even_outside_the_keep_window() -> None:
    items = items_from_messages([*agent_run(2), call(9)])
    protection = protect(items, FoldPolicy(budget_tokens=10_000, keep_recent_turns=0))
    turns = group_turns(items)
    assert spans(turns)[-1] == (5, 5)
    assert protection.reason(turns[-1]) == "unresolved-tool-call"
    assert turns[-1].unresolved_tool_use_ids() == ["t9"]


def test_the_first_user_message_is_protected_unless_the_policy_says_otherwise() -> None:
    items = items_from_messages(agent_run(6))
    turns = group_turns(items)
    assert protect(items, POLICY).reason(turns[0]) == "first-user"
    off = FoldPolicy(budget_tokens=10_000, keep_first_user=False)
    assert protect(items, off).reason(turns[0]) is None


def test_the_first_user_message_is_the_first_that_is_not_a_summary() -> None:
    summary = WindowItem(start_seq=0, end_seq=2, kind="summary", message=summary_message(
        "s", start_seq=0, end_seq=2, message_count=3, model="m"))
    items = [summary, *items_from_messages([user("task"), *agent_run(6)[1:]], first_seq=3)]
    protection = protect(items, POLICY)
    assert protection.first_user_seq == 3
    assert protection.reason(group_turns(items)[0]) is None


def test_the_task_is_the_first_user_message_that_says_something_of_its_own() -> None:
    # The log opens with the agent's own tool call (a `git status` before the human speaks):
    # the message answering it holds a tool's output, not the task.
    messages = [call(90), result(90), user("TASK: rotate the keys of ACCT-4242"), *agent_run(6)[1:]]
    items = items_from_messages(messages)
    turns = group_turns(items)
    protection = protect(items, POLICY)
    assert protection.first_user_seq == 2
    assert protection.reason(turns[0]) is None  # the bootstrap turn may be folded
    assert protection.reason(turns[1]) == "first-user"


def test_a_tool_result_beside_an_image_or_text_is_the_users_own_word() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}
    for extra in (image, {"type": "text", "text": "and here is the screenshot"}):
        answer_and_word = parse_message({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t90", "content": "ok"}, extra]})
        items = items_from_messages([call(90), answer_and_word, *agent_run(3)[1:]])
        assert protect(items, POLICY).first_user_seq == 1


def test_a_log_of_tool_results_only_protects_no_first_user_message() -> None:
    items = items_from_messages([msg for n in range(4) for msg in (call(n), result(n))])
    assert protect(items, POLICY).first_user_seq is None


def test_a_pinned_seq_protects_its_whole_turn() -> None:
    items = items_from_messages(agent_run(8))
    protection = protect(items, FoldPolicy(budget_tokens=10_000, keep_recent_turns=2),
                         pinned={6})  # the tool_result of step 2 pins the call too
    turns = group_turns(items)
    pinned = [t for t in turns if protection.reason(t) == "pinned"]
    assert spans(pinned) == [(5, 6)]
    assert [spans(r.turns) for r in foldable_runs(turns, protection)] == [
        [(1, 2), (3, 4)], [(7, 8), (9, 10), (11, 12)]]


def test_runs_are_oldest_first_and_a_leading_summary_heads_its_run() -> None:
    summary = WindowItem(start_seq=1, end_seq=4, kind="summary", message=summary_message(
        "s", start_seq=1, end_seq=4, message_count=4, model="m"))
    rest = items_from_messages([c for n in range(5, 11) for c in (call(n), result(n))],
                               first_seq=5)
    items = [*items_from_messages([user("task")]), summary, *rest]
    runs = foldable_runs(group_turns(items), protect(items, POLICY))
    assert len(runs) == 1
    assert runs[0].head is not None and runs[0].head.start_seq == 1
    assert spans(runs[0].body) == [(5, 6), (7, 8)]


def test_a_run_that_is_only_an_earlier_summary_has_an_empty_body() -> None:
    summary = WindowItem(start_seq=1, end_seq=4, kind="summary", message=summary_message(
        "s", start_seq=1, end_seq=4, message_count=4, model="m"))
    rest = items_from_messages([c for n in range(5, 9) for c in (call(n), result(n))],
                               first_seq=5)
    items = [*items_from_messages([user("task")]), summary, *rest]
    runs = foldable_runs(group_turns(items), protect(items, POLICY))
    assert len(runs) == 1 and runs[0].body == ()


def test_protection_refusals_merge_neighbouring_turns_with_the_same_reason() -> None:
    items = items_from_messages(agent_run(6))
    policy = FoldPolicy(budget_tokens=10_000, keep_recent_turns=3)
    turns = group_turns(items)
    refusals = protection_refusals(turns, protect(items, policy))
    assert [(r.reason, r.start_seq, r.end_seq) for r in refusals] == [
        ("first-user", 0, 0), ("inside-keep-window", 7, 12)]
