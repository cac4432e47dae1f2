"""The cheap layers: clip-oversized, mask-tool-results, drop-thinking."""

from __future__ import annotations

from typing import Any

import pytest
from sessionfold.core.clip import CLIP_TAG, clip_oversized
from sessionfold.core.layers import (
    MASK_TAG,
    THINKING_PLACEHOLDER,
    drop_thinking,
    drop_thinking_item,
    mask_item,
    mask_tool_results,
)
from sessionfold.core.messages import Message, ToolResultBlock, parse_message
from sessionfold.core.tokens import TokenCounter, count_text
from sessionfold.core.window import WindowItem, items_from_messages

COUNTER = TokenCounter()


def output(lines: int, tag: str = "row") -> str:
    return "\n".join(f"{tag} {i}: value={i * 7} path=src/mod_{i}.py" for i in range(lines))


def result_message(text: str | list[dict[str, Any]], *, tool_id: str = "t1",
                   is_error: bool | None = None) -> Message:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id, "content": text}
    if is_error is not None:
        block["is_error"] = is_error
    return parse_message({"role": "user", "content": [block]})


def tool_result(message: Message, index: int = 0) -> ToolResultBlock:
    block = message.blocks()[index]
    assert isinstance(block, ToolResultBlock)
    return block


def item(message: Message, seq: int = 7) -> WindowItem:
    return WindowItem(start_seq=seq, end_seq=seq, message=message)


# --- clip-oversized ----------------------------------------------------------------------------

def test_an_oversized_tool_result_keeps_head_and_tail_and_names_size_and_seq() -> None:
    text = output(3000)
    original = item(result_message(text, is_error=True), seq=42)
    clipped = clip_oversized(original, None, 1000, COUNTER)
    block = tool_result(clipped.message)
    body = block.output_text()
    assert clipped.edits == ("clipped",)
    assert block.tool_use_id == "t1" and block.is_error is True
    assert count_text(body) <= 1000
    assert clipped.tokens == COUNTER.message(clipped.message)
    head, _, tail = body.partition(CLIP_TAG)
    tail = tail.split("]\n", 1)[1]
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) > 500 and len(tail) > 500  # both ends kept, not just a stub
    assert f"{len(text):,} characters in all" in body
    assert "ledger #42" in body
    assert CLIP_TAG in body


def test_clipping_is_idempotent_and_leaves_small_outputs_as_the_same_object() -> None:
    small = item(result_message(output(10)))
    assert clip_oversized(small, None, 1000, COUNTER) is small
    once = clip_oversized(item(result_message(output(3000))), None, 1000, COUNTER)
    assert clip_oversized(once, None, 1000, COUNTER) is once


def test_clipping_only_touches_the_oversized_block() -> None:
    text = output(3000)
    message = parse_message({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": "short"},
        {"type": "tool_result", "tool_use_id": "b", "content": text},
        {"type": "text", "text": "beside it"},
    ]})
    clipped = clip_oversized(message, 3, 500)
    assert clipped.to_json()["content"][0] == message.to_json()["content"][0]
    assert clipped.to_json()["content"][2] == message.to_json()["content"][2]
    assert CLIP_TAG in tool_result(clipped, 1).output_text()


def test_clipping_a_bare_message_needs_its_seq_and_keeps_image_parts() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}
    message = result_message([{"type": "text", "text": output(3000)}, image])
    with pytest.raises(ValueError, match="seq"):
        clip_oversized(message, None, 500)
    clipped = clip_oversized(message, 5, 500)
    content = tool_result(clipped).content
    assert isinstance(content, list)
    assert [p.type for p in content] == ["text", "image"]
    assert "ledger #5" in tool_result(clipped).output_text()


def test_clipping_dense_text_still_fits() -> None:
    # Few characters per token: a head of "4 characters per token" would be far too long.
    text = " ".join(f"{i:x}{i * 31:x}" for i in range(40_000))
    clipped = clip_oversized(result_message(text), 1, 800)
    assert count_text(tool_result(clipped).output_text()) <= 800


def test_summaries_and_assistant_messages_are_never_clipped() -> None:
    long_text = output(3000)
    assistant = item(Message(role="assistant", content=long_text))
    assert clip_oversized(assistant, None, 100, COUNTER) is assistant


# --- mask-tool-results -------------------------------------------------------------------------

def test_a_masked_stub_names_size_and_seq_and_keeps_id_and_error_flag() -> None:
    text = output(50)
    masked = mask_item(item(result_message(text, tool_id="abc", is_error=False), seq=9), COUNTER)
    block = tool_result(masked.message)
    assert masked.edits == ("masked",)
    assert block.tool_use_id == "abc" and block.is_error is False
    assert block.output_text().startswith(MASK_TAG)
    assert f"{len(text):,} characters" in block.output_text()
    assert "ledger #9" in block.output_text()
    assert masked.tokens is not None and masked.tokens < COUNTER.message(masked.message) + 1


def test_masking_is_idempotent_and_skips_outputs_not_worth_a_stub() -> None:
    masked = mask_item(item(result_message(output(50))), COUNTER)
    assert mask_item(masked, COUNTER) is masked
    short = item(result_message("ok"))
    assert mask_item(short, COUNTER) is short


