"""The cheap layers of a fold, as pure functions on window items.

- :func:`clip_oversized` (always on, applied when a message enters the window): a single tool
  result larger than ``max_item_ratio × budget`` keeps its head and tail, with a line between
  them naming its full size and the ledger seq that holds it whole. Agents do print 450 k-token
  outputs: sent whole they overflow the model, dropped they lose the newest step. A user
  message's own text (a string content, a text block) larger than that is clipped the same way:
  a pasted 10 MB log is no easier for the model to take than a tool's, and the first user
  message (the task) still shows its beginning and its end. Assistant messages are never
  clipped. This is the only change ever made inside the keep window; the ledger keeps every
  message whole.
- :func:`mask_tool_results`: old tool output is replaced by a stub naming its size and ledger
  seq (``tool_use_id`` and ``is_error`` kept). Free, and on real agent runs it saves about as
  much as summarizing.
- :func:`drop_thinking`: thinking blocks of old assistant messages go; a message whose only
  content was thinking keeps a one-line placeholder, so no message is ever emptied.
- :func:`drop_recall_items` (``drop-recall``, always on, the first thing a fold does): a recall
  exchange (the model asking ``sessionfold_recall`` and the client's answer, window items of
  kind ``"recall"``) leaves the window as a whole, for one line saying it was there. What it
  brought back is in the ledger under its own seqs; the exchange itself is a copy.

Each layer names itself in the item's ``edits`` (``"clipped"``, ``"masked"``,
``"thinking-dropped"``) and is idempotent: running it on its own output changes nothing. An item
a layer leaves alone is returned as the very same object, so a caller can tell exactly which
items changed.

The tags below are what the model reads; the layers never look for them. :func:`hinted_stubs`
renders them with the recall hint when a window is read for a session with recall on (the
stored item never changes); it rewrites only the stubs and seams of the item's own seq, in an
item whose ``edits`` say a layer wrote them. A tool may print a
mask stub or a clip line: whether an item was masked or clipped is its ``edits``, and the sizes
an authored line names are the original output's length — the message itself while it is
unedited, else the ledger original passed in (``original=``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias, overload

from .frame import recall_hint
from .messages import (
    Block,
    DocumentBlock,
    ImageBlock,
    Message,
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    evolve,
)
from .tokens import TokenCounter, count_text, default_counter
from .window import Edit, Originals, WindowItem

__all__ = [
    "CLIP_TAG",
    "DROP_RECALL",
    "MASK_TAG",
    "RECALL_DROPPED_TAG",
    "TEXT_CLIP_TAG",
    "THINKING_PLACEHOLDER",
    "LayerMemo",
    "LayerPass",
    "clip_oversized",
    "clip_text",
    "drop_recall_items",
    "drop_thinking",
    "drop_thinking_item",
    "hinted_stubs",
    "item_tokens",
    "mask_item",
    "mask_tool_results",
    "recall_dropped_message",
]

CLIP_TAG = "[sessionfold clipped this tool output:"
TEXT_CLIP_TAG = "[sessionfold clipped this text:"
MASK_TAG = "[sessionfold masked this tool output"
THINKING_PLACEHOLDER = "[sessionfold dropped this message's thinking to save context]"
RECALL_DROPPED_TAG = "[sessionfold] a recall exchange"
#: The layer that drops recall exchanges (always on, first; see :func:`drop_recall_items`).
DROP_RECALL = "drop-recall"

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
    return evolve(item, message=message, edits=edits, tokens=counter.fresh(message))


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

    ``text`` is the whole output: the line between head and tail names its size and the ledger
    seq that holds it. The result itself fits in ``max_tokens``, so clipping a clipped output
    changes nothing.
    """
    return _clip_text(text, seq, max_tokens, len(text))


