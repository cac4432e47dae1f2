"""clip-oversized caps the whole item: parallel tool outputs, text documents and list-form
outputs clipped together, in place, so the message fits ``max_item_tokens`` framing included."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessionfold.core.clip import CLIP_TAG, TEXT_CLIP_TAG, clip_oversized
from sessionfold.core.compact import FoldVisit, compact, fold_window
from sessionfold.core.messages import (
    DocumentBlock,
    Message,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    parse_message,
)
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.recall_hints import hinted_stubs
from sessionfold.core.tokens import TokenCounter, count_text
from sessionfold.core.window import WindowItem

COUNTER = TokenCounter()
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
PDF = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                      "data": "JVBERi0xLjcK" * 100}}
SEAM = re.compile(r"^\[sessionfold clipped this (?:tool output|text): (?P<size>[0-9,]+) "
                  r"characters in all; .* ledger #(?P<seq>[0-9]+) holds the whole "
                  r"(?:output|message)\.\]$", re.MULTILINE)


def output(lines: int, tag: str = "row") -> str:
    return "\n".join(f"{tag} {i}: value={i * 7} path=src/{tag}_{i}.py" for i in range(lines))


def parallel(sizes: list[int], *, extra: list[dict[str, Any]] | None = None) -> Message:
    """A user message answering ``len(sizes)`` parallel calls, output ``i`` of ``sizes[i]``
    lines (the shape of an agent that fans out reads)."""
    blocks: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": f"p{i}", "content": output(n, f"f{i}")}
        for i, n in enumerate(sizes)]
    return parse_message({"role": "user", "content": [*blocks, *(extra or [])]})


def item(message: Message, seq: int = 9) -> WindowItem:
    return WindowItem(start_seq=seq, end_seq=seq, message=message)


def outputs(message: Message) -> list[str]:
    return [b.output_text() for b in message.blocks() if isinstance(b, ToolResultBlock)]


def check_clip(whole: str, clipped: str, seq: int) -> None:
    """``clipped`` is a head and a tail of ``whole`` around one seam naming its size and seq."""
    seams = list(SEAM.finditer(clipped))
    assert len(seams) == 1, clipped[:200]
    seam = seams[0]
    assert int(seam["size"].replace(",", "")) == len(whole) and int(seam["seq"]) == seq
    head, tail = clipped[:seam.start()], clipped[seam.end() + 1:]
    assert whole.startswith(head.removesuffix("\n")) and whole.endswith(tail)


# --- the cap holds for the whole item ------------------------------------------------------------

def test_parallel_outputs_each_under_the_cap_are_clipped_so_the_message_fits_it() -> None:
    message = parallel([200] * 8)  # each output ~3.5 k tokens, the message ~28 k
    assert all(count_text(text) < 4000 for text in outputs(message))
    assert COUNTER.message(message) > 2 * 4000
    clipped = clip_oversized(item(message), None, 4000, COUNTER)
    assert clipped.edits == ("clipped",)
    assert clipped.tokens == COUNTER.message(clipped.message) <= 4000
    for whole, text in zip(outputs(message), outputs(clipped.message), strict=True):
        check_clip(whole, text, 9)
    assert [b.tool_use_id for b in clipped.message.blocks()  # type: ignore[union-attr]
            ] == [f"p{i}" for i in range(8)]


def test_outputs_small_enough_keep_whole_and_the_large_ones_share_the_rest() -> None:
    message = parallel([3, 400, 10, 2000, 5])
    clipped = clip_oversized(item(message), None, 3000, COUNTER)
    before, after = outputs(message), outputs(clipped.message)
    assert [after[i] for i in (0, 2, 4)] == [before[i] for i in (0, 2, 4)]
    check_clip(before[1], after[1], 9)
    check_clip(before[3], after[3], 9)
    # Equal shares, not shares by size: the 2,000-line output gets no more than the 400-line one.
    assert abs(count_text(after[1]) - count_text(after[3])) < 60
    assert COUNTER.message(clipped.message) <= 3000


def test_one_oversized_output_among_small_ones_takes_the_room_they_leave() -> None:
    message = parallel([5, 3000, 5])
    clipped = clip_oversized(message, 3, 2000, COUNTER)
    texts = outputs(clipped)
    assert texts[0] == outputs(message)[0] and texts[2] == outputs(message)[2]
    assert count_text(texts[1]) > 1500 and COUNTER.message(clipped) <= 2000


def test_a_message_that_fits_as_a_whole_is_left_as_the_same_object() -> None:
    message = parallel([30] * 5)
    small = item(message)
    assert clip_oversized(small, None, COUNTER.message(message), COUNTER) is small
    assert clip_oversized(message, 1, COUNTER.message(message), COUNTER) is message
    counted = small.model_copy(update={"tokens": COUNTER.message(message)})
    assert clip_oversized(counted, None, COUNTER.message(message), COUNTER) is counted


def test_clipping_a_clipped_parallel_message_changes_nothing() -> None:
    once = clip_oversized(item(parallel([200, 900, 40, 600])), None, 2500, COUNTER)
    assert once.edits == ("clipped",)
    assert clip_oversized(once, None, 2500, COUNTER) is once
    bare = clip_oversized(parallel([200, 900, 40, 600]), 9, 2500, COUNTER)
    assert clip_oversized(bare, 9, 2500, COUNTER) is bare


def test_a_parallel_message_clipped_for_a_larger_cap_is_clipped_again_from_its_original() -> None:
    original = parallel([600, 600, 600])
    once = clip_oversized(item(original, seq=4), None, 12_000, COUNTER)
    again = clip_oversized(once, None, 2000, COUNTER, original=original)
    assert again.edits == ("clipped",) and COUNTER.message(again.message) <= 2000
    for whole, text in zip(outputs(original), outputs(again.message), strict=True):
        check_clip(whole, text, 4)
    blind = clip_oversized(once, None, 2000, COUNTER)  # the ledger original not at hand
    assert COUNTER.message(blind.message) <= 2000
    assert all("characters in all" not in text for text in outputs(blind.message))


def test_a_users_text_beside_parallel_outputs_shares_the_cap_with_them() -> None:
    note = output(900, "note")
    message = parallel([900, 900], extra=[{"type": "text", "text": note}])
    clipped = clip_oversized(item(message), None, 3000, COUNTER)
    text = clipped.message.blocks()[-1]
    assert isinstance(text, TextBlock) and TEXT_CLIP_TAG in text.text and CLIP_TAG not in text.text
    check_clip(note, text.text, 9)
    assert COUNTER.message(clipped.message) <= 3000


def test_text_beside_images_that_fill_the_cap_still_keeps_a_quarter_of_it() -> None:
    # Three images (4,800 tokens) break a 2,000-token cap whatever is clipped: the user's words
    # beside them keep a quarter of the cap instead of shrinking to a seam line.
    message = parse_message({"role": "user", "content": [
        IMAGE, IMAGE, IMAGE, {"type": "text", "text": output(400, "why")}]})
    clipped = clip_oversized(message, 2, 2000, COUNTER)
    text = clipped.blocks()[-1]
    assert isinstance(text, TextBlock) and TEXT_CLIP_TAG in text.text
    assert 350 < count_text(text.text) <= 500
    assert [b.type for b in clipped.blocks()] == ["image", "image", "image", "text"]
    assert clip_oversized(clipped, 2, 2000, COUNTER) is clipped


# --- documents -----------------------------------------------------------------------------------

def test_a_text_document_in_a_user_message_is_clipped_like_the_users_own_text() -> None:
    data = output(3000, "spec")
    doc = {"type": "document", "title": "spec", "citations": {"enabled": True},
           "source": {"type": "text", "media_type": "text/plain", "data": data}}
    message = parse_message({"role": "user", "content": [
        doc, {"type": "text", "text": "implement this spec"}]})
    clipped = clip_oversized(item(message, seq=0), None, 2000, COUNTER)
    block = clipped.message.blocks()[0]
    assert isinstance(block, DocumentBlock)
    dumped = block.model_dump(mode="json", exclude_unset=True)
    assert {k: v for k, v in dumped.items() if k != "source"} == {
        "type": "document", "title": "spec", "citations": {"enabled": True}}
    assert {k: v for k, v in dumped["source"].items() if k != "data"} == {
        "type": "text", "media_type": "text/plain"}
    assert TEXT_CLIP_TAG in block.source["data"]
    check_clip(data, block.source["data"], 0)
    assert clipped.message.blocks()[1] == message.blocks()[1]
    assert COUNTER.message(clipped.message) <= 2000


def test_a_text_document_inside_a_tool_result_is_clipped_like_its_output() -> None:
    data = output(3000, "page")
    message = parse_message({"role": "user", "content": [{
        "type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "fetched"},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                            "data": data}}]}]})
    clipped = clip_oversized(message, 5, 1500, COUNTER)
    parts = clipped.blocks()[0].content  # type: ignore[union-attr]
    assert isinstance(parts, list) and [p.type for p in parts] == ["text", "document"]
    assert parts[0] == TextBlock(text="fetched")
    assert isinstance(parts[1], DocumentBlock) and CLIP_TAG in parts[1].source["data"]
    check_clip(data, parts[1].source["data"], 5)
    assert COUNTER.message(clipped) <= 1500


def test_pdfs_images_and_blocks_sessionfold_does_not_read_are_never_edited() -> None:
    opaque = {"type": "search_result", "source": "https://x", "title": "t",
              "content": [{"type": "text", "text": "found"}]}
    message = parse_message({"role": "user", "content": [
        PDF, IMAGE, {"type": "tool_result", "tool_use_id": "t1",
                     "content": [opaque, IMAGE, {"type": "text", "text": output(2000)}]}]})
    clipped = clip_oversized(message, 1, 2000, COUNTER)
    assert clipped.blocks()[:2] == message.blocks()[:2]
    parts = clipped.blocks()[2].content  # type: ignore[union-attr]
    assert isinstance(parts, list) and isinstance(parts[0], OpaqueBlock)
    assert parts[:2] == message.blocks()[2].content[:2]  # type: ignore[union-attr]
    assert CLIP_TAG in parts[2].text  # type: ignore[union-attr]


# --- list-form outputs are clipped part by part, in place --------------------------------------

def test_a_list_tool_result_keeps_every_part_in_place_with_its_own_fields() -> None:
    log = "BUILD LOG\n" + output(3000)
    message = parse_message({"role": "user", "content": [{
        "type": "tool_result", "tool_use_id": "t1", "content": [
            IMAGE,
            {"type": "text", "text": log, "cache_control": {"type": "ephemeral"},
             "citations": None},
            {"type": "text", "text": "exit status 0"}]}]})
    clipped = clip_oversized(item(message, seq=2), None, 2000, COUNTER)
    before = message.to_json()["content"][0]["content"]
    after = clipped.message.to_json()["content"][0]["content"]
    assert [p["type"] for p in after] == ["image", "text", "text"]
    assert after[0] == before[0] and after[2] == before[2]
    assert {k: v for k, v in after[1].items() if k != "text"} == {
        k: v for k, v in before[1].items() if k != "text"}
    check_clip(log, after[1]["text"], 2)
    assert clip_oversized(clipped, None, 2000, COUNTER) is clipped


def test_each_clipped_part_is_hinted_and_only_the_first_names_an_offset() -> None:
    message = parse_message({"role": "user", "content": [{
        "type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": output(2000, "a")}, IMAGE,
            {"type": "text", "text": output(2000, "b")}]}]})
    clipped = clip_oversized(item(message, seq=6), None, 2000, COUNTER)
    parts = hinted_stubs(clipped).blocks()[0].content  # type: ignore[union-attr]
    assert isinstance(parts, list)
    first, second = parts[0].text, parts[2].text  # type: ignore[union-attr]
    assert 'call sessionfold_recall with seq "6" and offset ' in first
    assert 'call sessionfold_recall with seq "6" to read it whole.]' in second


# --- the planner and compact use the same cap ----------------------------------------------------

def test_a_forced_fold_clips_a_parallel_message_the_keep_window_holds() -> None:
    # The wedge: five parallel reads, each under the cap, together over the budget, inside the
    # keep window where no fold reaches. The visit's clip pass brings the item under its cap.
    policy = FoldPolicy(budget_tokens=8000)  # cap 2,000
    calls = parse_message({"role": "assistant", "content": [
        {"type": "tool_use", "id": f"p{i}", "name": "read", "input": {"path": f"m{i}.py"}}
        for i in range(5)]})
    items = [item(Message(role="user", content="review these modules"), seq=0),
             item(calls, seq=1), item(parallel([140] * 5), seq=2)]
    assert COUNTER.message(items[-1].message) > policy.budget_tokens
    result = fold_window(items, FoldVisit(
            policy, None, trigger="overflow", force=True, counter=COUNTER))
    assert "clip-oversized" in result.record.layers_run
    assert result.window[-1].edits == ("clipped",)
    assert COUNTER.message(result.window[-1].message) <= policy.max_item_tokens
    assert result.record.tokens_after <= policy.budget_tokens


def test_compact_lands_a_parallel_message_over_the_budget_under_it() -> None:
    messages = [Message(role="user", content="read all these files"),
                parse_message({"role": "assistant", "content": [
                    {"type": "tool_use", "id": f"p{i}", "name": "read", "input": {}}
                    for i in range(8)]}),
                parallel([250] * 8),
                Message(role="assistant", content="done")]
    policy = FoldPolicy(budget_tokens=12_000)
    result = compact(messages, policy, None, counter=COUNTER)
    assert result.record.layers_run[0] == "clip-oversized"
    assert result.record.measured_tokens > policy.budget_tokens
    assert result.record.tokens_after <= policy.budget_tokens


# --- the invariant -------------------------------------------------------------------------------

@st.composite
def user_messages(draw: st.DrawFn) -> Message:
    """A user message of parallel tool outputs, maybe with list-form parts, an image, the user's
    own text and a text document, of sizes from a line to far over any cap."""
    sizes = st.sampled_from([0, 1, 5, 40, 150, 600, 2500])
    blocks: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 8))):
        text = output(draw(sizes), f"o{i}")
        shape = draw(st.sampled_from(["str", "str", "parts", "doc"]))
        if shape == "str":
            content: Any = text
        elif shape == "parts":
            content = [{"type": "text", "text": text}, IMAGE,
                       {"type": "text", "text": output(draw(sizes), f"p{i}")}]
        else:
            content = [{"type": "text", "text": "fetched"},
                       {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                       "data": text or "-"}}]
        blocks.append({"type": "tool_result", "tool_use_id": f"t{i}", "content": content})
    if draw(st.booleans()):
        blocks.append({"type": "text", "text": output(draw(sizes), "own") or "and this"})
    return parse_message({"role": "user", "content": blocks})


def clippable(message: Message) -> list[str]:
    """Every text clip-oversized may clip, read here on its own: a text block's, a text
    document's, a tool result's string or text parts and text documents."""
    texts: list[str] = []
    for block in message.blocks():
        parts: list[Any] = [block]
        if isinstance(block, ToolResultBlock):
            if isinstance(block.content, str):
                texts.append(block.content)
                continue
            parts = list(block.content)
        for part in parts:
            if isinstance(part, TextBlock):
                texts.append(part.text)
            elif isinstance(part, DocumentBlock) and part.source.get("type") == "text":
                texts.append(part.source["data"])
    return texts


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(message=user_messages(), cap=st.sampled_from([400, 1000, 3000, 8000]))
def test_a_clipped_item_fits_its_cap_and_clipping_it_again_changes_nothing(
        message: Message, cap: int) -> None:
    texts = clippable(message)
    fixed = COUNTER.message(message) - sum(count_text(t) for t in texts)
    room = max(cap - fixed, cap // 4)
    clipped = clip_oversized(item(message), None, cap, COUNTER)
    tokens = COUNTER.message(clipped.message)
    if COUNTER.message(message) <= cap:
        assert clipped.message is message
    elif len(texts) * 64 <= room:  # room for a seam line per text
        assert tokens <= fixed + room
        if fixed <= cap * 3 // 4:  # what cannot be clipped leaves the texts their room
            assert tokens <= cap
    assert clip_oversized(clipped, None, cap, COUNTER) is clipped
    for whole, text in zip(texts, clippable(clipped.message), strict=True):
        if text != whole:
            check_clip(whole, text, 9)
