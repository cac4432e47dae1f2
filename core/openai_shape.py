"""The OpenAI chat-completions shape, read into and written from the Anthropic shape sessionfold
stores (:mod:`.messages`).

:func:`from_openai` converts OpenAI messages (``tool_calls``, role ``"tool"``, roles
``"system"``/``"developer"``, content parts) into a :class:`~.messages.Conversation`, naming the
OpenAI message and field in every error (:func:`~.openai_write.to_openai` writes a conversation
back). What each field becomes is said where it is read, and for users in docs/integrating.md, "The
OpenAI chat shape".
:func:`openai_marker` and :func:`anthropic_marker` tell the two shapes apart from a message's
content (session files, the client's appends).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import InvalidMessageError
from .jsonvalues import (
    UnfitValue,
    UnreadableJSON,
    check_json_value,
    read_json,
)
from .messages import Conversation, Message, parse_messages, sdk_dict

__all__ = [
    "CUSTOM_INPUT_KEY",
    "EMPTY_REPLY_TEXT",
    "OPENAI_PART_TYPES",
    "RAW_ARGUMENTS_KEY",
    "anthropic_marker",
    "from_openai",
    "in_openai_terms",
    "leading_system_count",
    "openai_marker",
    "reserved_input",
]

# --- OpenAI chat-completions shape -------------------------------------------------------------
#
# What each part of an OpenAI message becomes (docs/integrating.md, "The OpenAI chat shape", says
# it for users): every field the chat-completions request takes on a message is read, converted or
# refused with a reason; a field it does not take is never shown to an OpenAI model again, so it
# is not kept (a reply's ``annotations``, a vendor's extras), except the reasoning some compatible
# servers return, which is the model's own thinking and is kept as such.

#: The content part types of the OpenAI chat shape. A block of any other type is the Anthropic
#: shape: a type sessionfold reads, or one it keeps as given (:class:`OpaqueBlock`).
OPENAI_PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
#: Message fields only the OpenAI shape has (its replies and requests).
_OPENAI_FIELDS = ("tool_calls", "tool_call_id", "function_call", "refusal", "reasoning_content",
                  "reasoning", "annotations", "audio")
_OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool")

#: The tool_use ``input`` key holding a function call's ``arguments`` text as the model wrote
#: it, when that text is not a JSON object (a call cut off mid-way, an array, a bare string).
#: The Messages API wants an object as ``input`` and refuses a field it does not know on a
#: block, so the text sits inside the input, under a key no tool can declare (the API refuses a
#: tool schema's property names outside ``[a-zA-Z0-9_.-]``; this one has a space).
#: :func:`~.openai_write.to_openai` writes the text back as it came.
RAW_ARGUMENTS_KEY = "arguments text"
#: The tool_use ``input`` key holding a custom tool call's free-text ``input`` (OpenAI's
#: ``{"type": "custom", "custom": {"name", "input"}}``); written back as a custom call.
CUSTOM_INPUT_KEY = "custom input"
#: The text stored for an assistant reply that said nothing (``content`` empty or null, no tool
#: call, no refusal): the reply happened and the Messages API refuses an empty message, so
#: the ledger keeps it in sessionfold's words.
EMPTY_REPLY_TEXT = "(empty reply)"

_DATA_URL = re.compile(r"data:(?P<media>[^;,]+);base64,(?P<data>.*)", re.DOTALL)
_PARTS_BY_ROLE: dict[str, frozenset[str]] = {
    "user": frozenset({"text", "image_url", "file", "input_audio"}),
    "assistant": frozenset({"text", "refusal"}),
    "tool": frozenset({"text", "image_url"}),
    "system": frozenset({"text"}),
    "developer": frozenset({"text"}),
}


def openai_marker(message: Any) -> str | None:
    """What makes ``message`` (a dict) the OpenAI chat shape, said for an error; None if
    nothing does: a ``tool``/``system``/``developer`` role, a field only that shape has, an
    assistant's null content, or a content part only it has (``image_url``, ``file``...)."""
    if not isinstance(message, Mapping):
        return None
    role = message.get("role")
    if role in ("tool", "system", "developer"):
        return f"role {role!r}"
    for name in _OPENAI_FIELDS:
        if name in message:
            return f"field {name!r}"
    content = message.get("content")
    if role == "assistant" and "content" in message and content is None:
        return "content null"
    for part in content if isinstance(content, list) else []:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in OPENAI_PART_TYPES and kind != "text":
            return f"a {kind} part"
    return None


