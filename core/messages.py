"""Messages in the Anthropic Messages shape, and loading them from session files.

A message is ``{"role": "user" | "assistant", "content": str | [block, ...]}`` with blocks of the
types ``text``, ``tool_use``, ``tool_result``, ``thinking``, ``redacted_thinking``, ``image`` and
``document``. Fields a block type does not name (``citations``, ``cache_control``, ...) are kept
as given, so a message that no layer touched is written back byte for byte.

The system prompt is not a message: it lives beside the window (:class:`Conversation`), so no fold
can reach it.

Input is validated here, at the boundary: a malformed message raises
:class:`~sessionfold.core.errors.InvalidMessageError` naming the message index and the field,
never a pydantic traceback. The OpenAI chat-completions shape (``tool_calls``, role ``"tool"``,
role ``"system"``) is converted on load (:func:`from_openai`) and can be written back
(:func:`to_openai`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InvalidMessageError, ToolPairingError

__all__ = [
    "BLOCK_TYPES",
    "Block",
    "Conversation",
    "DocumentBlock",
    "ImageBlock",
    "Message",
    "RedactedThinkingBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "check_tool_pairing",
    "dump_messages",
    "from_openai",
    "load_conversation",
    "load_conversation_file",
    "parse_message",
    "parse_messages",
    "to_openai",
]


class _Block(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def model_post_init(self, context: Any, /) -> None:
        # ``type`` is a discriminator, not a default: a block built in code (``TextBlock(text=..)``)
        # must dump it too, or ``Message.to_json`` (exclude_unset) writes a block nobody can load.
        self.model_fields_set.add("type")


class TextBlock(_Block):
    type: Literal["text"] = "text"
    text: str


class ImageBlock(_Block):
    type: Literal["image"] = "image"
    source: dict[str, Any]


class DocumentBlock(_Block):
    type: Literal["document"] = "document"
    source: dict[str, Any]


ToolResultPart: TypeAlias = Annotated[
    TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")
]


class ToolUseBlock(_Block):
    type: Literal["tool_use"] = "tool_use"
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str = Field(min_length=1)
    content: str | list[ToolResultPart] = ""
    is_error: bool | None = None

    def output_text(self) -> str:
        """The text of the tool output (image and document parts are not text)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content if isinstance(p, TextBlock))


class ThinkingBlock(_Block):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


Block: TypeAlias = (
    TextBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ImageBlock
    | DocumentBlock
)

#: Every block type by its ``type`` tag (the store decodes stored JSON with the same map).
BLOCK_TYPES: dict[str, type[_Block]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
    "image": ImageBlock,
    "document": DocumentBlock,
}


class Message(BaseModel):
    """One message of a conversation. Immutable: layers build new messages."""

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant"]
    content: str | list[Block]

    def blocks(self) -> list[Block]:
        """The content as blocks (string content reads as one text block)."""
        if isinstance(self.content, str):
            return [TextBlock(text=self.content)]
        return list(self.content)

    def tool_use_ids(self) -> list[str]:
        return [b.id for b in self.blocks() if isinstance(b, ToolUseBlock)]

    def tool_result_ids(self) -> list[str]:
        return [b.tool_use_id for b in self.blocks() if isinstance(b, ToolResultBlock)]

    def has_tool_results(self) -> bool:
        return any(isinstance(b, ToolResultBlock) for b in self.blocks())

    def text(self) -> str:
        """The message's own text blocks joined (no tool output, no thinking)."""
        return "\n".join(b.text for b in self.blocks() if isinstance(b, TextBlock))

    def to_json(self) -> dict[str, Any]:
        """The message as plain JSON, with exactly the fields it was given."""
        return self.model_dump(mode="json", exclude_unset=True)


class Conversation(BaseModel):
    """A system prompt and the messages that follow it."""

    model_config = ConfigDict(frozen=True)

    system: str = ""
    messages: list[Message]


