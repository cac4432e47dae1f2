"""The cheap layers of a fold, as pure functions on window items.

- :func:`mask_tool_results`: old tool output is replaced by a stub naming its size and ledger
  seq (``tool_use_id`` and ``is_error`` kept). Free, and on real agent runs it saves about as
  much as summarizing.
- :func:`drop_thinking`: thinking blocks of old assistant messages go; a message whose only
  content was thinking keeps a one-line placeholder, so no message is ever emptied. The last
  assistant message of the window always keeps its thinking (the API requires it).
- :func:`drop_recall_items` (``drop-recall``, always on, the first thing a fold does): a recall
  exchange (the model asking ``sessionfold_recall`` and the client's answer, window items of
  kind ``"recall"``) leaves the window as a whole, for one line saying it was there. What it
  brought back is in the ledger under its own seqs; the exchange itself is a copy.

``clip-oversized``, always on and applied when a message enters the window, is :mod:`.clip`;
the recall hints a read adds to stubs and seams are :mod:`.recall_hints`.

Each layer names itself in the item's ``edits`` (``"clipped"``, ``"masked"``,
``"thinking-dropped"``) and is idempotent: running it on its own output changes nothing. An item
a layer leaves alone is returned as the very same object, so a caller can tell exactly which
items changed. Whether an item was masked is its ``edits``, never its text (a tool may print a
mask stub); the size a stub names is the original output's length — the message itself while it
is unedited, else the ledger original passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from .errors import InvalidInputError
from .evolve import evolve
from .messages import (
    Block,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
)
from .tokens import TokenCounter, default_counter
from .window import Edit, Originals, WindowItem

__all__ = [
    "DROP_RECALL",
    "MASK_TAG",
    "RECALL_DROPPED_TAG",
    "THINKING_PLACEHOLDER",
    "LayerMemo",
    "LayerPass",
    "drop_recall_items",
    "drop_thinking",
    "drop_thinking_item",
    "has_thinking",
    "item_tokens",
    "last_assistant",
    "mask_item",
    "mask_tool_results",
    "recall_dropped_message",
    "with_edit",
]

MASK_TAG = "[sessionfold masked this tool output"
THINKING_PLACEHOLDER = "[sessionfold dropped this message's thinking to save context]"
RECALL_DROPPED_TAG = "[sessionfold] a recall exchange"
#: The layer that drops recall exchanges (always on, first; see :func:`drop_recall_items`).
DROP_RECALL = "drop-recall"

_MASK_MIN_CHARS = 400  # shorter outputs cost about what their stub costs: leave them whole


def item_tokens(item: WindowItem, counter: TokenCounter | None = None) -> int:
    """The item's cached token estimate, or a fresh count."""
    if item.tokens is not None:
        return item.tokens
    return (counter or default_counter()).message(item.message)


def with_edit(item: WindowItem, message: Message, edit: Edit,
              counter: TokenCounter) -> WindowItem:
    """``item`` holding ``message`` instead, ``edit`` named in its ``edits`` (once), recounted."""
    edits = item.edits if edit in item.edits else (*item.edits, edit)
    return evolve(item, message=message, edits=edits, tokens=counter.fresh(message))


def _mask_block(block: ToolResultBlock, seq: int, size: int | None,
                text: str) -> ToolResultBlock | None:
    """A stub for ``block``, whose output text is ``text``; ``size`` is its original output's
    length (None: unknown)."""
    others = 0 if isinstance(block.content, str) else sum(
        1 for p in block.content if not isinstance(p, TextBlock)
    )
    if not others and len(text) < _MASK_MIN_CHARS:
        return None
    parts = [] if size is None else [f"{size:,} characters"]
    if others:
        parts.append(f"{others} image/document part{'s' if others > 1 else ''}")
    what = f": {' and '.join(parts)};" if parts else ";"
    stub = f"{MASK_TAG} to save context{what} ledger #{seq} holds it whole.]"
    return evolve(block, content=stub)


def _original_sizes(item: WindowItem, original: Message | None) -> list[int | None]:
    """The original length of each tool output of ``item``, in block order (None: unknown).

    An unclipped item's outputs are the originals. A clipped one's come from ``original``, its
    ledger message, matched by position and tool_use_id (clipping keeps both).
    """
    current = [b for b in item.message.blocks() if isinstance(b, ToolResultBlock)]
    if "clipped" not in item.edits:
        return [len(b.output_text()) for b in current]
    whole = [] if original is None else [
        b for b in original.blocks() if isinstance(b, ToolResultBlock)]
    if len(whole) != len(current):
        return [None] * len(current)
    return [len(w.output_text()) if w.tool_use_id == c.tool_use_id else None
            for w, c in zip(whole, current, strict=True)]


def mask_item(item: WindowItem, counter: TokenCounter | None = None, *,
              original: Message | None = None) -> WindowItem:
    """``item`` with its tool outputs replaced by stubs (the same object if none qualifies).

    An item whose ``edits`` say it was masked is left alone: that pass stubbed every output
    worth it. ``original`` is the item's ledger message, needed only for a clipped item (the
    stub names the original's size; without it the size is left out).
    """
    content = item.message.content
    if item.kind != "message" or "masked" in item.edits or isinstance(content, str):
        return item
    # An unclipped item's outputs are their own originals; a clipped one's sizes come from
    # the ledger message (one per tool result, in order).
    whole = "clipped" not in item.edits
    sizes = None if whole else iter(_original_sizes(item, original))
    blocks: list[Block] | None = None  # a copy of the content, from the first stub on
    for pos, block in enumerate(content):
        if isinstance(block, ToolResultBlock):
            text = block.output_text()
            size = len(text) if sizes is None else next(sizes)
            masked = _mask_block(block, item.start_seq, size, text)
            if masked is not None:
                if blocks is None:
                    blocks = list(content[:pos])
                blocks.append(masked)
                continue
        if blocks is not None:
            blocks.append(block)
    if blocks is None:
        return item
    message = evolve(item.message, content=blocks)
    return with_edit(item, message, "masked", counter or default_counter())


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
    message = evolve(item.message, content=content)
    return with_edit(item, message, "thinking-dropped", counter or default_counter())