def anthropic_marker(message: Any) -> str | None:
    """What makes ``message`` the Anthropic Messages shape, said for an error; None if nothing
    does: a :class:`Message`, or a content block of a type that is not an OpenAI part type
    (``tool_use``, ``thinking``, ``image``, or any type sessionfold keeps as given)."""
    if isinstance(message, Message):
        return "a Message"
    content = message.get("content") if isinstance(message, Mapping) else None
    for block in content if isinstance(content, list) else []:
        block = sdk_dict(block)
        kind = block.get("type") if isinstance(block, Mapping) else None
        if isinstance(kind, str) and kind not in OPENAI_PART_TYPES:
            return f"a {kind} block"
    return None


def leading_system_count(raw: Sequence[Any]) -> int:
    """How many messages open ``raw`` as ``system`` or ``developer`` messages: those are the
    system prompt, in either shape (a later one is an instruction given where it stands)."""
    count = 0
    for m in raw:
        if not (isinstance(m, Mapping) and m.get("role") in ("system", "developer")):
            break
        count += 1
    return count


def from_openai(raw: list[Any], *, check_pairing: bool = True) -> Conversation:
    """Convert OpenAI chat-completions messages to a :class:`Conversation`.

    Leading ``system``/``developer`` messages (before any other) become the system prompt; a
    later one stays at its place as a user message saying what it was (``[system message]``
    and its text). ``tool_calls`` become ``tool_use`` blocks and consecutive ``tool`` messages
    one user message of ``tool_result`` blocks; the rest is said in docs/integrating.md ("The
    OpenAI chat shape"). Error indexes refer to the OpenAI input. ``check_pairing=False`` leaves the
    pairing to the caller (an append: its first tool messages answer the ledger's last
    message, which is not in ``raw``; see :func:`in_openai_terms` for the errors found then).
    """
    system_parts, out, origins = _convert_openai(raw)
    try:
        messages = parse_messages(out, check_pairing=check_pairing)
    except InvalidMessageError as exc:
        raise _in_openai_terms(exc, origins) from None
    return Conversation(system="\n\n".join(system_parts), messages=messages)


def in_openai_terms(exc: InvalidMessageError, raw: list[Any]) -> InvalidMessageError:
    """``exc``, raised about the messages :func:`from_openai` made of ``raw`` (by a later
    check, such as the store's pairing with the ledger tail), addressed to ``raw`` instead:
    the index of the OpenAI message and its field (``tool_calls[0].id``, ``tool_call_id``...)."""
    _, _, origins = _convert_openai(raw)
    return _in_openai_terms(exc, origins)


class _Origin:
    """Where a converted block came from: the OpenAI message's index, the field that held it,
    and how an error inside the block is said there (``kind``, see :meth:`field_of`)."""

    __slots__ = ("field", "index", "kind")

    def __init__(self, index: int, field: str, kind: str = "whole") -> None:
        self.index, self.field, self.kind = index, field, kind

    def field_of(self, rest: str) -> str:
        """The OpenAI field of the block's sub-field ``rest`` (``.id``, ``.input.path``...)."""
        if self.kind == "result":
            return "tool_call_id" if rest.startswith(".tool_use_id") else "content"
        if self.kind in ("function", "custom"):
            if rest.startswith(".id"):
                return f"{self.field}.id"
            if rest.startswith(".name"):
                return f"{self.field}.{self.kind}.name"
            if rest.startswith(".input"):
                inner = "arguments" if self.kind == "function" else "input"
                return f"{self.field}.{self.kind}.{inner}"
        return self.field


def _convert_openai(raw: Sequence[Any]
                    ) -> tuple[list[str], list[dict[str, Any]], list[list[_Origin]]]:
    """The system prompt's parts, the Anthropic-shape dicts (not validated yet), and for each
    of them where each of its blocks came from, so errors found after conversion name the
    OpenAI input."""
    system_parts: list[str] = []
    out: list[dict[str, Any]] = []
    origins: list[list[_Origin]] = []
    lead = leading_system_count(raw)
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping):
            raise InvalidMessageError(f"a message must be an object, got {type(m).__name__}",
                                      index=i)
        role = _openai_role(m, i)
        if role in ("system", "developer"):
            text = _openai_text(m.get("content"), i, role)
            if i < lead:
                system_parts.append(text)
                continue
            # An instruction given at turn 30 must not apply from turn 0: it stays where it was.
            out.append({"role": "user", "content": f"[{role} message]\n{text}"})
            origins.append([_Origin(i, "content")])
            continue
        if role == "user":
            content, where = _openai_parts(m.get("content"), i, "user")
            out.append({"role": "user", "content": content})
            origins.append(where)
        elif role == "assistant":
            blocks, where = _openai_reply_blocks(m, i)
            out.append({"role": "assistant", "content": blocks})
            origins.append(where)
        else:
            block = _openai_tool_result(m, i)
            last = out[-1] if out else None
            if last and last["role"] == "user" and isinstance(last["content"], list) and all(
                b.get("type") == "tool_result" for b in last["content"]
            ):
                last["content"].append(block)
                origins[-1].append(_Origin(i, "content", "result"))
            else:
                out.append({"role": "user", "content": [block]})
                origins.append([_Origin(i, "content", "result")])
    return system_parts, out, origins