def _field_path(prefix: str, loc: Sequence[int | str]) -> str:
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _clean_loc(loc: Sequence[int | str]) -> list[int | str]:
    """The field path without pydantic's union-branch labels (``str``, ``list[...]``, tags)."""
    out: list[int | str] = []
    tag_after_index = tag_next = False
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in ("str", "int", "dict", "list")):
            tag_next = part.startswith("tagged-union")
            tag_after_index = part.startswith("list[tagged-union")
            continue
        if tag_next:  # the discriminator value pydantic inserts into the path
            tag_next = False
            continue
        out.append(part)
        if tag_after_index and isinstance(part, int):
            tag_after_index, tag_next = False, True
    return out


def _first_error(exc: ValidationError) -> tuple[Sequence[int | str], str]:
    # A union (``str | list[part]``) reports one error per branch; the deepest one is the branch
    # the input was meant for (a list input fails inside the list, not at "not a string").
    errors = exc.errors(include_url=False)
    err = max(errors, key=lambda e: len(e["loc"]))
    return _clean_loc(err["loc"]), err["msg"]


def _sdk_dict(raw: Any) -> Any:
    """A provider SDK's block object (anthropic's ``TextBlock``, ``ToolUseBlock``, ...) as the
    plain dict it stands for, so an agent can append ``response.content`` as it came back.
    Unset optional fields (``citations=None``) are left out, as the API itself leaves them."""
    if isinstance(raw, _Block | Mapping) or not hasattr(raw, "model_dump"):
        return raw
    return raw.model_dump(mode="json", exclude_none=True)


def _parse_block(raw: Any, index: int, position: int) -> Block:
    where = f"content[{position}]"
    raw = _sdk_dict(raw)
    if isinstance(raw, _Block):
        return raw  # type: ignore[return-value]
    if not isinstance(raw, Mapping):
        raise InvalidMessageError(
            f"a content block must be an object, got {type(raw).__name__}", index=index, field=where
        )
    kind = raw.get("type")
    cls = BLOCK_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        allowed = ", ".join(sorted(BLOCK_TYPES))
        raise InvalidMessageError(
            f"unknown block type {kind!r}; allowed: {allowed}", index=index, field=f"{where}.type"
        )
    try:
        block: Block = cls.model_validate(raw)  # type: ignore[assignment]
    except ValidationError as exc:
        loc, msg = _first_error(exc)
        raise InvalidMessageError(msg, index=index, field=_field_path(where, loc)) from None
    return block


def parse_message(raw: Any, index: int = 0) -> Message:
    """Validate one Anthropic-shape message; errors name ``index`` and the field."""
    if isinstance(raw, Message):
        return raw
    if not isinstance(raw, Mapping):
        raise InvalidMessageError(f"a message must be an object, got {type(raw).__name__}",
                                  index=index)
    role = raw.get("role")
    if role not in ("user", "assistant"):
        raise InvalidMessageError(
            f"role must be 'user' or 'assistant', got {role!r}", index=index, field="role"
        )
    if "content" not in raw:
        raise InvalidMessageError("field required", index=index, field="content")
    content = raw["content"]
    extra = set(raw) - {"role", "content"}
    if extra:
        raise InvalidMessageError(f"unknown field(s) {sorted(extra)}; a message has role and "
                                  "content only", index=index)
    if isinstance(content, str):
        return Message(role=role, content=content)
    if not isinstance(content, list):
        raise InvalidMessageError(
            f"content must be a string or a list of blocks, got {type(content).__name__}",
            index=index, field="content",
        )
    if not content:
        raise InvalidMessageError("content must not be an empty list", index=index,
                                  field="content")
    blocks = [_parse_block(b, index, i) for i, b in enumerate(content)]
    return Message(role=role, content=blocks)


def parse_messages(raw: Any, *, check_pairing: bool = True) -> list[Message]:
    """Validate a list of Anthropic-shape messages (see :func:`parse_message`).

    With ``check_pairing`` every ``tool_result`` must answer a ``tool_use`` of the message just
    before it (:func:`check_tool_pairing`).
    """
    if not isinstance(raw, list):
        raise InvalidMessageError(f"messages must be a list, got {type(raw).__name__}")
    messages = [parse_message(m, i) for i, m in enumerate(raw)]
    if check_pairing:
        check_tool_pairing(messages)
    return messages


