"""clip-oversized clips a user's own text like a tool output: head and tail, size and seq named."""

from __future__ import annotations

from sessionfold.core.clip import CLIP_TAG, TEXT_CLIP_TAG, clip_oversized
from sessionfold.core.messages import Message, TextBlock, ToolResultBlock
from sessionfold.core.tokens import default_counter
from sessionfold.core.window import WindowItem

COUNTER = default_counter()
TASK = ("TASK: port the billing service to the new ledger API.\n"
        + "\n".join(f"requirement {i}: keep invoice {i} balanced" for i in range(4000))
        + "\nDONE WHEN: every invoice test passes.")


def item(message: Message, seq: int = 0) -> WindowItem:
    return WindowItem(start_seq=seq, end_seq=seq, message=message)


def test_an_oversized_task_keeps_its_head_and_tail_and_names_size_and_seq() -> None:
    clipped = clip_oversized(item(Message(role="user", content=TASK)), None, 500, COUNTER)
    assert clipped.edits == ("clipped",)
    text = clipped.message.content
    assert isinstance(text, str)
    assert text.startswith("TASK: port the billing service")
    assert text.endswith("DONE WHEN: every invoice test passes.")
    assert f"{TEXT_CLIP_TAG} {len(TASK):,} characters in all" in text
    assert "ledger #0 holds the whole message." in text and CLIP_TAG not in text
    assert clipped.tokens is not None and clipped.tokens <= 500


def test_an_oversized_text_block_is_clipped_and_its_neighbours_kept() -> None:
    result = ToolResultBlock(tool_use_id="t1", content="exit 0")
    message = Message(role="user", content=[result, TextBlock(text=TASK)])
    clipped = clip_oversized(item(message, seq=4), None, 500, COUNTER)
    blocks = clipped.message.blocks()
    assert blocks[0] == result
    assert isinstance(blocks[1], TextBlock) and "ledger #4" in blocks[1].text


def test_clipping_a_clipped_text_changes_nothing() -> None:
    once = clip_oversized(item(Message(role="user", content=TASK)), None, 500, COUNTER)
    assert clip_oversized(once, None, 500, COUNTER) is once


def test_a_user_text_under_the_limit_is_left_alone() -> None:
    short = item(Message(role="user", content="fix the flaky test"))
    assert clip_oversized(short, None, 500, COUNTER) is short
