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

:func:`is_summary` recognises both by the exact frame line at the start of the message, so a
user who types similar words is not mistaken for a summary.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .messages import Message, TextBlock

__all__ = [
    "FRAME_TAG",
    "FrameInfo",
    "fingerprint",
    "frame_info",
    "is_summary",
    "notice_message",
    "summary_body",
    "summary_frame",
    "summary_message",
]

FRAME_TAG = "[sessionfold]"

_MODEL_MAX = 120

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
    r")\."
)


@dataclass(frozen=True)
class FrameInfo:
    """What a frame line says: the kind of item, its ledger range, count, author and retention."""

    kind: Literal["summary", "notice"]
    start_seq: int
    end_seq: int
    message_count: int
    model: str
    retained: bool


def _check_range(start_seq: int, end_seq: int, message_count: int) -> None:
    if start_seq < 0 or end_seq < start_seq:
        raise ValueError(f"need 0 <= start_seq <= end_seq, got {start_seq}..{end_seq}")
    if message_count < 1:
        raise ValueError(f"message_count must be at least 1, got {message_count}")


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
                    retained: bool = True) -> Message:
    """A user message: the authored frame line, then ``text`` (the summarizer's words) as data.

    ``message_count`` is the number of ledger messages the span folded (a summary that replaces
    an earlier summary counts the messages that one stood for too).
    """
    frame = summary_frame(start_seq=start_seq, end_seq=end_seq, message_count=message_count,
                          model=model, retained=retained)
    return Message(role="user", content=f"{frame}\n{text.strip()}")


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
    """Parse the frame line that starts ``message``; None if it is not one sessionfold wrote."""
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
    if match["model"] is not None:
        return FrameInfo("summary", start, end, int(match["count"]), match["model"],
                         match["s_fate"] != "were discarded")
    if "\n" in text:  # a notice is the frame line alone
        return None
    return FrameInfo("notice", start, end, int(match["count"]), "",
                     match["n_kept"] is not None)


def is_summary(message: Message) -> bool:
    """True for a summary or a notice sessionfold wrote (the exact frame line starts it)."""
    return frame_info(message) is not None


def summary_body(message: Message) -> str:
    """The summarizer's text after the frame ("" for a notice).

    Raises ValueError for a message that is not a summary, so a user's words are never passed
    on as an earlier summary by mistake.
    """
    info = frame_info(message)
    if info is None:
        raise ValueError("not a sessionfold summary or notice")
    if info.kind == "notice":
        return ""
    return message.text().split("\n", 1)[1] if "\n" in message.text() else ""


def fingerprint(messages: Sequence[Message]) -> str:
    """sha256 (hex) of the canonical JSON of ``messages``; stable across runs and processes.

    Canonical means every field with its value, sorted keys, no whitespace: a block built in code
    and the same block loaded from JSON fingerprint alike.
    """
    payload = [m.model_dump(mode="json") for m in messages]
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()
