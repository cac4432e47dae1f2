"""Messages in the Anthropic Messages shape, and loading them from session files.

A message is ``{"role": "user" | "assistant", "content": str | [block, ...]}`` with blocks of the
types ``text``, ``tool_use``, ``tool_result``, ``thinking``, ``redacted_thinking``, ``image`` and
``document``. Fields a block type does not name (``citations``, ``cache_control``, ...) are kept
as given, so a message that no layer touched is written back byte for byte.

The system prompt is not a message: it lives beside the window (:class:`Conversation`), so no fold
can reach it.

Input is validated here, at the boundary: a malformed message raises
:class:`~sessionfold.core.errors.InvalidMessageError` naming the message index and the field,
never a pydantic traceback. Beyond its shape, a message is refused when it holds what a reader
or the Messages API would refuse later (:func:`parse_message`): a value nested deeper than
:data:`MAX_NESTING_DEPTH`, a lone surrogate, a non-JSON number (see :mod:`.jsonvalues`), a
tool_use id used twice in the conversation, two results for one call, or no text at all. An empty
text block beside other content is dropped (the API refuses it, and its own responses hold such
blocks). The OpenAI chat-completions shape (``tool_calls``, role ``"tool"``, role ``"system"``)
is converted on load (:func:`from_openai`) and can be written back (:func:`to_openai`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
)

from .errors import InvalidMessageError, ToolPairingError
from .jsonvalues import (
    MAX_INT_DIGITS,
    MAX_NESTING_DEPTH,
    UnfitValue,
    check_json_value,
    check_text,
    find_lone_surrogate,
)

__all__ = [
    "BLOCK_TYPES",
    "MAX_INT_DIGITS",
    "MAX_NESTING_DEPTH",
    "Block",
    "Conversation",
    "DocumentBlock",
    "ImageBlock",
    "Message",
    "OpaqueBlock",
    "RedactedThinkingBlock",
    "SummaryMark",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "check_tool_pairing",
    "dump_messages",
    "evolve",
    "find_lone_surrogate",
    "from_openai",
    "in_openai_terms",
    "load_conversation",
    "load_conversation_file",
    "load_conversation_json",
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


class OpaqueBlock(_Block):
    """A block of a type sessionfold does not interpret, kept exactly as it was given.

    The Messages API adds block types as it adds features: a server tool's call and result
    (``server_tool_use``, ``web_search_tool_result``, ``web_fetch_tool_result``,
    ``code_execution_tool_result``...), an MCP connector's (``mcp_tool_use``,
    ``mcp_tool_result``), ``container_upload``, ``search_result`` parts inside a tool result.
    An agent appends what the API answered, so refusing an unknown type would lose a reply the
    agent has paid for. Such a block is stored and sent back as given, counted by its JSON,
    and never edited by a layer (a server tool's result sits in the assistant's own message,
    which no layer rewrites); the API, not sessionfold, judges whether it is well formed.

    Its ``type`` must look like the API's tags (lowercase letters, digits and ``_``) and may
    not be one of the types sessionfold knows (those are validated as what they are).
    """

    type: str

    @field_validator("type")
    @classmethod
    def _unknown_tag(cls, value: str) -> str:
        if value in BLOCK_TYPES:  # only a tool result's part gets here with a known type
            raise ValueError(f"a {value!r} block is not a tool result part; a part is text, "
                             "image, document, or a type sessionfold keeps as given")
        if not _OPAQUE_TAG.fullmatch(value):
            raise ValueError(f"block type {value[:40]!r} is not a block type tag (lowercase "
                             "letters, digits and '_', at most 64 characters)")
        near = _near_known_tag(value)
        if near is not None:
            raise ValueError(f"unknown block type {value!r}: did you mean {near!r}? (a type "
                             "sessionfold does not read is kept as given, but not one a letter "
                             "or two from a type it reads)")
        return value


#: What an opaque block's type tag may be: the shape of the Messages API's own tags.
_OPAQUE_TAG = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: The tool result part types sessionfold reads; any other part is an :class:`OpaqueBlock`.
_PART_TAGS = frozenset({"text", "image", "document"})


def _near_known_tag(tag: str) -> str | None:
    """The type sessionfold reads that ``tag`` is a slip of (at most two edits away), if any:
    ``txt`` or ``tool_reslt`` is a typo to refuse, where ``search_result`` is the API's own."""
    for known in BLOCK_TYPES:
        if abs(len(known) - len(tag)) <= 2 and _edits(tag, known) <= 2:
            return known
    return None