def _openai_role(m: Mapping[str, Any], index: int) -> str:
    """The message's role, once the fields the Anthropic shape has no place for are refused."""
    role = m.get("role")
    if role not in _OPENAI_ROLES:
        raise InvalidMessageError(
            f"role must be system, developer, user, assistant or tool, got {role!r:.40} (the "
            "deprecated 'function' role is not read: use tool_calls and tool messages)",
            index=index, field="role")
    # ``name`` (a participant's name) is not kept: the Anthropic shape sessionfold stores has
    # no place for it, and frameworks set it on every message (AutoGen's agents do), so
    # refusing it would refuse them outright. An agent whose model must tell speakers apart
    # says who speaks in the content.
    if m.get("function_call") is not None:
        raise InvalidMessageError(
            "the deprecated function_call is not read (it has no call id to pair a result "
            "with); send tool_calls", index=index, field="function_call")
    return str(role)


def _openai_text(content: Any, index: int, role: str) -> str:
    """A system, developer or mid-run message's content as text (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        blocks = [_openai_part(part, index, pos, role) for pos, part in enumerate(content)]
        return "\n".join(str(b["text"]) for b in blocks)
    raise InvalidMessageError(f"content must be a string or a list, got {type(content).__name__}",
                              index=index, field="content")


def _openai_parts(content: Any, index: int, role: str
                  ) -> tuple[str | list[dict[str, Any]], list[_Origin]]:
    """A user or tool message's content: a string as it is, a list of text parts joined into
    one string (as the model reads them), a list holding an image or a file as blocks."""
    if content is None or isinstance(content, str):
        return content or "", [_Origin(index, "content")]
    if not isinstance(content, list):
        raise InvalidMessageError(
            f"content must be a string or a list of parts, got {type(content).__name__}",
            index=index, field="content")
    blocks, where = [], []
    for pos, part in enumerate(content):
        block = _openai_part(part, index, pos, role)
        if block["type"] == "text" and not str(block["text"]).strip():
            continue  # the Messages API refuses an empty text block; it carries nothing
        blocks.append(block)
        where.append(_Origin(index, f"content[{pos}]"))
    if all(b["type"] == "text" for b in blocks):
        return "\n".join(str(b["text"]) for b in blocks), [_Origin(index, "content")]
    return blocks, where


def _openai_part(part: Any, index: int, pos: int, role: str) -> dict[str, Any]:
    """One OpenAI content part as the Anthropic block it becomes; InvalidMessageError naming
    the part when it has none (audio) or is not one a message of ``role`` holds."""
    field = f"content[{pos}]"
    kind = part.get("type") if isinstance(part, Mapping) else None
    if not isinstance(part, Mapping) or not isinstance(kind, str):
        raise InvalidMessageError("a content part must be an object with a 'type'",
                                  index=index, field=field)
    if kind not in _PARTS_BY_ROLE[role]:
        allowed = ", ".join(sorted(_PARTS_BY_ROLE[role]))
        raise InvalidMessageError(f"a {kind!r:.40} part is not one {role} messages hold in "
                                  f"the OpenAI shape (parts: {allowed})", index=index,
                                  field=field)
    if kind in ("text", "refusal"):
        text = part.get(kind)
        if not isinstance(text, str):
            raise InvalidMessageError(f"a {kind} part needs '{kind}' (a string)", index=index,
                                      field=f"{field}.{kind}")
        return {"type": "text", "text": text}
    if kind == "image_url":
        return _openai_image(part.get("image_url"), index, field)
    if kind == "file":
        return _openai_file(part.get("file"), index, field)
    raise InvalidMessageError(
        "an input_audio part has no counterpart in the Anthropic Messages shape sessionfold "
        "stores (no audio block); send its transcript as text", index=index, field=field)


def _openai_image(image_url: Any, index: int, field: str) -> dict[str, Any]:
    """An ``image_url`` part as an image block: a base64 source from a data URL, a url source
    from an http(s) URL. ``detail`` is a request to OpenAI's image processing, not kept."""
    url = image_url.get("url") if isinstance(image_url, Mapping) else None
    if not isinstance(url, str) or not url:
        raise InvalidMessageError("an image_url part needs image_url.url (an http(s) URL or a "
                                  "base64 data URL)", index=index, field=f"{field}.image_url")
    if url[:5].lower() == "data:":
        data = _DATA_URL.fullmatch(url)
        if data is None or not data["media"].lower().startswith("image/"):
            raise InvalidMessageError("an image's data URL must be data:image/<type>;base64,"
                                      "<data>", index=index, field=f"{field}.image_url.url")
        return {"type": "image", "source": {"type": "base64", "media_type": data["media"],
                                            "data": data["data"]}}
    if url.split(":", 1)[0].lower() not in ("http", "https"):
        raise InvalidMessageError(f"an image URL must be http(s) or a base64 data URL, got "
                                  f"{url[:40]!r}", index=index, field=f"{field}.image_url.url")
    return {"type": "image", "source": {"type": "url", "url": url}}