# --- running a layer over the window -----------------------------------------------------------

@dataclass(frozen=True)
class LayerPass:
    """The window after one layer: the items, tokens saved, and the positions it changed."""

    items: list[WindowItem]
    saved: int
    changed: tuple[int, ...]


#: What a layer made of each item it was given, by the item's id (the item is held beside its
#: result, so its id cannot be taken by another object while the memo lives).
LayerMemo: TypeAlias = MutableMapping[int, tuple[WindowItem, WindowItem]]


def _run(transform: Callable[[WindowItem, TokenCounter], WindowItem],
         items: Sequence[WindowItem], eligible: Iterable[int], tokens_to_save: int,
         size: Callable[[WindowItem], int], counter: TokenCounter,
         memo: LayerMemo | None = None) -> LayerPass:
    out = list(items)
    saved = 0
    changed: list[int] = []
    for pos in sorted(eligible):  # oldest first
        if saved >= tokens_to_save:
            break
        item = out[pos]
        hit = memo.get(id(item)) if memo is not None else None
        if hit is not None and hit[0] is item:
            new = hit[1]
        else:
            new = transform(item, counter)
            if memo is not None:
                memo[id(item)] = (item, new)
        if new is item:
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
                      counter: TokenCounter | None = None,
                      originals: Originals | None = None,
                      memo: LayerMemo | None = None) -> LayerPass:
    """Mask tool output of the items at positions ``eligible``, oldest first.

    Stops once ``tokens_to_save`` are saved. The caller passes only positions outside protection.
    ``size`` gives an item's current tokens (default: :func:`item_tokens`); ``originals`` looks
    up the ledger message of a clipped item, whose stub names the original's size. ``memo``
    (a dict the caller keeps) remembers what each item became, so a second pass over the same
    items (a priced visit's dry run, then the real one) masks none of them again.
    """
    c = counter or default_counter()

    def mask(item: WindowItem, counter: TokenCounter) -> WindowItem:
        # The ledger is read only for a clipped output about to be masked (once per item: the
        # masked item is never masked again).
        wanted = "clipped" in item.edits and "masked" not in item.edits
        original = originals(item.start_seq) if wanted and originals is not None else None
        return mask_item(item, counter, original=original)

    return _run(mask, items, eligible, tokens_to_save,
                size or (lambda it: item_tokens(it, c)), c, memo)


def drop_thinking(items: Sequence[WindowItem], eligible: Iterable[int], *,
                  tokens_to_save: int, size: Callable[[WindowItem], int] | None = None,
                  counter: TokenCounter | None = None,
                  memo: LayerMemo | None = None) -> LayerPass:
    """Drop thinking from the items at positions ``eligible``, oldest first, until enough saved
    (``memo``: as for :func:`mask_tool_results`).

    The last assistant message of ``items`` keeps its thinking even when eligible (no keep
    window protects it under ``keep_recent_turns=0``): with extended thinking the Messages API
    refuses a request whose final assistant message, the one whose tool calls the last
    tool_result answers, does not start with its thinking block ("a final assistant message
    must start with a thinking block"), so thinning it would break the agent's next call.
    """
    c = counter or default_counter()
    last = last_assistant(items)
    return _run(drop_thinking_item, items, (pos for pos in eligible if pos != last),
                tokens_to_save, size or (lambda it: item_tokens(it, c)), c, memo)


def last_assistant(items: Sequence[WindowItem]) -> int | None:
    """The position of the window's last assistant message (a recall call included), whose
    thinking :func:`drop_thinking` keeps; None if there is none."""
    return next((pos for pos in range(len(items) - 1, -1, -1)
                 if items[pos].message.role == "assistant"), None)


def has_thinking(item: WindowItem) -> bool:
    """Whether ``item`` is a message item holding thinking that :func:`drop_thinking_item`
    would drop."""
    return (item.kind == "message" and item.message.role == "assistant"
            and not isinstance(item.message.content, str)
            and any(isinstance(b, ThinkingBlock | RedactedThinkingBlock)
                    for b in item.message.content))


# --- drop-recall -------------------------------------------------------------------------------

def recall_dropped_message(start_seq: int, end_seq: int) -> Message:
    """The line a dropped recall exchange leaves (a user message: the exchange was the model
    asking and the client answering on the user's side)."""
    span = f"#{start_seq}" if start_seq == end_seq else f"#{start_seq}–#{end_seq}"
    return Message(role="user", content=f"{RECALL_DROPPED_TAG} (ledger {span}) was dropped from "
                                        "this window to save context.")


def drop_recall_items(items: Sequence[WindowItem],
                      counter: TokenCounter | None = None) -> WindowItem:
    """One item standing for the consecutive recall ``items`` (whole exchanges: a tool call
    and its answer go together), with the ``"dropped"`` edit.

    It stays of kind ``"recall"``: it is never counted as a turn of the agent's, never summarized,
    and a later drop may take it along into a longer one.
    """
    if not items or any(item.kind != "recall" for item in items):
        raise InvalidInputError("drop_recall_items takes recall items only")
    start, end = items[0].start_seq, items[-1].end_seq
    message = recall_dropped_message(start, end)
    return WindowItem(start_seq=start, end_seq=end, kind="recall", message=message,
                      edits=("dropped",), tokens=(counter or default_counter()).message(message))