def check_tool_pairing(messages: Sequence[Message], *, first_index: int = 0,
                       previous: Message | None = None) -> None:
    """Every tool_result answers a tool_use of the previous message, and sits in the next one.

    ``previous`` is the message before ``messages[0]`` (for appends to an existing ledger).
    A tool_use left unanswered by the *last* message is allowed: the agent is mid-call.
    """
    prev = previous
    for offset, msg in enumerate(messages):
        index = first_index + offset
        results = msg.tool_result_ids()
        if results:
            if msg.role != "user":
                raise ToolPairingError("tool_result blocks belong in a user message",
                                       index=index, field="content")
            asked = set(prev.tool_use_ids()) if prev is not None else set()
            for pos, block in enumerate(msg.blocks()):
                if isinstance(block, ToolResultBlock) and block.tool_use_id not in asked:
                    raise ToolPairingError(
                        f"orphan tool_result: tool_use_id {block.tool_use_id!r} does not answer a "
                        "tool_use of the previous message",
                        index=index, field=f"content[{pos}].tool_use_id",
                    )
        if prev is not None and prev.tool_use_ids():
            missing = set(prev.tool_use_ids()) - set(results)
            if missing:
                raise ToolPairingError(
                    f"tool_use id(s) {sorted(missing)} of the previous message are not answered "
                    "by this one",
                    index=index,
                )
        if msg.role == "user" and msg.tool_use_ids():
            raise ToolPairingError("tool_use blocks belong in an assistant message",
                                   index=index, field="content")
        prev = msg


def dump_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    return [m.to_json() for m in messages]


# --- OpenAI chat-completions shape -------------------------------------------------------------

def _looks_like_openai(raw: list[Any]) -> bool:
    for m in raw:
        if isinstance(m, Mapping) and (
            m.get("role") in ("system", "tool", "developer") or "tool_calls" in m
            or "tool_call_id" in m
        ):
            return True
    return False


def _openai_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for pos, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise InvalidMessageError("only text parts are supported in OpenAI content",
                                          index=index, field=f"content[{pos}]")
        return "\n".join(parts)
    raise InvalidMessageError(f"content must be a string or a list, got {type(content).__name__}",
                              index=index, field="content")


def from_openai(raw: list[Any]) -> Conversation:
    """Convert OpenAI chat-completions messages to a :class:`Conversation`.

    ``system``/``developer`` messages become the system prompt; ``tool_calls`` become
    ``tool_use`` blocks; consecutive ``tool`` messages become one user message of
    ``tool_result`` blocks. Error indexes refer to the OpenAI input.
    """
    system_parts: list[str] = []
    out: list[dict[str, Any]] = []
    # For each converted message, the OpenAI index of each of its parts (one per tool message
    # in a group of tool results), so errors found after conversion name the OpenAI input.
    origins: list[list[int]] = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping):
            raise InvalidMessageError(f"a message must be an object, got {type(m).__name__}",
                                      index=i)
        role = m.get("role")
        if role in ("system", "developer"):
            system_parts.append(_openai_text(m.get("content"), i))
        elif role == "user":
            out.append({"role": "user", "content": _openai_text(m.get("content"), i)})
            origins.append([i])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            text = _openai_text(m.get("content"), i)
            if text:
                blocks.append({"type": "text", "text": text})
            for pos, call in enumerate(m.get("tool_calls") or []):
                fn = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(fn, Mapping) or not call.get("id"):
                    raise InvalidMessageError("a tool call needs an id and a function",
                                              index=i, field=f"tool_calls[{pos}]")
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError as exc:
                    raise InvalidMessageError(f"arguments are not JSON ({exc.msg})", index=i,
                                              field=f"tool_calls[{pos}].function.arguments"
                                              ) from None
                if not isinstance(args, dict):
                    args = {"value": args}
                blocks.append({"type": "tool_use", "id": call["id"],
                               "name": fn.get("name") or "tool", "input": args})
            if not blocks:
                blocks.append({"type": "text", "text": ""})
            out.append({"role": "assistant", "content": blocks})
            origins.append([i])
        elif role == "tool":
            if not m.get("tool_call_id"):
                raise InvalidMessageError("field required", index=i, field="tool_call_id")
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"],
                     "content": _openai_text(m.get("content"), i)}
            last = out[-1] if out else None
            if last and last["role"] == "user" and isinstance(last["content"], list) and all(
                b.get("type") == "tool_result" for b in last["content"]
            ):
                last["content"].append(block)
                origins[-1].append(i)
            else:
                out.append({"role": "user", "content": [block]})
                origins.append([i])
        else:
            raise InvalidMessageError(
                f"role must be system, developer, user, assistant or tool, got {role!r}",
                index=i, field="role",
            )
    try:
        messages = parse_messages(out)
    except InvalidMessageError as exc:
        raise _in_openai_terms(exc, out, origins) from None
    return Conversation(system="\n\n".join(system_parts), messages=messages)