def _openai_file(file: Any, index: int, field: str) -> dict[str, Any]:
    """A ``file`` part holding a PDF as a data URL, as a document block (``filename`` its
    ``title``). A file OpenAI holds (``file_id``) or of another type has no counterpart."""
    if not isinstance(file, Mapping):
        raise InvalidMessageError("a file part needs a 'file' object", index=index, field=field)
    if file.get("file_id") is not None:
        raise InvalidMessageError(
            "a file part naming an uploaded file (file_id) cannot be converted: OpenAI holds "
            "the file; send its contents as file_data", index=index, field=f"{field}.file")
    data = _DATA_URL.fullmatch(file["file_data"]) if isinstance(file.get("file_data"),
                                                                str) else None
    if data is None or data["media"].lower() != "application/pdf":
        raise InvalidMessageError(
            "a file part converts when its file_data is a PDF as a base64 data URL "
            "(data:application/pdf;base64,...), which becomes a document block",
            index=index, field=f"{field}.file.file_data")
    block: dict[str, Any] = {"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": data["data"]}}
    if isinstance(file.get("filename"), str) and file["filename"]:
        block["title"] = file["filename"]
    return block


def _openai_reply_blocks(m: Mapping[str, Any], index: int
                         ) -> tuple[list[dict[str, Any]], list[_Origin]]:
    """An assistant message's blocks: its reasoning (a thinking block), its text, its refusal
    (text: the words the model said), an audio reply's transcript, its tool calls."""
    blocks: list[dict[str, Any]] = []
    where: list[_Origin] = []

    def add(block: dict[str, Any], origin: _Origin) -> None:
        blocks.append(block)
        where.append(origin)

    thoughts = {name: _optional_text(m, name, index)
                for name in ("reasoning_content", "reasoning")}
    for name, thought in thoughts.items():
        # A server that sends both (vLLM does, for either reader) sends the same text twice.
        if thought.strip() and not (name == "reasoning" and thought == thoughts[
                "reasoning_content"]):
            add({"type": "thinking", "thinking": thought}, _Origin(index, name))
    content = m.get("content")
    if isinstance(content, str):
        if content.strip():
            add({"type": "text", "text": content}, _Origin(index, "content"))
    elif isinstance(content, list):
        for pos, part in enumerate(content):
            block = _openai_part(part, index, pos, "assistant")
            if block["text"].strip():
                add(block, _Origin(index, f"content[{pos}]"))
    elif content is not None:
        raise InvalidMessageError(f"content must be a string, a list of parts or null, got "
                                  f"{type(content).__name__}", index=index, field="content")
    refusal = _optional_text(m, "refusal", index)
    if refusal.strip():
        add({"type": "text", "text": refusal}, _Origin(index, "refusal"))
    audio = m.get("audio")
    transcript = audio.get("transcript") if isinstance(audio, Mapping) else None
    if isinstance(transcript, str) and transcript.strip() and not any(
            b["type"] == "text" for b in blocks):
        add({"type": "text", "text": transcript}, _Origin(index, "audio"))
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise InvalidMessageError("tool_calls must be a list", index=index, field="tool_calls")
    for pos, call in enumerate(calls):
        block, kind = _openai_tool_use(call, index, pos)
        add(block, _Origin(index, f"tool_calls[{pos}]", kind))
    if not blocks:
        add({"type": "text", "text": EMPTY_REPLY_TEXT}, _Origin(index, "content"))
    return blocks, where