def _edits(a: str, b: str) -> int:
    """Levenshtein distance of two short strings."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def _part_tag(raw: Any) -> str:
    kind = raw.get("type") if isinstance(raw, Mapping) else getattr(raw, "type", None)
    return kind if kind in _PART_TAGS else "opaque"


ToolResultPart: TypeAlias = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ImageBlock, Tag("image")]
    | Annotated[DocumentBlock, Tag("document")] | Annotated[OpaqueBlock, Tag("opaque")],
    Discriminator(_part_tag),
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
    | OpaqueBlock
)

#: Every block type sessionfold reads, by its ``type`` tag (the store decodes stored JSON with
#: the same map); a block of any other type is an :class:`OpaqueBlock`.
BLOCK_TYPES: dict[str, type[_Block]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
    "image": ImageBlock,
    "document": DocumentBlock,
}


_Model = TypeVar("_Model", bound=BaseModel)
_new = object.__new__
_set = object.__setattr__


def evolve(model: _Model, **changes: Any) -> _Model:
    """``model.model_copy(update=changes)`` for a model of this package: a copy with those
    fields set (and counted as set, so ``to_json`` writes them), nothing validated.

    pydantic's generic path (``__copy__``, then the update) was a tenth of a fold's masking;
    this is the same result built in one step. Only declared fields may change (a key that is
    not one raises ValueError: ``model_copy`` would file it under the extras), and only models
    without private attributes are copied (TypeError: their ``__pydantic_private__`` would
    have to be copied too). ``tests/core/test_messages.py`` compares it with ``model_copy`` on
    every kind of model.
    """
    cls = type(model)
    fields = _EVOLVABLE.get(cls)
    if fields is None:
        fields = _evolvable(cls)
    if not fields.issuperset(changes):
        unknown = sorted(set(changes) - fields)
        raise ValueError(f"{cls.__name__} has no field {unknown[0]!r}")
    copy = _new(cls)
    _set(copy, "__dict__", {**model.__dict__, **changes})
    _set(copy, "__pydantic_fields_set__", model.__pydantic_fields_set__.union(changes))
    extra = model.__pydantic_extra__
    _set(copy, "__pydantic_extra__", None if extra is None else dict(extra))
    _set(copy, "__pydantic_private__", None)
    return copy


#: The fields of each model class :func:`evolve` has copied (checked once per class).
_EVOLVABLE: dict[type[BaseModel], frozenset[str]] = {}


def _evolvable(cls: type[BaseModel]) -> frozenset[str]:
    if cls.__private_attributes__:
        raise TypeError(f"{cls.__name__} has private attributes; copy it with model_copy")
    fields = _EVOLVABLE[cls] = frozenset(cls.__pydantic_fields__)
    return fields


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

    # String content is one text block: the readers below answer for it without building one
    # (a block validates its text again, which costs a fold's planner dearly on long outputs).

    def tool_use_ids(self) -> list[str]:
        if isinstance(self.content, str):
            return []
        return [b.id for b in self.content if isinstance(b, ToolUseBlock)]

    def tool_result_ids(self) -> list[str]:
        if isinstance(self.content, str):
            return []
        return [b.tool_use_id for b in self.content if isinstance(b, ToolResultBlock)]

    def has_tool_results(self) -> bool:
        return not isinstance(self.content, str) and any(
            isinstance(b, ToolResultBlock) for b in self.content)

    def text(self) -> str:
        """The message's own text blocks joined (no tool output, no thinking)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(b.text for b in self.content if isinstance(b, TextBlock))

    def to_json(self) -> dict[str, Any]:
        """The message as plain JSON, with exactly the fields it was given."""
        return self.model_dump(mode="json", exclude_unset=True)


