"""``clip-oversized``: one message larger than ``max_item_ratio × budget`` keeps its head and tail.

Agents print 450 k-token outputs and fan out reads (eight parallel results, each under the cap,
can hold twice the budget inside the keep window): sent whole they overflow the model, dropped
they lose the newest step. So a user message's texts (a tool's output, the user's own words, a
text document's data) are clipped until the item as a whole fits the cap, each keeping its head
and tail around a line that names its full size and the ledger seq holding it whole. Images,
binary documents and blocks sessionfold does not read are only counted; assistant messages are
never clipped in the window (:func:`clip_own_words` clips one on an outgoing request only).
This is the only change ever made inside the keep window; the ledger keeps every message whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias, overload

from .errors import InvalidInputError
from .evolve import evolve
from .layers import with_edit
from .messages import Block, DocumentBlock, Message, TextBlock, ToolResultBlock, ToolUseBlock
from .tokens import TokenCounter, count_text, default_counter
from .window import WindowItem

__all__ = ["CLIP_TAG", "TEXT_CLIP_TAG", "clip_oversized", "clip_own_words", "clip_text"]

CLIP_TAG = "[sessionfold clipped this tool output:"
TEXT_CLIP_TAG = "[sessionfold clipped this text:"

_HEAD_SHARE = 0.5


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
        raise InvalidInputError(f"max_tokens must be positive, got {max_tokens}")
    c = counter or default_counter()
    if isinstance(target, Message):
        if seq is None:
            raise InvalidInputError("clip_oversized needs the ledger seq of a bare message")
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
    return with_edit(target, clipped, "clipped", c)


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
    return with_edit(item, evolve(message, content=blocks), "clipped", c)