def _optional_text(m: Mapping[str, Any], name: str, index: int) -> str:
    value = m.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidMessageError(f"{name} must be a string, got {type(value).__name__}",
                                  index=index, field=name)
    return value


def _openai_tool_use(call: Any, index: int, pos: int) -> tuple[dict[str, Any], str]:
    """A tool call as a tool_use block, and its kind (``function`` or ``custom``)."""
    field = f"tool_calls[{pos}]"
    if not isinstance(call, Mapping) or not isinstance(call.get("id"), str) or not call["id"]:
        raise InvalidMessageError("a tool call needs an id", index=index, field=field)
    kind = call.get("type") or "function"
    if kind not in ("function", "custom"):
        raise InvalidMessageError(f"a tool call of type {kind!r:.40} is not read (function and "
                                  "custom calls are)", index=index, field=f"{field}.type")
    body = call.get(kind)
    if not isinstance(body, Mapping) or not isinstance(body.get("name"), str) or not body[
            "name"]:
        raise InvalidMessageError(f"a {kind} tool call needs {kind}.name", index=index,
                                  field=f"{field}.{kind}")
    name: str = body["name"]
    if kind == "custom":
        text = body.get("input")
        if not isinstance(text, str):
            raise InvalidMessageError("a custom tool call needs custom.input (a string)",
                                      index=index, field=f"{field}.custom.input")
        args: dict[str, Any] = {CUSTOM_INPUT_KEY: text}
        _check_input(args, index, f"{field}.custom.input")
    else:
        args = _openai_arguments(body.get("arguments"), index, f"{field}.function.arguments")
    return {"type": "tool_use", "id": call["id"], "name": name, "input": args}, kind


def _openai_arguments(raw: Any, index: int, field: str) -> dict[str, Any]:
    """A function call's ``arguments`` as the tool_use ``input`` they become: the object they
    hold, or, when they do not hold one (cut off, an array, a bare value), the text as the
    model wrote it under :data:`RAW_ARGUMENTS_KEY`. Absent or empty arguments are ``{}``.

    An object that would read back as that key (or :data:`CUSTOM_INPUT_KEY`) is kept as text
    too, so what :func:`~.openai_write.to_openai` writes back is what came in. Checked here,
    where the error can name the OpenAI field, by the limits every tool input is held to.
    """
    if raw is not None and not isinstance(raw, str):
        raise InvalidMessageError(f"arguments must be a JSON string, got {type(raw).__name__}",
                                  index=index, field=field)
    if not raw:
        return {}
    try:
        value = read_json(raw)
    except UnreadableJSON as exc:
        if not exc.malformed:  # valid JSON past what a reader takes: refused, not kept
            raise InvalidMessageError(f"arguments are {exc}", index=index, field=field) from None
        value = None
    args = value if isinstance(value, dict) and reserved_input(value) is None else {
        RAW_ARGUMENTS_KEY: raw}
    _check_input(args, index, field)
    return args


def _check_input(args: dict[str, Any], index: int, field: str) -> None:
    try:
        check_json_value(args, field)
    except UnfitValue as bad:
        inside = bad.path.removeprefix(field)
        reason = f"{bad.reason} (at {inside})" if inside else bad.reason
        raise InvalidMessageError(reason, index=index, field=field) from None


def reserved_input(args: Mapping[str, Any]) -> str | None:
    """The reserved key ``args`` consists of (raw arguments text or a custom input), if any:
    such a tool input is written back as the text it came as (:mod:`.openai_write`)."""
    if len(args) != 1:
        return None
    (key, value), = args.items()
    if key in (RAW_ARGUMENTS_KEY, CUSTOM_INPUT_KEY) and isinstance(value, str):
        return key
    return None


def _openai_tool_result(m: Mapping[str, Any], index: int) -> dict[str, Any]:
    call_id = m.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidMessageError("field required (a string)", index=index,
                                  field="tool_call_id")
    content, _ = _openai_parts(m.get("content"), index, "tool")
    return {"type": "tool_result", "tool_use_id": call_id, "content": content}


def _in_openai_terms(exc: InvalidMessageError, origins: list[list[_Origin]]
                     ) -> InvalidMessageError:
    """Re-address an error found in the converted messages to the OpenAI input."""
    if exc.index is None or not 0 <= exc.index < len(origins):
        return exc
    sources = origins[exc.index]
    part = re.match(r"content\[(\d+)\](.*)", exc.field or "")
    if part is None or int(part[1]) >= len(sources):
        return type(exc)(exc.reason, index=sources[0].index, field=exc.field)
    origin = sources[int(part[1])]
    return type(exc)(exc.reason, index=origin.index, field=origin.field_of(part[2]))