def test_masking_a_clipped_output_names_the_size_of_its_ledger_original() -> None:
    text = output(3000)
    clipped = clip_oversized(item(result_message(text)), None, 1000, COUNTER)
    masked = mask_item(clipped, COUNTER, original=result_message(text))
    assert masked.edits == ("clipped", "masked")
    assert f"{len(text):,} characters" in tool_result(masked.message).output_text()


def test_without_its_original_a_clipped_output_is_masked_without_naming_a_size() -> None:
    clipped = clip_oversized(item(result_message(output(3000)), seq=4), None, 1000, COUNTER)
    stub = tool_result(mask_item(clipped, COUNTER).message).output_text()
    assert stub == f"{MASK_TAG} to save context; ledger #4 holds it whole.]"


def test_an_item_whose_edits_say_masked_is_not_masked_again() -> None:
    long_output = result_message(output(80))
    recorded = WindowItem(start_seq=2, end_seq=2, message=long_output, edits=("masked",))
    assert mask_item(recorded, COUNTER) is recorded


def test_a_clipped_item_too_large_for_a_smaller_limit_is_clipped_again_from_its_original() -> None:
    text = output(6000)
    once = clip_oversized(item(result_message(text), seq=3), None, 2000, COUNTER)
    again = clip_oversized(once, None, 500, COUNTER, original=result_message(text))
    body = tool_result(again.message).output_text()
    assert again.edits == ("clipped",) and count_text(body) <= 500
    assert f"{CLIP_TAG} {len(text):,} characters in all" in body
    assert body.startswith("row 0:") and body.rstrip().endswith(text.rsplit("\n", 1)[1])
    blind = tool_result(clip_oversized(once, None, 500, COUNTER).message).output_text()
    assert f"{CLIP_TAG} the characters between this head and tail" in blind


def test_mask_tool_results_goes_oldest_first_and_stops_once_enough_is_saved() -> None:
    messages = [result_message(output(60), tool_id=f"t{i}") for i in range(5)]
    items = items_from_messages(messages)
    one = COUNTER.message(messages[0]) - COUNTER.message(mask_item(items[0], COUNTER).message)
    passed = mask_tool_results(items, [3, 1, 0, 2], tokens_to_save=one + 1, counter=COUNTER)
    assert passed.changed == (0, 1)
    assert passed.saved > one
    assert passed.items[2] is items[2] and passed.items[4] is items[4]


def test_mask_tool_results_touches_only_the_positions_it_is_given() -> None:
    items = items_from_messages([result_message(output(60), tool_id=f"t{i}") for i in range(3)])
    passed = mask_tool_results(items, [1], tokens_to_save=10**9, counter=COUNTER)
    assert passed.changed == (1,)
    assert passed.items[0] is items[0] and passed.items[2] is items[2]


# --- drop-thinking -----------------------------------------------------------------------------

def thinking_message(*, with_text: bool) -> Message:
    blocks: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": "let me think " * 100, "signature": "sig"},
        {"type": "redacted_thinking", "data": "x" * 400},
    ]
    if with_text:
        blocks.append({"type": "text", "text": "the answer"})
    return parse_message({"role": "assistant", "content": blocks})


def test_drop_thinking_removes_thinking_blocks_and_nothing_else() -> None:
    dropped = drop_thinking_item(item(thinking_message(with_text=True)), COUNTER)
    assert dropped.edits == ("thinking-dropped",)
    assert dropped.message.to_json()["content"] == [{"type": "text", "text": "the answer"}]


def test_drop_thinking_never_empties_a_message() -> None:
    dropped = drop_thinking_item(item(thinking_message(with_text=False)), COUNTER)
    assert dropped.message.to_json()["content"] == [
        {"type": "text", "text": THINKING_PLACEHOLDER}]
    assert drop_thinking_item(dropped, COUNTER) is dropped


def test_drop_thinking_leaves_messages_without_thinking_alone() -> None:
    plain = item(Message(role="assistant", content="hello"))
    assert drop_thinking_item(plain, COUNTER) is plain
    items = [item(thinking_message(with_text=True), seq=0), plain]
    passed = drop_thinking(items, [1], tokens_to_save=10**9, counter=COUNTER)
    assert passed.changed == () and passed.items == items


def test_drop_thinking_never_thins_the_last_assistant_message_of_the_window() -> None:
    # With extended thinking the API refuses a final assistant message (the one the last
    # tool_result answers) that does not start with its thinking: no keep window may be
    # protecting it (keep_recent_turns=0), so the layer itself keeps it.
    def call(n: int) -> Message:
        return parse_message({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "let me think " * 100, "signature": "sig"},
            {"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {"command": "ls"}}]})

    messages = [Message(role="user", content="go")]
    for n in range(3):
        messages += [call(n), result_message("short", tool_id=f"t{n}")]
    items = items_from_messages(messages)
    passed = drop_thinking(items, range(len(items)), tokens_to_save=10**9, counter=COUNTER)
    assert passed.changed == (1, 3)
    assert passed.items[5] is items[5]
    assert passed.items[5].message.blocks()[0].type == "thinking"