class SummaryMark(BaseModel):
    """A session file's word that message ``index`` is a summary (or notice) sessionfold wrote,
    standing for ledger seqs ``start_seq..end_seq``.

    Marks sit beside the messages (a message with an extra field is one the Messages API
    rejects), and only a mark makes a message a summary: a message whose text merely starts like
    a frame line is a user's words.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: Annotated[int, Field(strict=True, ge=0)]
    kind: Literal["summary", "notice"] = "summary"
    start_seq: Annotated[int, Field(strict=True, ge=0)]
    end_seq: Annotated[int, Field(strict=True, ge=0)]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Conversation(BaseModel):
    """A system prompt, the messages that follow it, and which of them are summaries."""

    model_config = ConfigDict(frozen=True)

    system: str = ""
    messages: list[Message]
    #: The summaries (and notices) among ``messages``, as the session file marked them.
    summaries: tuple[SummaryMark, ...] = ()


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
    if err["type"] == "string_unicode":  # said as the checks after validation say it
        return _clean_loc(err["loc"]), ("a lone surrogate; text must be valid Unicode (UTF-8 "
                                        "cannot encode it)")
    return _clean_loc(err["loc"]), err["msg"].removeprefix("Value error, ")


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
    if not isinstance(kind, str) or not kind:
        raise InvalidMessageError(
            f"a content block needs a 'type' (a string), got {kind!r:.40}", index=index,
            field=f"{where}.type")
    # A type sessionfold does not read is kept as it came (OpaqueBlock): the API's newer blocks.
    cls: type[_Block] = BLOCK_TYPES.get(kind, OpaqueBlock)
    try:
        block: Block = cls.model_validate(raw)  # type: ignore[assignment]
    except ValidationError as exc:
        loc, msg = _first_error(exc)
        raise InvalidMessageError(msg, index=index, field=_field_path(where, loc)) from None
    return block


def _not_a_message(raw: Any, index: int) -> InvalidMessageError:
    what = type(raw).__name__
    if isinstance(raw, str):  # e.g. what ``list(one_message)`` hands on: its keys
        what = f"the string {raw[:40]!r}"
    return InvalidMessageError(
        f'a message must be an object {{"role", "content"}}, got {what}; messages are passed '
        "as a list: [message] for one", index=index)


def parse_message(raw: Any, index: int = 0) -> Message:
    """Validate one Anthropic-shape message; errors name ``index`` and the field.

    Past its shape, the message must be one every reader and the Messages API take back
    (:func:`_checked`): a :class:`Message` built in code is checked the same way.
    """
    if isinstance(raw, Message):
        return _checked(raw, index)
    if not isinstance(raw, Mapping):
        raise _not_a_message(raw, index)
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
        return _checked(Message(role=role, content=content), index)
    if not isinstance(content, list):
        raise InvalidMessageError(
            f"content must be a string or a list of blocks, got {type(content).__name__}",
            index=index, field="content",
        )
    if not content:
        raise InvalidMessageError("content must not be an empty list", index=index,
                                  field="content")
    blocks = [_parse_block(b, index, i) for i, b in enumerate(content)]
    return _checked(Message(role=role, content=blocks), index)


# --- what the shape alone does not say -----------------------------------------------------------

def _checked(message: Message, index: int) -> Message:
    """``message`` if every reader and the Messages API take it back, without its empty text
    blocks; InvalidMessageError naming the field otherwise.

    Every value must be JSON every reader takes (:mod:`.jsonvalues`: nesting, surrogates,
    numbers), a tool_use id and a result's tool_use_id appear once in the message, and there
    must be some text or block left once empty text blocks are dropped.
    """
    try:
        if isinstance(message.content, str):
            check_text(message.content, "content")
        else:
            for pos, block in enumerate(message.content):
                for name, value in block:
                    check_json_value(value, f"content[{pos}].{name}")
    except UnfitValue as bad:
        raise InvalidMessageError(bad.reason, index=index, field=bad.path) from None
    _check_unique_ids(message, index)
    return _without_empty_text(message, index)


def _check_unique_ids(message: Message, index: int) -> None:
    """A tool_use id, and the tool_use_id a result answers, appear once in ``message``."""
    uses: dict[str, int] = {}
    answers: dict[str, int] = {}
    for pos, block in enumerate(message.blocks()):
        if isinstance(block, ToolUseBlock):
            seen, key, field = uses, block.id, f"content[{pos}].id"
            what = "tool_use id"
        elif isinstance(block, ToolResultBlock):
            seen, key, field = answers, block.tool_use_id, f"content[{pos}].tool_use_id"
            what = "tool_result answering tool_use id"
        else:
            continue
        if key in seen:
            raise ToolPairingError(
                f"a second {what} {key!r} (content[{seen[key]}] has it too); each tool call has "
                "one id and one result", index=index, field=field)
        seen[key] = pos


def _is_empty_text(block: object) -> bool:
    return isinstance(block, TextBlock) and not block.text.strip()


def _without_empty_text(message: Message, index: int) -> Message:
    """``message`` without empty (or blank) text blocks, which the Messages API refuses.

    They carry nothing, and the API's own responses hold them (an empty text before a tool
    call), so an agent appending a response as it came must not fail on one: it is dropped, in
    a tool result's parts too (a result left with none has the empty output ``""``). A message
    left with nothing to say is refused, naming it.
    """
    if isinstance(message.content, str):
        if not message.content.strip():
            raise InvalidMessageError("content is empty; the Messages API refuses a message "
                                      "without text", index=index, field="content")
        return message
    kept: list[Block] = []
    for block in message.content:
        if _is_empty_text(block):
            continue
        if isinstance(block, ToolResultBlock) and not isinstance(block.content, str) and any(
                _is_empty_text(p) for p in block.content):
            parts = [p for p in block.content if not _is_empty_text(p)]
            block = block.model_copy(update={"content": parts or ""})
        kept.append(block)
    if not kept:
        raise InvalidMessageError(
            "content is empty: every block is an empty text block, which the Messages API "
            "refuses", index=index, field="content")
    if len(kept) == len(message.content) and all(a is b for a, b in zip(kept, message.content,
                                                                          strict=True)):
        return message
    return message.model_copy(update={"content": kept})


def parse_messages(raw: Any, *, check_pairing: bool = True) -> list[Message]:
    """Validate a list of Anthropic-shape messages (see :func:`parse_message`).

    With ``check_pairing`` every ``tool_result`` must answer a ``tool_use`` of the message just
    before it, and no tool_use id is used twice (:func:`check_tool_pairing`).
    """
    if isinstance(raw, Mapping):
        what = "one message (an object)" if "role" in raw else "an object"
        raise InvalidMessageError(f"messages must be a list; got {what}: pass [message] for one")
    if not isinstance(raw, list):
        raise InvalidMessageError(f"messages must be a list, got {type(raw).__name__}")
    messages = [parse_message(m, i) for i, m in enumerate(raw)]
    if check_pairing:
        check_tool_pairing(messages)
    return messages


def check_tool_pairing(messages: Sequence[Message], *, first_index: int = 0,
                       previous: Message | None = None) -> None:
    """Every tool_result answers a tool_use of the previous message, and sits in the next one;
    no tool_use id is used twice (the Messages API refuses a request that repeats one).

    ``previous`` is the message before ``messages[0]`` (for appends to an existing ledger; the
    store checks the ids against the whole ledger itself). A tool_use left unanswered by the
    *last* message is allowed: the agent is mid-call.
    """
    prev = previous
    used: dict[str, str] = {}
    if previous is not None:
        used.update((i, f"the message before message {first_index}")
                    for i in previous.tool_use_ids())
    for offset, msg in enumerate(messages):
        index = first_index + offset
        _check_new_ids(msg, index, used)
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


def _check_new_ids(message: Message, index: int, used: dict[str, str]) -> None:
    """ToolPairingError if a tool_use id of ``message`` is in ``used`` (id -> the message that
    used it), which then gains them."""
    _check_unique_ids(message, index)
    for pos, block in enumerate(message.blocks()):
        if isinstance(block, ToolUseBlock):
            if block.id in used:
                raise ToolPairingError(
                    f"tool_use id {block.id!r} was used before, by {used[block.id]}; "
                    "tool_use ids must be unique in a conversation",
                    index=index, field=f"content[{pos}].id")
            used[block.id] = f"message {index}"


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


def _openai_arguments(raw: Any, index: int, pos: int) -> dict[str, Any]:
    """A tool call's ``arguments`` (a JSON string) as the tool_use ``input`` they become.

    Checked here, where the error can name the OpenAI field: decoded by the same rules as a
    session file (:func:`_decode_json`), and held to the same limits as any tool input.
    """
    field = f"tool_calls[{pos}].function.arguments"
    if raw is not None and not isinstance(raw, str):
        raise InvalidMessageError(f"arguments must be a JSON string, got {type(raw).__name__}",
                                  index=index, field=field)
    try:
        args = _decode_json(raw or "{}")
    except _Undecodable as exc:
        raise InvalidMessageError(f"arguments are {exc}", index=index, field=field) from None
    if not isinstance(args, dict):
        args = {"value": args}
    try:
        check_json_value(args, field)
    except UnfitValue as bad:
        inside = bad.path.removeprefix(field)
        reason = f"{bad.reason} (at {inside})" if inside else bad.reason
        raise InvalidMessageError(reason, index=index, field=field) from None
    return args


def from_openai(raw: list[Any], *, check_pairing: bool = True) -> Conversation:
    """Convert OpenAI chat-completions messages to a :class:`Conversation`.

    ``system``/``developer`` messages become the system prompt; ``tool_calls`` become
    ``tool_use`` blocks; consecutive ``tool`` messages become one user message of
    ``tool_result`` blocks. Error indexes refer to the OpenAI input. ``check_pairing=False``
    leaves the pairing to the caller (an append: its first tool messages answer the ledger's
    last message, which is not in ``raw``; see :func:`in_openai_terms` for the errors found
    then).
    """
    system_parts, out, origins = _convert_openai(raw)
    try:
        messages = parse_messages(out, check_pairing=check_pairing)
    except InvalidMessageError as exc:
        raise _in_openai_terms(exc, out, origins) from None
    return Conversation(system="\n\n".join(system_parts), messages=messages)


def in_openai_terms(exc: InvalidMessageError, raw: list[Any]) -> InvalidMessageError:
    """``exc``, raised about the messages :func:`from_openai` made of ``raw`` (by a later
    check, such as the store's pairing with the ledger tail), addressed to ``raw`` instead:
    the index of the OpenAI message, and ``tool_call_id`` or ``content`` for a part of a
    group of tool results."""
    _, out, origins = _convert_openai(raw)
    return _in_openai_terms(exc, out, origins)


def _convert_openai(raw: list[Any]) -> tuple[list[str], list[dict[str, Any]], list[list[int]]]:
    """The system prompt's parts, the Anthropic-shape dicts (not validated yet), and for each
    of them the OpenAI index of each of its parts (one per tool message in a group of tool
    results), so errors found after conversion name the OpenAI input."""
    system_parts: list[str] = []
    out: list[dict[str, Any]] = []
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
                args = _openai_arguments(fn.get("arguments"), i, pos)
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
    return system_parts, out, origins


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
    """Load ``{"system": str, "messages": [...]}`` or a bare list of messages, in either shape.

    An object may mark its summaries beside the messages, as ``sessionfold compact`` writes
    them: ``"summaries": [{"index", "kind", "start_seq", "end_seq"}]`` (indexes of the loaded
    messages, after an OpenAI-shape file is converted). A file an earlier ``sessionfold compact``
    wrote (``"record"`` and ``"spans"``, no ``"summaries"``) gets its marks from its spans. Any
    other file has none: every message is a plain message, whatever its text says.
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
    if _looks_like_openai(raw_messages):
        conv = from_openai(raw_messages)
        if system:
            conv = Conversation(system=_system_text(system) + ("\n\n" + conv.system
                                                              if conv.system else ""),
                                messages=conv.messages)
    else:
        conv = Conversation(system=_system_text(system), messages=parse_messages(raw_messages))
    if not isinstance(data, Mapping):
        return conv
    marks = _summary_marks(data, len(conv.messages))
    return conv.model_copy(update={"summaries": marks}) if marks else conv


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
        loc, msg = _first_error(exc)
        raise InvalidMessageError(f"{_field_path(f'summaries[{position}]', loc)}: {msg}"
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
            loc, msg = _first_error(exc)
            raise InvalidMessageError(f"{_field_path(f'spans[{i}]', loc)}: {msg}") from None
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


class _Undecodable(Exception):
    """JSON text no reader should be handed: the message says why (``not JSON (...)``)."""


def _decode_json(text: str | bytes) -> Any:
    """``json.loads``, with what it raises beyond JSONDecodeError turned into _Undecodable.

    Python's decoder recurses once per level (RecursionError near 1,000 levels, before any
    limit of ours can be checked) and refuses integers longer than the interpreter's digit limit
    with a bare ValueError; bytes must be UTF-8.
    """
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Undecodable(f"not JSON (line {exc.lineno}: {exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise _Undecodable(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except RecursionError:
        raise _Undecodable(f"JSON nested too deep to read (a value inside a message may nest "
                           f"{MAX_NESTING_DEPTH} levels)") from None
    except ValueError as exc:  # int-to-string digit limit; the message quotes no input
        raise _Undecodable(f"JSON with a number of more than {sys.get_int_max_str_digits()} "
                           f"digits ({exc}); a message holds integers of at most "
                           f"{MAX_INT_DIGITS} digits") from None


def load_conversation_json(text: str | bytes, *, source: str) -> Conversation:
    """Decode a session file's text (``source`` names it in errors) and load it (see
    :func:`load_conversation`).

    Whatever the text holds, the outcome is a Conversation or an InvalidMessageError: text that
    is not JSON, nested past what the decoder reads, with numbers it refuses, or with a lone
    surrogate anywhere sessionfold would write it back out (messages, system prompt).
    """
    try:
        data = _decode_json(text)
    except _Undecodable as exc:
        raise InvalidMessageError(f"{source}: {exc}") from None
    conversation = load_conversation(data)
    try:
        check_text(conversation.system, "system")
    except UnfitValue as bad:
        raise InvalidMessageError(f"{source}: {bad}") from None
    return conversation


def load_conversation_file(path: str | Path) -> Conversation:
    """Read a session file (see :func:`load_conversation_json`); errors say what is wrong."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InvalidMessageError(f"{p}: no such file") from None
    except OSError as exc:
        raise InvalidMessageError(f"{p}: cannot read ({exc})") from None
    return load_conversation_json(raw, source=str(p))

