"""The cheap layers of a fold, as pure functions on window items.

- :func:`clip_oversized` (always on, applied when a message enters the window): a single tool
  result larger than ``max_item_ratio × budget`` keeps its head and tail, with a line between
  them naming its full size and the ledger seq that holds it whole. Agents do print 450 k-token
  outputs: sent whole they overflow the model, dropped they lose the newest step. This is the
  only change ever made inside the keep window.
- :func:`mask_tool_results`: old tool output is replaced by a stub naming its size and ledger
  seq (``tool_use_id`` and ``is_error`` kept). Free, and on real agent runs it saves about as
  much as summarizing.
- :func:`drop_thinking`: thinking blocks of old assistant messages go; a message whose only
  content was thinking keeps a one-line placeholder, so no message is ever emptied.

Each layer names itself in the item's ``edits`` (``"clipped"``, ``"masked"``,
``"thinking-dropped"``) and is idempotent: running it on its own output changes nothing. An item
a layer leaves alone is returned as the very same object, so a caller can tell exactly which
items changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import overload

from .messages import (
    Block,
    DocumentBlock,
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
)
from .tokens import TokenCounter, count_text, default_counter
from .window import Edit, WindowItem

__all__ = [
    "CLIP_TAG",
    "MASK_TAG",
    "THINKING_PLACEHOLDER",
    "LayerPass",
    "clip_oversized",
    "clip_text",
    "drop_thinking",
    "drop_thinking_item",
    "item_tokens",
    "mask_item",
    "mask_tool_results",
]

CLIP_TAG = "[sessionfold clipped this tool output:"
MASK_TAG = "[sessionfold masked this tool output"
THINKING_PLACEHOLDER = "[sessionfold dropped this message's thinking to save context]"

_CLIP_SIZE_RE = re.compile(r"\[sessionfold clipped this tool output: ([0-9,]+) characters in all")
_MASK_MIN_CHARS = 400  # shorter outputs cost about what their stub costs: leave them whole
_HEAD_SHARE = 0.5


def item_tokens(item: WindowItem, counter: TokenCounter | None = None) -> int:
    """The item's cached token estimate, or a fresh count."""
    if item.tokens is not None:
        return item.tokens
    return (counter or default_counter()).message(item.message)


def _with_edit(item: WindowItem, message: Message, edit: Edit,
               counter: TokenCounter) -> WindowItem:
    edits = item.edits if edit in item.edits else (*item.edits, edit)
    return item.model_copy(update={"message": message, "edits": edits,
                                   "tokens": counter.message(message)})


# --- clip-oversized ----------------------------------------------------------------------------

def _exceeds(text: str, limit: int) -> bool:
    """Whether ``text`` is more than ``limit`` tokens, counting no more of it than needed."""
    if len(text) <= limit // 4 or len(text.encode("utf-8")) <= limit:
        return False  # a token is at least one byte
    seen = 0
    step = max(limit, 1) * 6
    for start in range(0, len(text), step):
        seen += count_text(text[start:start + step])
        if seen > limit:
            return True
    return False


def _original_chars(text: str) -> int:
    """Characters of the output ``text`` stands for (an earlier clip names the original's)."""
    match = _CLIP_SIZE_RE.search(text)
    return int(match.group(1).replace(",", "")) if match else len(text)


