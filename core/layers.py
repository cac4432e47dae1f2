"""The cheap layers of a fold, as pure functions on window items.

- :func:`clip_oversized` (always on, applied when a message enters the window): a message item
  larger than ``max_item_ratio × budget`` has its texts clipped until the item as a whole fits
  that cap, framing included; each clipped text keeps its head and tail, with a line between
  them naming its full size and the ledger seq that holds it whole. Agents do print 450 k-token
  outputs, and fan out reads: eight parallel tool results each under the cap can hold twice the
  budget, sit in the keep window and leave a fold nothing to take. Sent whole they overflow the
  model, dropped they lose the newest step. What is clipped is text: a tool's output (its
  string, or each text part in place), a user's own text (a string content, a text block: a
  pasted 10 MB log is no easier for the model to take than a tool's, and the first user
  message, the task, still shows its beginning and its end) and a text document's data (the
  same words in another wrapper). Images, binary documents (PDFs) and blocks sessionfold does
  not read are never edited, only counted. Assistant messages are never clipped. This is the
  only change ever made inside the keep window; the ledger keeps every message whole.
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
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, overload

from .frame import hinted_frame, recall_hint
from .messages import (
    Block,
    DocumentBlock,
    Message,
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
    "as_sent",
    "clip_oversized",
    "clip_own_words",
    "clip_text",
    "drop_recall_items",
    "drop_thinking",
    "drop_thinking_item",
    "has_thinking",
    "hinted_stubs",
    "item_tokens",
    "last_assistant",
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
    if not _exceeds(text, max_tokens):
        return None
    return _cut(text, seq, max_tokens, len(text))


def _cut(text: str, seq: int, max_tokens: int, total: int | None, *,
         tag: str = CLIP_TAG, whole: str = "output") -> str | None:
    """Head and tail of ``text`` (known to be over ``max_tokens``) with the seam line between
    them; the result is at most ``max_tokens`` (from :data:`_MIN_SHARE` on). None if that
    changes nothing.

    ``total`` is the whole text's size (None: unknown, not named); ``tag`` and ``whole`` name
    what was clipped on the seam line (a tool output by default).
    """
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


#: The fewest tokens a clipped text is given: its seam line alone takes up to ~63 (two sizes in
#: the trillions and a ledger seq), so a smaller share would come out longer than its room.
_MIN_SHARE = 64

#: What a clip does to one clippable text, given the text and whether it is a tool's output
#: (else the message's own words): its replacement, or None to keep it as it is.
_TextEdit: TypeAlias = Callable[[str, bool], str | None]


def _edit_document(block: DocumentBlock, edit: _TextEdit, output: bool) -> DocumentBlock:
    data = block.source.get("data")
    if block.source.get("type") != "text" or not isinstance(data, str):
        return block  # a PDF, a file or URL reference: bytes, not text; never clipped
    new = edit(data, output)
    return block if new is None else evolve(block, source={**block.source, "data": new})


def _edit_result(block: ToolResultBlock, edit: _TextEdit) -> ToolResultBlock:
    if isinstance(block.content, str):
        new = edit(block.content, True)
        return block if new is None else evolve(block, content=new)
    # Part by part, in place: an image keeps its position among the texts, and a part's own
    # fields (cache_control, citations) stay on it.
    parts = list(block.content)
    for pos, part in enumerate(parts):
        if isinstance(part, TextBlock):
            text = edit(part.text, True)
            if text is not None:
                parts[pos] = evolve(part, text=text)
        elif isinstance(part, DocumentBlock):
            parts[pos] = _edit_document(part, edit, True)
    if all(a is b for a, b in zip(parts, block.content, strict=True)):
        return block
    return evolve(block, content=parts)


def _edit_texts(message: Message, edit: _TextEdit) -> Message:
    """``message`` with each of its clippable texts replaced by ``edit``'s answer (the same
    object when ``edit`` keeps them all).

    The clippable texts, in order: a string content, a text block, a text document's data
    (``source.type == "text"``: the same words in another wrapper), and inside a tool result its
    string content or its text parts and text documents. Images, binary documents and opaque
    blocks are never edited; every field of every block is kept.
    """
    if isinstance(message.content, str):
        new = edit(message.content, False)
        return message if new is None else evolve(message, content=new)
    blocks: list[Block] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            text = edit(block.text, False)
            blocks.append(block if text is None else evolve(block, text=text))
        elif isinstance(block, DocumentBlock):
            blocks.append(_edit_document(block, edit, False))
        elif isinstance(block, ToolResultBlock):
            blocks.append(_edit_result(block, edit))
        else:
            blocks.append(block)
    if all(a is b for a, b in zip(blocks, message.content, strict=True)):
        return message
    return evolve(message, content=blocks)


def _texts(message: Message) -> list[str]:
    """The clippable texts of ``message``, in the order :func:`_edit_texts` visits them."""
    found: list[str] = []

    def note(text: str, output: bool) -> None:
        found.append(text)

    _edit_texts(message, note)
    return found


def _blank(text: str, output: bool) -> str | None:
    return "" if text else None


def _upper_tokens(text: str) -> int:
    """A bound no count of ``text`` exceeds (a token is at least one byte), found without
    counting."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _count_upto(text: str, cap: int) -> int:
    """``count_text(text)``, or ``cap + 1`` when it is more than ``cap`` (a huge text is
    counted only as far as needed: :func:`_exceeds` reads it ``6 × cap`` characters at a time,
    so a text of one such step is counted once, exactly)."""
    if len(text) <= max(cap, 1) * 6:
        return count_text(text)
    return cap + 1 if _exceeds(text, cap) else count_text(text)