def _clip_text(text: str, seq: int, max_tokens: int, total: int | None, *,
               tag: str = CLIP_TAG, whole: str = "output") -> str | None:
    """Clip ``text``; ``total`` is the whole output's size (None: unknown, not named).

    ``tag`` and ``whole`` name what was clipped on the seam line (a tool output by default).
    """
    if not _exceeds(text, max_tokens):
        return None
    keep = max(0, max_tokens * 9 // 10 - 80)  # room for the seam line
    head = _fit(text, int(keep * _HEAD_SHARE), from_end=False)
    tail = _fit(text, keep - count_text(head), from_end=True) if keep else ""
    if total is None:
        size = "the characters between this head and tail are"
    else:
        omitted = max(0, total - len(head) - len(tail))
        size = (f"{total:,} characters in all; the {omitted:,} characters between this head "
                "and tail are")
    seam = (f"{tag} {size} left out of the window; ledger #{seq} holds the whole "
            f"{whole}.]\n")
    # The seam line stands on a line of its own.
    if head and not head.endswith("\n"):
        seam = "\n" + seam
    clipped = f"{head}{seam}{tail}"
    return None if clipped == text else clipped


def _clip_block(block: ToolResultBlock, seq: int, max_tokens: int,
                whole: bool) -> ToolResultBlock | None:
    text = block.output_text()
    clipped = _clip_text(text, seq, max_tokens, len(text) if whole else None)
    if clipped is None:
        return None
    rest = [] if isinstance(block.content, str) else [
        p for p in block.content if not isinstance(p, TextBlock)
    ]
    content: str | list[TextBlock | ImageBlock | DocumentBlock | OpaqueBlock] = (
        [TextBlock(text=clipped), *rest] if rest else clipped
    )
    return evolve(block, content=content)


def _clip_own_text(text: str, seq: int, max_tokens: int, whole: bool) -> str | None:
    """A message's own text (not a tool's output) clipped like one; None if it fits."""
    return _clip_text(text, seq, max_tokens, len(text) if whole else None,
                      tag=TEXT_CLIP_TAG, whole="message")


def _clip_text_block(block: TextBlock, seq: int, max_tokens: int,
                     whole: bool) -> TextBlock | None:
    clipped = _clip_own_text(block.text, seq, max_tokens, whole)
    return None if clipped is None else evolve(block, text=clipped)


def _clip_message(message: Message, seq: int, max_tokens: int, *,
                  whole: bool = True) -> Message | None:
    """``message`` with its oversized tool results and text clipped; None if none is.

    ``whole`` says the outputs are the originals (their length is the size the clip line names);
    False for outputs clipped before whose original is not at hand (the size is left unnamed).
    Only user messages: an assistant message is the model's own words (and its thinking fails
    its signature once changed, a clipped tool input is no longer the call that was made).
    """
    if message.role != "user":
        return None
    if isinstance(message.content, str):
        text = _clip_own_text(message.content, seq, max_tokens, whole)
        return None if text is None else evolve(message, content=text)
    changed = False
    blocks: list[Block] = []
    for block in message.content:
        clipped: Block | None = None
        if isinstance(block, ToolResultBlock):
            clipped = _clip_block(block, seq, max_tokens, whole)
        elif isinstance(block, TextBlock):
            clipped = _clip_text_block(block, seq, max_tokens, whole)
        if clipped is not None:
            blocks.append(clipped)
            changed = True
            continue
        blocks.append(block)
    return evolve(message, content=blocks) if changed else None


@overload
def clip_oversized(target: WindowItem, seq: int | None, max_tokens: int,
                   counter: TokenCounter | None = None, *,
                   original: Message | None = None) -> WindowItem: ...


@overload
def clip_oversized(target: Message, seq: int | None, max_tokens: int,
                   counter: TokenCounter | None = None, *,
                   original: Message | None = None) -> Message: ...


def clip_oversized(target: WindowItem | Message, seq: int | None, max_tokens: int,
                   counter: TokenCounter | None = None, *,
                   original: Message | None = None) -> WindowItem | Message:
    """Clip every tool result and text of ``target`` that is larger than ``max_tokens`` tokens.

    ``target`` is a window item (``seq`` defaults to its ``start_seq``; the result carries the
    ``"clipped"`` edit and a fresh token count) or a bare message, taken as the original
    (``seq`` required: it is the ledger seq the clip line names). Returns ``target`` itself when
    nothing is oversized.

    An item that was clipped before and is still too large (its policy shrank) is clipped again
    from ``original``, its ledger message, so the clip line names the original's size; without
    it the current text is clipped and the size left unnamed.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if isinstance(target, Message):
        if seq is None:
            raise ValueError("clip_oversized needs the ledger seq of a bare message")
        return _clip_message(target, seq, max_tokens) or target
    if target.kind != "message":
        return target
    at = target.start_seq if seq is None else seq
    if "clipped" not in target.edits:
        clipped = _clip_message(target.message, at, max_tokens)
    elif _clip_message(target.message, at, max_tokens, whole=False) is None:
        return target  # clipped before, and it fits
    else:
        clipped = ((_clip_message(original, at, max_tokens) if original is not None else None)
                   or _clip_message(target.message, at, max_tokens, whole=False))
    if clipped is None:
        return target
    return _with_edit(target, clipped, "clipped", counter or default_counter())


# --- mask-tool-results -------------------------------------------------------------------------

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
    message = evolve(item.message, content=content)
    return _with_edit(item, message, "thinking-dropped", counter or default_counter())


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
    (``memo``: as for :func:`mask_tool_results`)."""
    c = counter or default_counter()
    return _run(drop_thinking_item, items, eligible, tokens_to_save,
                size or (lambda it: item_tokens(it, c)), c, memo)


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
        raise ValueError("drop_recall_items takes recall items only")
    start, end = items[0].start_seq, items[-1].end_seq
    message = recall_dropped_message(start, end)
    return WindowItem(start_seq=start, end_seq=end, kind="recall", message=message,
                      edits=("dropped",), tokens=(counter or default_counter()).message(message))


# --- recall hints, rendered at read time ---------------------------------------------------------

_MASK_STUB = re.compile(re.escape(MASK_TAG) + r" to save context(?:: [^\n\];]*)?; "
                        r"ledger #(?P<seq>[0-9]+) holds it whole(?P<end>\.\])")
_SEAM = re.compile(r"^(?:" + re.escape(CLIP_TAG) + "|" + re.escape(TEXT_CLIP_TAG) + r") "
                   r"[^\n]*; ledger #(?P<seq>[0-9]+) holds the whole (?:output|message)"
                   r"(?P<end>\.\])$", re.MULTILINE)


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
        parts = list(block.content)
        for i, part in enumerate(parts):
            if isinstance(part, TextBlock):  # a clipped output keeps its text in the first part
                hinted = _hint_seams(part.text, seq, first=first)
                if hinted != part.text:
                    parts[i] = evolve(part, text=hinted)
                    return evolve(block, content=parts)
                return block
        return block
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