def _fit(text: str, tokens: int, *, from_end: bool) -> str:
    """The longest head (or tail) of ``text`` found in a few tries that is at most ``tokens``."""
    best = ""
    n = min(len(text), tokens * 4)
    for _ in range(5):
        if n <= 0:
            break
        piece = text[-n:] if from_end else text[:n]
        got = count_text(piece)
        if got <= tokens:
            best = piece if len(piece) > len(best) else best
            if n == len(text) or got >= tokens * 0.9:
                break
            n = min(len(text), int(n * tokens / max(got, 1) * 0.97))
        else:
            n = int(n * tokens / got * 0.95)
    # Cut at a line break near the edge when there is one, for a readable seam.
    window = max(1, len(best) // 5)
    if from_end:
        nl = best.find("\n", 0, window)
        return best[nl + 1:] if nl >= 0 else best
    nl = best.rfind("\n", len(best) - window)
    return best[:nl + 1] if nl >= 0 else best


def clip_text(text: str, seq: int, max_tokens: int) -> str | None:
    """Head and tail of a tool output over ``max_tokens`` tokens; None if it fits.

    The line between head and tail names the full size and the ledger seq of the original. The
    result itself fits in ``max_tokens``, so clipping a clipped output changes nothing.
    """
    if not _exceeds(text, max_tokens):
        return None
    total = _original_chars(text)
    keep = max(0, max_tokens * 9 // 10 - 80)  # room for the seam line
    head = _fit(text, int(keep * _HEAD_SHARE), from_end=False)
    tail = _fit(text, keep - count_text(head), from_end=True) if keep else ""
    omitted = max(0, total - len(head) - len(tail))
    seam = (f"{CLIP_TAG} {total:,} characters in all; the {omitted:,} characters between "
            f"this head and tail are left out of the window; ledger #{seq} holds the whole "
            "output.]\n")
    # The seam line stands on a line of its own.
    if head and not head.endswith("\n"):
        seam = "\n" + seam
    clipped = f"{head}{seam}{tail}"
    return None if clipped == text else clipped


def _clip_block(block: ToolResultBlock, seq: int, max_tokens: int) -> ToolResultBlock | None:
    clipped = clip_text(block.output_text(), seq, max_tokens)
    if clipped is None:
        return None
    rest = [] if isinstance(block.content, str) else [
        p for p in block.content if not isinstance(p, TextBlock)
    ]
    content: str | list[TextBlock | ImageBlock | DocumentBlock] = (
        [TextBlock(text=clipped), *rest] if rest else clipped
    )
    return block.model_copy(update={"content": content})


def _clip_message(message: Message, seq: int, max_tokens: int) -> Message | None:
    if message.role != "user" or isinstance(message.content, str):
        return None
    changed = False
    blocks: list[Block] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            clipped = _clip_block(block, seq, max_tokens)
            if clipped is not None:
                blocks.append(clipped)
                changed = True
                continue
        blocks.append(block)
    return message.model_copy(update={"content": blocks}) if changed else None


@overload
def clip_oversized(target: WindowItem, seq: int | None, max_tokens: int,
                   counter: TokenCounter | None = None) -> WindowItem: ...


@overload
def clip_oversized(target: Message, seq: int | None, max_tokens: int,
                   counter: TokenCounter | None = None) -> Message: ...


def clip_oversized(target: WindowItem | Message, seq: int | None, max_tokens: int,
                   counter: TokenCounter | None = None) -> WindowItem | Message:
    """Clip every tool result of ``target`` that is larger than ``max_tokens`` tokens.

    ``target`` is a window item (``seq`` defaults to its ``start_seq``; the result carries the
    ``"clipped"`` edit and a fresh token count) or a bare message (``seq`` required: it is the
    ledger seq the clip line names). Returns ``target`` itself when nothing is oversized.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if isinstance(target, Message):
        if seq is None:
            raise ValueError("clip_oversized needs the ledger seq of a bare message")
        return _clip_message(target, seq, max_tokens) or target
    if target.kind != "message":
        return target
    clipped = _clip_message(target.message, target.start_seq if seq is None else seq,
                            max_tokens)
    if clipped is None:
        return target
    return _with_edit(target, clipped, "clipped", counter or default_counter())


# --- mask-tool-results -------------------------------------------------------------------------

def _mask_block(block: ToolResultBlock, seq: int) -> ToolResultBlock | None:
    text = block.output_text()
    if isinstance(block.content, str) and text.startswith(MASK_TAG):
        return None  # already a stub
    others = 0 if isinstance(block.content, str) else sum(
        1 for p in block.content if not isinstance(p, TextBlock)
    )
    if not others and len(text) < _MASK_MIN_CHARS:
        return None
    size = f"{_original_chars(text):,} characters"
    if others:
        size += f" and {others} image/document part{'s' if others > 1 else ''}"
    stub = (f"{MASK_TAG} to save context: {size}; ledger #{seq} holds it whole.]")
    return block.model_copy(update={"content": stub})


def mask_item(item: WindowItem, counter: TokenCounter | None = None) -> WindowItem:
    """``item`` with its tool outputs replaced by stubs (the same object if none qualifies)."""
    if item.kind != "message" or not item.message.has_tool_results():
        return item
    blocks: list[Block] = []
    changed = False
    for block in item.message.blocks():
        if isinstance(block, ToolResultBlock):
            masked = _mask_block(block, item.start_seq)
            if masked is not None:
                blocks.append(masked)
                changed = True
                continue
        blocks.append(block)
    if not changed:
        return item
    message = item.message.model_copy(update={"content": blocks})
    return _with_edit(item, message, "masked", counter or default_counter())


# --- drop-thinking -----------------------------------------------------------------------------

def drop_thinking_item(item: WindowItem, counter: TokenCounter | None = None) -> WindowItem:
    """``item`` without thinking blocks (the same object if it has none).

    A message that held nothing but thinking keeps :data:`THINKING_PLACEHOLDER`, so it is never
    emptied (the API rejects an empty message, and the turn's shape must stay).
    """
    if item.kind != "message" or item.message.role != "assistant" or isinstance(
        item.message.content, str
    ):
        return item
    kept: list[Block] = [b for b in item.message.content
                         if not isinstance(b, ThinkingBlock | RedactedThinkingBlock)]
    if len(kept) == len(item.message.content):
        return item
    content: list[Block] = kept or [TextBlock(text=THINKING_PLACEHOLDER)]
    message = item.message.model_copy(update={"content": content})
    return _with_edit(item, message, "thinking-dropped", counter or default_counter())


# --- running a layer over the window -----------------------------------------------------------

@dataclass(frozen=True)
class LayerPass:
    """The window after one layer: the items, tokens saved, and the positions it changed."""

    items: list[WindowItem]
    saved: int
    changed: tuple[int, ...]


def _run(transform: Callable[[WindowItem, TokenCounter], WindowItem],
         items: Sequence[WindowItem], eligible: Iterable[int], tokens_to_save: int,
         size: Callable[[WindowItem], int], counter: TokenCounter) -> LayerPass:
    out = list(items)
    saved = 0
    changed: list[int] = []
    for pos in sorted(eligible):  # oldest first
        if saved >= tokens_to_save:
            break
        new = transform(out[pos], counter)
        if new is out[pos]:
            continue
        gain = size(out[pos]) - item_tokens(new, counter)
        if gain <= 0:
            continue  # a stub no smaller than the output: leave the output
        out[pos] = new
        saved += gain
        changed.append(pos)
    return LayerPass(out, saved, tuple(changed))


def mask_tool_results(items: Sequence[WindowItem], eligible: Iterable[int], *,
                      tokens_to_save: int, size: Callable[[WindowItem], int] | None = None,
                      counter: TokenCounter | None = None) -> LayerPass:
    """Mask tool output of the items at positions ``eligible``, oldest first.

    Stops once ``tokens_to_save`` are saved. The caller passes only positions outside protection.
    ``size`` gives an item's current tokens (default: :func:`item_tokens`).
    """
    c = counter or default_counter()
    return _run(mask_item, items, eligible, tokens_to_save,
                size or (lambda it: item_tokens(it, c)), c)


def drop_thinking(items: Sequence[WindowItem], eligible: Iterable[int], *,
                  tokens_to_save: int, size: Callable[[WindowItem], int] | None = None,
                  counter: TokenCounter | None = None) -> LayerPass:
    """Drop thinking from the items at positions ``eligible``, oldest first, until enough saved."""
    c = counter or default_counter()
    return _run(drop_thinking_item, items, eligible, tokens_to_save,
                size or (lambda it: item_tokens(it, c)), c)