def _in_openai_terms(exc: InvalidMessageError, out: list[dict[str, Any]],
                     origins: list[list[int]]) -> InvalidMessageError:
    """Re-address an error found in the converted messages to the OpenAI input."""
    if exc.index is None or not 0 <= exc.index < len(origins):
        return exc
    sources = origins[exc.index]
    index, field = sources[0], exc.field
    part = re.match(r"content\[(\d+)\]", field or "")
    grouped = isinstance(out[exc.index]["content"], list) and all(
        b.get("type") == "tool_result" for b in out[exc.index]["content"])
    if grouped and part is not None and int(part[1]) < len(sources):
        index = sources[int(part[1])]
        field = "tool_call_id" if (field or "").endswith("tool_use_id") else "content"
    return type(exc)(exc.reason, index=index, field=field)


def to_openai(conversation: Conversation) -> list[dict[str, Any]]:
    """Write a :class:`Conversation` as OpenAI chat-completions messages (text and tools only)."""
    out: list[dict[str, Any]] = []
    if conversation.system:
        out.append({"role": "system", "content": conversation.system})
    for msg in conversation.messages:
        if msg.role == "assistant":
            calls = [
                {"id": b.id, "type": "function",
                 "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                for b in msg.blocks() if isinstance(b, ToolUseBlock)
            ]
            entry: dict[str, Any] = {"role": "assistant", "content": msg.text() or None}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
            continue
        for b in msg.blocks():
            if isinstance(b, ToolResultBlock):
                out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                            "content": b.output_text()})
        if msg.text():
            out.append({"role": "user", "content": msg.text()})
    return out


# --- session files -----------------------------------------------------------------------------

def load_conversation(data: Any) -> Conversation:
    """Load ``{"system": str, "messages": [...]}`` or a bare list of messages, in either shape."""
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
    if _looks_like_openai(raw_messages):
        conv = from_openai(raw_messages)
        if system:
            conv = Conversation(system=_system_text(system) + ("\n\n" + conv.system
                                                              if conv.system else ""),
                                messages=conv.messages)
        return conv
    return Conversation(system=_system_text(system), messages=parse_messages(raw_messages))


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if isinstance(system, list) and all(isinstance(b, Mapping) and b.get("type") == "text"
                                        for b in system):
        return "\n\n".join(str(b.get("text", "")) for b in system)
    raise InvalidMessageError("'system' must be a string or a list of text blocks")


def load_conversation_file(path: str | Path) -> Conversation:
    """Read a session file (see :func:`load_conversation`); errors say what is wrong."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidMessageError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidMessageError(f"{p}: cannot read ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidMessageError(f"{p}: not JSON (line {exc.lineno}: {exc.msg})") from None
    return load_conversation(data)

