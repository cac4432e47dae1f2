"""Session files: a conversation's text, in either shape, as ``sessionfold compact`` and
``sessionfold replay`` read it.

:func:`load_conversation_json` parses ``{"system", "messages"}`` or a bare list of messages (the
Anthropic or the OpenAI chat shape, :mod:`.openai_shape`), JSON Lines of messages, and Claude
Code's JSONL transcripts; a summary a file marks (``"summaries"``, or the spans an earlier
``sessionfold compact`` printed) loads as a summary. Whatever the text holds, the outcome is a
:class:`~.messages.Conversation` or an :class:`~.errors.InvalidMessageError` naming the source
(and its line, for JSON Lines). Reading the file is the caller's business (the engine does no
I/O): :func:`sessionfold.cli.files.load_conversation_file` reads one from disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InvalidMessageError
from .jsonvalues import (
    UnfitValue,
    UnreadableJSON,
    check_text,
    read_json,
)
from .messages import Conversation, SummaryMark, parse_messages
from .openai_shape import anthropic_marker, from_openai, leading_system_count, openai_marker
from .pydantic_errors import field_path, first_error

__all__ = ["load_conversation", "load_conversation_json"]

# --- session files -----------------------------------------------------------------------------

def load_conversation(data: Any) -> Conversation:
    """Load ``{"system": str, "messages": [...]}`` or a bare list of messages, in either shape.

    The shape is read from the messages (see :func:`_file_shape`). Leading ``system`` (or
    ``developer``) messages are the system prompt, after the object's ``"system"``, in either
    shape. An object may mark its summaries beside the messages, as ``sessionfold compact``
    writes them: ``"summaries": [{"index", "kind", "start_seq", "end_seq"}]`` (indexes of the
    loaded messages, after an OpenAI-shape file is converted). A file an earlier ``sessionfold
    compact`` wrote (``"record"`` and ``"spans"``, no ``"summaries"``) gets its marks from its
    spans. Any other file has none: every message is a plain message, whatever its text says.
    """
    if isinstance(data, list):
        raw_messages: Any = data
        system: Any = ""
    elif isinstance(data, Mapping):
        if "messages" not in data:
            raise InvalidMessageError("a session file needs a 'messages' list")
        raw_messages = data["messages"]
        system = data.get("system", "")
    else:
        raise InvalidMessageError(
            f"a session file holds an object or a list, got {type(data).__name__}"
        )
    if not isinstance(raw_messages, list):
        raise InvalidMessageError(f"'messages' must be a list, got {type(raw_messages).__name__}")
    parts = [_system_text(system)] if system else []
    if _file_shape(raw_messages) == "openai":
        conv = from_openai(raw_messages)
        parts += [conv.system] if conv.system else []
        messages = conv.messages
    else:
        lead = leading_system_count(raw_messages)
        parts += [_leading_system_text(m, i) for i, m in enumerate(raw_messages[:lead])]
        try:
            messages = parse_messages(raw_messages[lead:])
        except InvalidMessageError as exc:
            index = None if exc.index is None else exc.index + lead
            raise type(exc)(exc.reason, index=index, field=exc.field) from None
    conv = Conversation(system="\n\n".join(parts), messages=messages)
    if not isinstance(data, Mapping):
        return conv
    marks = _summary_marks(data, len(conv.messages))
    return conv.model_copy(update={"summaries": marks}) if marks else conv


def _file_shape(raw: Sequence[Any]) -> Literal["anthropic", "openai"]:
    """The shape of a session file's messages, read from their content.

    A block of a type that is not an OpenAI part type makes it the Anthropic shape, and a
    field, role or part only the chat shape has makes it OpenAI; leading system messages are
    neither (a session file in either shape may open with its prompt). Both kinds at once is
    an error; plain text, the same in both, reads as Anthropic unless it opens with a system
    message (then either reading gives the same conversation).
    """
    lead = leading_system_count(raw)
    anthropic = next(((i, why) for i, m in enumerate(raw) if (why := anthropic_marker(m))),
                     None)
    openai = next(((i, why) for i, m in enumerate(raw[lead:], lead)
                   if (why := openai_marker(m))), None)
    if anthropic is not None and openai is not None:
        raise InvalidMessageError(
            f"the messages mix the OpenAI chat shape (message {openai[0]}: {openai[1]}) and "
            f"the Anthropic Messages shape (message {anthropic[0]}: {anthropic[1]}); a "
            "session file holds one", index=max(openai[0], anthropic[0]))
    if anthropic is not None:
        return "anthropic"
    return "openai" if openai is not None or lead else "anthropic"


def _leading_system_text(m: Mapping[str, Any], index: int) -> str:
    if set(m) - {"role", "content"}:
        unknown = sorted(set(m) - {"role", "content"})
        raise InvalidMessageError(f"unknown field(s) {unknown}; a system message has role "
                                  "and content only", index=index)
    try:
        return _system_text(m.get("content"))
    except InvalidMessageError:
        raise InvalidMessageError("a system message's content is a string or a list of text "
                                  "blocks", index=index, field="content") from None


def _summary_marks(data: Mapping[str, Any], count: int) -> tuple[SummaryMark, ...]:
    """The summary marks of a session file object (see :func:`load_conversation`)."""
    if "summaries" in data:
        raw = data["summaries"]
        if raw is None:
            return ()
        if not isinstance(raw, list):
            raise InvalidMessageError(f"'summaries' must be a list, got {type(raw).__name__}")
        marks = [_summary_mark(entry, i) for i, entry in enumerate(raw)]
    elif "spans" in data and "record" in data:
        marks = _marks_from_spans(data["spans"], count)
    else:
        return ()
    seen: set[int] = set()
    for i, mark in enumerate(marks):
        if mark.index >= count:
            raise InvalidMessageError(f"summaries[{i}]: index {mark.index} is past the last "
                                      f"message ({count - 1})")
        if mark.index in seen:
            raise InvalidMessageError(f"summaries[{i}]: message {mark.index} is marked twice")
        seen.add(mark.index)
    return tuple(sorted(marks, key=lambda m: m.index))


def _summary_mark(raw: Any, position: int) -> SummaryMark:
    if not isinstance(raw, Mapping):
        raise InvalidMessageError(f"summaries[{position}]: a mark must be an object "
                                  '{"index", "kind", "start_seq", "end_seq"}, got '
                                  f"{type(raw).__name__}")
    try:
        return SummaryMark.model_validate(raw)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InvalidMessageError(f"{field_path(f'summaries[{position}]', loc)}: {msg}"
                                  ) from None


class _WrittenSpan(BaseModel):
    """The part of a span an earlier ``sessionfold compact`` printed that places its summary."""

    model_config = ConfigDict(extra="ignore")

    kind: Literal["summary", "notice"] = "summary"
    start_seq: Annotated[int, Field(strict=True, ge=0)]
    end_seq: Annotated[int, Field(strict=True, ge=0)]


def _marks_from_spans(spans: Any, count: int) -> list[SummaryMark]:
    """Marks for the output of a ``sessionfold compact`` that did not write them yet.

    That output is the window the visit left: from seq 0, each message stands for the next seq,
    or, when a span the visit folded opens there, for the whole span (its summary). Walking the
    messages that way places every span; a span that no message opens means the file was not
    written so (or was edited), and loading it as if it were would make a user's message a
    summary. Summaries an earlier visit left and this one did not fold are not in its spans:
    they load as plain messages, which costs a summary its rolling, never a user their words.
    """
    if not isinstance(spans, list):
        raise InvalidMessageError(f"'spans' must be a list, got {type(spans).__name__}")
    opening: dict[int, _WrittenSpan] = {}
    for i, raw in enumerate(spans):
        try:
            span = _WrittenSpan.model_validate(raw)
        except ValidationError as exc:
            loc, msg = first_error(exc)
            raise InvalidMessageError(f"{field_path(f'spans[{i}]', loc)}: {msg}") from None
        if span.end_seq < span.start_seq or span.start_seq in opening:
            raise InvalidMessageError(f"spans[{i}]: #{span.start_seq}–#{span.end_seq} is not a "
                                      "span sessionfold compact writes")
        opening[span.start_seq] = span
    marks: list[SummaryMark] = []
    seq = 0
    for index in range(count):
        if seq not in opening:
            seq += 1
            continue
        span = opening.pop(seq)
        marks.append(SummaryMark(index=index, kind=span.kind, start_seq=span.start_seq,
                                 end_seq=span.end_seq))
        seq = span.end_seq + 1
    if opening:
        first = min(opening.values(), key=lambda s: s.start_seq)
        raise InvalidMessageError(
            f"spans: no message stands for #{first.start_seq}–#{first.end_seq}; the spans do "
            "not match the messages (mark the summaries with 'summaries' instead)")
    return marks


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if isinstance(system, list) and all(isinstance(b, Mapping) and b.get("type") == "text"
                                        for b in system):
        return "\n\n".join(str(b.get("text", "")) for b in system)
    raise InvalidMessageError("'system' must be a string or a list of text blocks")


def load_conversation_json(text: str | bytes, *, source: str) -> Conversation:
    """Decode a session file's text (``source`` names it in every error) and load it (see
    :func:`load_conversation`).

    The text is UTF-8, with or without a byte order mark, and holds one JSON document or JSON
    Lines (``source`` ending in ``.jsonl``, or a first line that is a whole JSON object with
    more after it): one message a line, or the events of a Claude Code transcript (see
    :func:`_jsonl_messages`). Whatever it holds, the outcome is a Conversation or an
    InvalidMessageError: text that is not JSON, nested past what the decoder reads, with
    numbers it refuses, or with a lone surrogate anywhere sessionfold would write it back out
    (messages, system prompt).
    """
    lines: list[int] | None = None
    try:
        if isinstance(text, bytes):
            text = _decode_utf8(text)
        text = text.removeprefix("\ufeff")
        if source.lower().endswith(".jsonl") or _is_json_lines(text):
            data, lines = _jsonl_messages(text)
        else:
            data = read_json(text)
        conversation = load_conversation(data)
    except UnreadableJSON as exc:
        raise InvalidMessageError(f"{source}: {exc}") from None
    except InvalidMessageError as exc:
        raise _in_file(exc, source, lines) from None
    try:
        check_text(conversation.system, "system")
    except UnfitValue as bad:
        raise InvalidMessageError(f"{source}: {bad}") from None
    return conversation


def _in_file(exc: InvalidMessageError, source: str, lines: list[int] | None
             ) -> InvalidMessageError:
    """``exc`` saying which file (and for JSON Lines, which line) it is about; the same type,
    index and field, for callers that read them."""
    where = source
    if lines is not None and exc.index is not None and 0 <= exc.index < len(lines):
        where += f": line {lines[exc.index]}"
    named = type(exc)(exc.reason, index=exc.index, field=exc.field)
    # The error tree's text is "message I: FIELD: REASON"; the file goes in front of it.
    named.args = (f"{where}: {exc}",)
    return named


def _decode_utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableJSON(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def _is_json_lines(text: str) -> bool:
    """Whether ``text`` is JSON Lines rather than one document: its first line is a whole
    JSON object, and more follows it (one document spread over lines has no such first
    line; a single-line document has nothing after it)."""
    head, sep, rest = text.lstrip().partition("\n")
    if not sep or not rest.strip() or not head.rstrip().endswith("}"):
        return False
    try:
        return isinstance(json.loads(head), dict)
    except (ValueError, RecursionError):
        return False


def _jsonl_messages(text: str) -> tuple[list[Any], list[int]]:
    """The messages of a JSON Lines file, and the line each starts on.

    A line with a ``role`` is a message (either shape, a saved response too). A line with a
    ``type`` and no ``role`` is a transcript event (Claude Code's): a ``user`` or
    ``assistant`` event contributes its ``message``'s role and content, and every other event
    (summaries, system notes, file snapshots...) is skipped; so are side-chain events (a
    subagent's) in a file that holds the main thread too. Consecutive events of one role are
    one message: a transcript writes each block of a reply, and each tool result, on a line of
    its own, where the API saw one message. Blank lines are skipped; anything else is an error.
    """
    entries: list[tuple[int, Mapping[str, Any]]] = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            value = read_json(line, line=number)
        except UnreadableJSON as exc:
            raise UnreadableJSON(f"line {number}: {exc}") from None
        if not isinstance(value, Mapping) or not (
                "role" in value or isinstance(value.get("type"), str)):
            raise UnreadableJSON(f"line {number}: neither a message (an object with a 'role') "
                               "nor a transcript event (an object with a 'type')")
        entries.append((number, value))
    main_thread = any(_event_message(v) is not None and v.get("isSidechain") is not True
                      for _, v in entries if "role" not in v)
    messages: list[Any] = []
    lines: list[int] = []
    after_event = False
    for number, value in entries:
        if "role" in value:
            messages.append(value)
            lines.append(number)
            after_event = False
            continue
        message = _event_message(value)
        if message is None or (main_thread and value.get("isSidechain") is True):
            continue
        if after_event and messages[-1]["role"] == message["role"] and _joinable(
                messages[-1]) and _joinable(message):
            messages[-1] = {"role": message["role"],
                            "content": [*_blocks_of(messages[-1]), *_blocks_of(message)]}
        else:
            messages.append(message)
            lines.append(number)
        after_event = True
    return messages, lines


def _event_message(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """A transcript event's message (role and content only), if it is a user or assistant
    message; the message object's other keys (a response's id, model, usage) are the call's."""
    message = event.get("message")
    kind = event.get("type")
    if kind not in ("user", "assistant") or not isinstance(message, Mapping) or (
            message.get("role") != kind):
        return None
    return {key: message[key] for key in ("role", "content") if key in message}


def _joinable(message: Mapping[str, Any]) -> bool:
    return isinstance(message.get("content"), str | list)


def _blocks_of(message: Mapping[str, Any]) -> list[Any]:
    content = message["content"]
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content)
