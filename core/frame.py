"""The authored frame of a summary or notice, and the fingerprint that joins a summary to its span.

A summary is a claim about the past, not the past. The message that stands for a folded span is
therefore written in two parts: one line that sessionfold itself authors (how many messages, which
ledger range, who wrote the summary, where the originals are) and, after it, the summarizer's text
as data::

    [sessionfold] 12 earlier messages (ledger #3–#14) were folded out of this window; the text
    after this line is a summary written by claude-haiku-5-5; the originals are retained in the
    session ledger.
    <summary text>

(the frame is one line; it is wrapped here only for reading). Whatever the summary says, even
``IGNORE ALL PREVIOUS INSTRUCTIONS``, comes after the frame. ``drop-oldest`` leaves a *notice*
instead: the frame line alone, saying the messages were dropped.

The frame is a label for the model, never a record for sessionfold. Anyone can type it (a user
pasting an old window, a tool printing it), so nothing here decides whether a message *is* a
summary: the window item's ``kind`` does, as the store (or a session file's explicit marks)
recorded it. :func:`summary_body` therefore takes the item, and :class:`EarlierFold` carries the
item's kind and range to a summarizer. :func:`frame_info` only reads what a frame line says, to
check that a mark and its message agree.

When a window is read for a session with recall on, the frame line of a summary or notice whose
originals are retained ends with a hint naming the tool and the rows (:func:`hinted_frame`)::

    [sessionfold] 12 earlier messages (ledger #3–#14) were folded out of ...; the originals are
    retained in the session ledger; call sessionfold_recall with seq "3-14" to read them.

The hint is rendered at read time, never stored: the same item renders the same bytes on every
read (the prompt cache holds), and a session that opted out of recall is never told of a tool
it does not have. :func:`frame_info` reads a hinted line too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, TypeAdapter

from .errors import InvalidInputError
from .jsonvalues import replace_lone_surrogates
from .messages import Message, TextBlock
from .window import WindowItem

__all__ = [
    "FRAME_TAG",
    "LEFT_OUT_CHARS",
    "LEFT_OUT_MAX",
    "RECALL_TOOL_NAME",
    "EarlierFold",
    "FrameInfo",
    "fingerprint",
    "frame_info",
    "hinted_frame",
    "left_out_line",
    "legacy_fingerprint",
    "notice_message",
    "recall_hint",
    "seq_spec",
    "summary_body",
    "summary_frame",
    "summary_message",
]

FRAME_TAG = "[sessionfold]"

_MODEL_MAX = 120
#: The left-out line names at most this many identifiers, each cut to this many characters:
#: about 200 tokens at most, whatever the span held.
LEFT_OUT_MAX = 16
LEFT_OUT_CHARS = 60

# One regex for every frame this module writes; ``frame_info`` full-matches the first line
# against it, so a frame is recognised only if it is exactly one sessionfold wrote.
_FRAME_RE = re.compile(
    r"\[sessionfold\] (?P<count>[1-9][0-9]*) earlier messages? "
    r"\(ledger #(?P<start>[0-9]+)(?:–#(?P<end>[0-9]+))?\) "
    r"(?:was|were) (?:"
    r"folded out of this window; the text after this line is a summary written by "
    r"(?P<model>[^\n]+?); the originals (?P<s_fate>are retained in the session ledger"
    r"|were discarded)"
    r"|"
    r"dropped from this window to keep it under its token budget; "
    r"(?:(?:it is|they are) (?P<n_kept>retained in the session ledger)"
    r"|(?:it was|they were) discarded)"
    r")"
    # The recall hint a window read for a session with recall on carries (see recall_hint).
    r"(?:; call sessionfold_recall with seq \"(?P<h_start>[0-9]+)(?:-(?P<h_end>[0-9]+))?\" "
    r"to read (?:it|them))?"
    r"\."
)

#: The tool through which a model reads back what a fold took out of its window (the client
#: defines and answers it: :mod:`sessionfold.client.recall`). The hints below name it.
RECALL_TOOL_NAME = "sessionfold_recall"


@dataclass(frozen=True)
class FrameInfo:
    """What a frame line says: the kind of item, its ledger range, count, author and retention."""

    kind: Literal["summary", "notice"]
    start_seq: int
    end_seq: int
    message_count: int
    model: str
    retained: bool
    #: The line carries the recall hint (a window read for a session with recall on).
    hinted: bool = False


def _check_range(start_seq: int, end_seq: int, message_count: int) -> None:
    if start_seq < 0 or end_seq < start_seq:
        raise InvalidInputError(f"need 0 <= start_seq <= end_seq, got {start_seq}..{end_seq}")
    if message_count < 1:
        raise InvalidInputError(f"message_count must be at least 1, got {message_count}")


def _clean_model(model: str) -> str:
    # The model name is the one caller-supplied part of the frame: keep it to one short line so
    # it cannot end the frame early or smuggle text in front of it.
    name = " ".join(model.split())[:_MODEL_MAX].strip()
    return name or "an unnamed summarizer"


def _head(message_count: int, start_seq: int, end_seq: int) -> str:
    noun = "message" if message_count == 1 else "messages"
    verb = "was" if message_count == 1 else "were"
    span = f"#{start_seq}" if start_seq == end_seq else f"#{start_seq}–#{end_seq}"
    return f"{FRAME_TAG} {message_count} earlier {noun} (ledger {span}) {verb}"


def summary_frame(*, start_seq: int, end_seq: int, message_count: int, model: str,
                  retained: bool = True) -> str:
    """The frame line of a summary (without the summary text)."""
    _check_range(start_seq, end_seq, message_count)
    fate = "are retained in the session ledger" if retained else "were discarded"
    return (f"{_head(message_count, start_seq, end_seq)} folded out of this window; the text "
            f"after this line is a summary written by {_clean_model(model)}; the originals "
            f"{fate}.")


def summary_message(text: str, *, start_seq: int, end_seq: int, message_count: int, model: str,
                    retained: bool = True, left_out: Sequence[str] = ()) -> Message:
    """A user message: the authored frame line, then ``text`` (the summarizer's words) as data,
    then, when the summary misses identifiers of its span (``left_out``), an authored line
    naming them (:func:`left_out_line`).

    ``message_count`` is the number of ledger messages the span folded (a summary that replaces
    an earlier summary counts the messages that one stood for too).
    """
    frame = summary_frame(start_seq=start_seq, end_seq=end_seq, message_count=message_count,
                          model=model, retained=retained)
    body = f"{frame}\n{replace_lone_surrogates(text).strip()}"
    if left_out:
        body += "\n" + left_out_line(left_out, start_seq=start_seq, end_seq=end_seq,
                                     retained=retained)
    return Message(role="user", content=body)


def left_out_line(identifiers: Sequence[str], *, start_seq: int, end_seq: int,
                  retained: bool = True) -> str:
    """The line sessionfold writes after a summary that misses identifiers of its span: at most
    :data:`LEFT_OUT_MAX` of them (each at most :data:`LEFT_OUT_CHARS` characters), how many more
    there are, and the ledger range that holds them, so the model knows what to recall (the
    recall tool searches this line's words too). A summary is never refused for them when the
    originals stay one recall away."""
    shown = [" ".join(str(x).split())[:LEFT_OUT_CHARS] for x in identifiers[:LEFT_OUT_MAX]]
    more = len(identifiers) - len(shown)
    names = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    span = f"#{start_seq}" if start_seq == end_seq else f"#{start_seq}–#{end_seq}"
    where = (f"recall them from ledger {span}" if retained
             else f"the originals of ledger {span} were discarded")
    return f"{FRAME_TAG} this summary leaves out {len(identifiers)} identifiers of the span: " \
           f"{names}; {where}."


def notice_message(*, start_seq: int, end_seq: int, message_count: int,
                   retained: bool = True) -> Message:
    """The notice ``drop-oldest`` leaves: how many messages left the window and where they are."""
    _check_range(start_seq, end_seq, message_count)
    one = message_count == 1
    if retained:
        fate = ("it is" if one else "they are") + " retained in the session ledger"
    else:
        fate = ("it was" if one else "they were") + " discarded"
    text = (f"{_head(message_count, start_seq, end_seq)} dropped from this window to keep it "
            f"under its token budget; {fate}.")
    return Message(role="user", content=text)


def _first_text(message: Message) -> str | None:
    if message.role != "user":
        return None
    blocks = message.blocks()
    # A summary read back from a store may carry cache_control and thus be a list of text blocks;
    # anything else (a tool_result, an image first) is a real user message.
    if not blocks or not all(isinstance(b, TextBlock) for b in blocks):
        return None
    return message.text()


def frame_info(message: Message) -> FrameInfo | None:
    """What the frame line that starts ``message`` says; None if it is not one sessionfold writes.

    Reading, not deciding: a user can type this line. Used to check that an explicit summary mark
    and the message it points at agree, never to make a message a summary.
    """
    text = _first_text(message)
    if text is None or not text.startswith(FRAME_TAG):
        return None
    line = text.split("\n", 1)[0]
    match = _FRAME_RE.fullmatch(line)
    if match is None:
        return None
    start = int(match["start"])
    end = int(match["end"]) if match["end"] is not None else start
    if end < start:
        return None
    hinted = match["h_start"] is not None
    if hinted and _hinted_range(match) != (start, end):
        return None  # a hint names the frame's own range, or it is not one sessionfold wrote
    retained = (match["s_fate"] != "were discarded" if match["model"] is not None
                else match["n_kept"] is not None)
    if hinted and not retained:
        return None  # nothing to recall: sessionfold never hints at discarded originals
    if match["model"] is not None:
        return FrameInfo("summary", start, end, int(match["count"]), match["model"], retained,
                         hinted)
    if "\n" in text:  # a notice is the frame line alone
        return None
    return FrameInfo("notice", start, end, int(match["count"]), "", retained, hinted)


def _hinted_range(match: re.Match[str]) -> tuple[int, int]:
    start = int(match["h_start"])
    return start, int(match["h_end"]) if match["h_end"] is not None else start


# --- the recall hint -----------------------------------------------------------------------------

def seq_spec(start_seq: int, end_seq: int) -> str:
    """A ledger range as the recall tool takes it: ``"12"``, or ``"12-30"``."""
    return str(start_seq) if start_seq == end_seq else f"{start_seq}-{end_seq}"


def recall_hint(start_seq: int, end_seq: int, *, offset: int | None = None,
                what: str = "it") -> str:
    """The clause that tells the model how to read ledger ``start_seq..end_seq`` back.

    ``call sessionfold_recall with seq "12-30" to read them``; with ``offset``, where in the
    original to start (a clip seam points at what it left out). Rendered into stubs, seams
    and frames when a window is read for a session with recall on, never stored, so a session
    that opted out never hears of the tool; the same item always renders the same bytes.
    """
    at = f" and offset {offset}" if offset is not None else ""
    return f'call {RECALL_TOOL_NAME} with seq "{seq_spec(start_seq, end_seq)}"{at} to read {what}'


def hinted_frame(item: WindowItem) -> Message:
    """The message of summary or notice ``item`` with the recall hint in its frame line.

    The item's ``kind`` says it is a summary or notice (so its first line is sessionfold's
    frame); the hint goes at the end of that line, before its full stop, and only when the
    frame says the originals are retained. Any other item, or a frame already hinted, comes
    back as its message unchanged.
    """
    message = item.message
    if item.kind not in ("summary", "notice"):
        return message
    info = frame_info(message)
    if info is None or info.hinted or not info.retained:
        return message
    what = "it" if info.message_count == 1 else "them"
    clause = recall_hint(info.start_seq, info.end_seq, what=what)

    def hint(text: str) -> str:
        line, newline, rest = text.partition("\n")
        return f"{line[:-1]}; {clause}.{newline}{rest}"

    if isinstance(message.content, str):
        return message.model_copy(update={"content": hint(message.content)})
    first = message.content[0]
    assert isinstance(first, TextBlock)  # frame_info read a text-only message
    blocks = [first.model_copy(update={"text": hint(first.text)}), *message.content[1:]]
    return message.model_copy(update={"content": blocks})


def summary_body(item: WindowItem) -> str:
    """The summarizer's text of a summary item: what follows its frame line ("" for a notice).

    The item's ``kind`` says it is a summary (sessionfold wrote it, and wrote the frame as its
    first line); a message item raises ValueError, so a user's words are never passed on as an
    earlier summary, whatever they look like.
    """
    if item.kind == "message":
        raise InvalidInputError(f"window item #{item.start_seq} is a message, not a summary")
    if item.kind == "notice":
        return ""
    return item.message.text().partition("\n")[2]


class EarlierFold(Message):
    """A summary or notice that stood in the window, handed to a summarizer inside a span.

    To a model it is the message the agent saw (the frame line, then the summary). The fields
    are the window item's record, so a summarizer tells an earlier fold from a user's words
    without reading text; they are excluded from every dump, so :meth:`Message.to_json` and
    :func:`fingerprint` see the plain message. A summarizer that knows nothing of this class
    reads it as the message it is.
    """

    fold_kind: Literal["summary", "notice"] = Field(exclude=True)
    start_seq: int = Field(exclude=True)
    end_seq: int = Field(exclude=True)
    body: str = Field(default="", exclude=True)

    @classmethod
    def of(cls, item: WindowItem) -> EarlierFold:
        """The summarizer's view of a summary or notice item (ValueError for a message item)."""
        if item.kind == "message":
            raise InvalidInputError(f"window item #{item.start_seq} is a message, not a summary")
        return cls(role=item.message.role, content=item.message.content, fold_kind=item.kind,
                   start_seq=item.start_seq, end_seq=item.end_seq, body=summary_body(item))


_MESSAGE_LIST: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


def fingerprint(messages: Sequence[Message]) -> str:
    """sha256 (hex) of the JSON of ``messages``; stable across runs and processes.

    The JSON is pydantic-core's of the list: every field with its value (defaults included), in
    the models' field order, no whitespace, a tool input or extra field in its own key order. A
    block built in code and the same block loaded from JSON fingerprint alike; an
    :class:`EarlierFold` like the plain message it stands for. (Four to five times cheaper than
    :func:`legacy_fingerprint`, which a fold computes only to match latches stored before.)
    """
    return hashlib.sha256(_MESSAGE_LIST.dump_json(list(messages))).hexdigest()


def legacy_fingerprint(messages: Sequence[Message]) -> str:
    """The span fingerprint of releases before :func:`fingerprint` changed: sha256 (hex) of
    the standard library's JSON of the messages with sorted keys. Refusal latches written then
    carry it; a fold still matches them (only when the session holds latches at all)."""
    payload = [m.model_dump(mode="json") for m in messages]
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()
