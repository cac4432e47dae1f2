"""Recall hints, rendered when a window is read or sent: the stored item never changes.

With recall on, the mask stubs, clip seams and summary frames a layer wrote also say how to get
the original back (one ``sessionfold_recall`` call); without it they do not, and a recall
exchange still in the window goes out as the line a dropped one leaves. Only the stubs and seams
of the item's own seq, in an item whose ``edits`` say a layer wrote them, are rewritten: a tool
may print a mask stub or a clip line, and those are its words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .clip import CLIP_TAG, TEXT_CLIP_TAG
from .evolve import evolve
from .frame import hinted_frame, recall_hint
from .layers import MASK_TAG, recall_dropped_message
from .messages import Block, Message, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from .policy import FoldPolicy
from .window import WindowItem

__all__ = ["as_sent", "hinted_stubs", "offers_recall_tool", "out_of_sight"]

_MASK_STUB = re.compile(re.escape(MASK_TAG) + r" to save context(?:: [^\n\];]*)?; "
                        r"ledger #(?P<seq>[0-9]+) holds it whole(?P<end>\.\])")
_SEAM = re.compile(r"^(?:" + re.escape(CLIP_TAG) + "|" + re.escape(TEXT_CLIP_TAG) + r") "
                   r"[^\n]*; ledger #(?P<seq>[0-9]+) holds the whole (?:output|message)"
                   r"(?P<end>\.\])$", re.MULTILINE)


def out_of_sight(items: Sequence[WindowItem]) -> bool:
    """Whether ``items`` hold something sessionfold edited out of sight (a mask stub, dropped
    thinking, a summary or notice, a recall exchange or the line a dropped one leaves):
    something only the recall tool gives back. A clip alone does not count: its head and tail
    stay in the window, and offering the tool for it alone would rewrite the whole cached prefix
    (tools lead it) of a session that may never fold (B1: a ten-call customer-service session
    paid a third more for one clipped look-up)."""
    return any(item.kind != "message" or set(item.edits) - {"clipped"} for item in items)


def offers_recall_tool(policy: FoldPolicy, items: Sequence[WindowItem]) -> bool:
    """Whether a request of ``items`` carries the recall tool under ``policy``: recall on, and
    offered always or once something is out of sight (``recall_offer="edited"``)."""
    return policy.recall and (policy.recall_offer == "always" or out_of_sight(items))


def _hint_mask(content: str, seq: int) -> str:
    match = _MASK_STUB.fullmatch(content)
    if match is None or int(match["seq"]) != seq:
        return content
    return f"{content[:match.start('end')]}; {recall_hint(seq, seq)}.]"


def _hint_seams(text: str, seq: int, *, first: bool) -> str:
    """``text`` with the seam lines naming ``seq`` hinted. ``first``: the text starts the
    message's searchable text, so where the omitted part starts is an offset recall takes."""
    def hint(match: re.Match[str]) -> str:
        if int(match["seq"]) != seq:
            return match.group()
        # The head before the seam is a prefix of the original (a line break may have been
        # added before the seam: starting one character early repeats at most that).
        offset = max(match.start() - 1, 0) if first else None
        what = "the part left out" if first else "it whole"
        return (f"{match.group()[:-2]}; {recall_hint(seq, seq, offset=offset, what=what)}.]")

    return _SEAM.sub(hint, text)


def _hint_block(block: Block, seq: int, item: WindowItem, first: bool) -> Block:
    if isinstance(block, ToolResultBlock):
        if isinstance(block.content, str):
            text = block.content
            if "masked" in item.edits:
                text = _hint_mask(text, seq)
            if "clipped" in item.edits:
                text = _hint_seams(text, seq, first=first)
            return block if text == block.content else evolve(block, content=text)
        if "clipped" not in item.edits:
            return block
        # Each text part is clipped in place. Only the first one starts the output's searchable
        # text (the parts joined), so only its seam can name an offset; a text document's seam
        # is left as written: recall reads a message's text, never a document.
        parts = list(block.content)
        for i, part in enumerate(parts):
            if isinstance(part, TextBlock):
                hinted = _hint_seams(part.text, seq, first=first)
                first = False
                if hinted != part.text:
                    parts[i] = evolve(part, text=hinted)
        if all(a is b for a, b in zip(parts, block.content, strict=True)):
            return block
        return evolve(block, content=parts)
    if isinstance(block, TextBlock) and "clipped" in item.edits and item.message.role == "user":
        hinted = _hint_seams(block.text, seq, first=first)
        return block if hinted == block.text else evolve(block, text=hinted)
    return block


def _says_something(block: Block) -> bool:
    """Whether ``block`` adds text to the message's searchable text (recall's offsets)."""
    if isinstance(block, TextBlock):
        return bool(block.text)
    if isinstance(block, ToolResultBlock):
        return bool(block.output_text())
    if isinstance(block, ThinkingBlock):
        return bool(block.thinking)
    return isinstance(block, ToolUseBlock)


def hinted_stubs(item: WindowItem) -> Message:
    """``item``'s message with the recall hint in its mask stubs and clip seams.

    Only a message item whose ``edits`` say it was masked or clipped is read, and only the
    stubs and seam lines naming the item's own seq are rewritten (a tool that printed one for
    another seq keeps its words). A seam in the text the message's searchable text starts with
    also names the offset where the part left out begins, so one recall reads on from there.
    """
    message = item.message
    if item.kind != "message" or not {"masked", "clipped"} & set(item.edits):
        return message
    seq = item.start_seq
    if isinstance(message.content, str):
        if message.role != "user" or "clipped" not in item.edits:
            return message
        hinted = _hint_seams(message.content, seq, first=True)
        return message if hinted == message.content else evolve(message, content=hinted)
    blocks: list[Block] = []
    first = True
    for block in message.content:
        blocks.append(_hint_block(block, seq, item, first))
        if _says_something(block):
            first = False
    if all(a is b for a, b in zip(blocks, message.content, strict=True)):
        return message
    return evolve(message, content=blocks)


def as_sent(item: WindowItem, *, recall: bool) -> Message:
    """The message ``item`` goes out as in a request.

    ``recall``: the request carries the recall tool. Its stubs, seams and frames then say how
    to use it; without it they do not, and a recall exchange still in the window is sent as the
    line a dropped one leaves (a request without the tool may not hold calls of it). The
    pre-send guard measures items so (the hints are tokens too) and the client renders them so.
    """
    if item.kind == "recall":
        if recall or "dropped" in item.edits:
            return item.message
        return recall_dropped_message(item.start_seq, item.end_seq)
    if not recall:
        return item.message
    if item.kind == "message":
        return hinted_stubs(item)
    return hinted_frame(item)