def _shares(sizes: Sequence[int], room: int) -> list[int | None]:
    """What each text may keep so that together they fit ``room`` tokens: None for a text
    kept whole, else the tokens it is clipped to.

    Texts no larger than an equal share of what is left keep whole, smallest first; the larger
    ones share the rest equally, not in proportion to their sizes (a 500 k-token output beside
    a 20 k-token one does not leave the smaller a sliver: both keep the same room, and what
    the model reads of each is its head and tail anyway). A share is never below
    :data:`_MIN_SHARE`: with more texts than seam lines fit, the item stays over.
    """
    shares: list[int | None] = [None] * len(sizes)
    order = sorted(range(len(sizes)), key=sizes.__getitem__)
    left = room
    for n, pos in enumerate(order):
        share = max(left, 0) // (len(order) - n)
        if sizes[pos] <= share:
            left -= sizes[pos]
            continue
        share = max(share, _MIN_SHARE)
        for rest in order[n:]:
            shares[rest] = share if sizes[rest] > share else None
        break
    return shares


def _clip_message(message: Message, seq: int, max_tokens: int, counter: TokenCounter, *,
                  whole: bool = True) -> Message | None:
    """``message`` with its clippable texts clipped so that it fits ``max_tokens`` as a whole,
    framing included; None if it fits already.

    The room for the texts is the limit less what cannot be clipped (framing, images, binary
    documents, opaque blocks); when those take more than three quarters of the limit the texts
    still keep a quarter of it: the item is over the limit either way, and the user's words
    beside a screenshot are not cut to a seam line for a cap that images alone break. Within
    the room, texts share it as :func:`_shares` says, each clipped one keeping its head and tail.

    ``whole`` says the texts are the originals (their length is the size the clip line names);
    False for texts clipped before whose original is not at hand (the size is left unnamed).
    Only user messages: an assistant message is the model's own words (and its thinking fails
    its signature once changed, a clipped tool input is no longer the call that was made).
    """
    if message.role != "user":
        return None
    texts = _texts(message)
    if not texts:
        return None
    fixed = counter.fresh(_edit_texts(message, _blank))
    room = max(max_tokens - fixed, max_tokens // 4)
    if sum(_upper_tokens(t) for t in texts) <= room:
        return None  # most messages: known to fit without counting their texts
    sizes = [_count_upto(t, max_tokens) for t in texts]
    if sum(sizes) <= room:
        return None
    shares = iter(_shares(sizes, room))

    def clip(text: str, output: bool) -> str | None:
        share = next(shares)
        if share is None:
            return None
        total = len(text) if whole else None
        if output:
            return _cut(text, seq, share, total)
        return _cut(text, seq, share, total, tag=TEXT_CLIP_TAG, whole="message")

    clipped = _edit_texts(message, clip)
    return None if clipped is message else clipped


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
    """Clip the texts of ``target`` so that it fits ``max_tokens`` tokens as a whole.

    The cap is per item, not per block: a user message holding eight parallel tool outputs
    (agents fan out reads), each under the limit, is clipped as one (see :func:`_clip_message`:
    what cannot be clipped is counted first, outputs small enough keep whole, the large ones
    share the rest).

    ``target`` is a window item (``seq`` defaults to its ``start_seq``; the result carries the
    ``"clipped"`` edit and a fresh token count) or a bare message, taken as the original
    (``seq`` required: it is the ledger seq the clip line names). Returns ``target`` itself when
    it fits.

    An item that was clipped before and is still too large (its policy shrank) is clipped again
    from ``original``, its ledger message, so the clip line names the original's size; without
    it the current text is clipped and the size left unnamed. Clipping is idempotent: a clipped
    item fits its limit (unless images and binary documents alone break it, see
    :func:`_clip_message`), and its clipped texts fit their shares again.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    c = counter or default_counter()
    if isinstance(target, Message):
        if seq is None:
            raise ValueError("clip_oversized needs the ledger seq of a bare message")
        return _clip_message(target, seq, max_tokens, c) or target
    if target.kind != "message":
        return target
    if target.tokens is not None and target.tokens <= max_tokens:
        return target  # the item fits as a whole (most appends: their count is at hand)
    at = target.start_seq if seq is None else seq
    if "clipped" not in target.edits:
        clipped = _clip_message(target.message, at, max_tokens, c)
    elif _clip_message(target.message, at, max_tokens, c, whole=False) is None:
        return target  # clipped before, and it fits
    else:
        clipped = ((_clip_message(original, at, max_tokens, c) if original is not None
                    else None)
                   or _clip_message(target.message, at, max_tokens, c, whole=False))
    if clipped is None:
        return target
    return _with_edit(target, clipped, "clipped", c)


def _strings(value: Any, found: list[str]) -> None:
    """The strings inside a tool call's input, depth first, in the order :func:`_rebuilt`
    replaces them."""
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, found)
    elif isinstance(value, list):
        for item in value:
            _strings(item, found)


def _rebuilt(value: Any, new: Iterator[str]) -> Any:
    if isinstance(value, str):
        return next(new)
    if isinstance(value, dict):
        return {key: _rebuilt(item, new) for key, item in value.items()}
    if isinstance(value, list):
        return [_rebuilt(item, new) for item in value]
    return value


def clip_own_words(item: WindowItem, max_tokens: int,
                   counter: TokenCounter | None = None) -> WindowItem:
    """An assistant message's text and tool-call inputs clipped so that it fits ``max_tokens``
    (head and tail of each, the seam naming the ledger seq that holds it whole): the pre-send
    guard's last resort for one reply larger than the budget (a model that wrote a 200 k-
    character thought), on the outgoing request only. The stored window never holds it: a
    clipped call is no longer the call that was made, but a request that cannot be sent at all
    stops the agent. Thinking, images and opaque blocks are not touched; ``item`` itself when
    it fits or is not an assistant message."""
    c = counter or default_counter()
    message = item.message
    if item.kind != "message" or message.role != "assistant" or isinstance(message.content,
                                                                          str):
        return item
    texts: list[str] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            _strings(block.input, texts)
    if not texts:
        return item
    fixed = c.fresh(evolve(message, content=[
        evolve(b, text="") if isinstance(b, TextBlock) else
        evolve(b, input=_rebuilt(b.input, iter([""] * len(texts)))) if isinstance(
            b, ToolUseBlock) else b for b in message.content]))
    room = max(max_tokens - fixed, max_tokens // 4)
    sizes = [_count_upto(t, max_tokens) for t in texts]
    if sum(sizes) <= room:
        return item
    shares = _shares(sizes, room)
    clipped = [text if share is None else (
        _cut(text, item.start_seq, share, len(text), tag=TEXT_CLIP_TAG, whole="message")
        or text) for text, share in zip(texts, shares, strict=True)]
    new = iter(clipped)
    blocks: list[Block] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            blocks.append(evolve(block, text=next(new)))
        elif isinstance(block, ToolUseBlock):
            blocks.append(evolve(block, input=_rebuilt(block.input, new)))
        else:
            blocks.append(block)
    return _with_edit(item, evolve(message, content=blocks), "clipped", c)


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
