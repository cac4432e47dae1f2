"""Messages in the Anthropic Messages shape: the blocks, validation at the boundary, tool pairing.

A message is ``{"role": "user" | "assistant", "content": str | [block, ...]}`` with blocks of the
types ``text``, ``tool_use``, ``tool_result``, ``thinking``, ``redacted_thinking``, ``image`` and
``document``. Fields a block type does not name (``citations``, ``cache_control``, ...) are kept
as given, so a message that no layer touched is written back with the same fields and values
(a block's known fields in the model's order; the order of keys in a JSON object carries
nothing).

The system prompt is not a message: it lives beside the window (:class:`Conversation`), so no fold
can reach it.

Input is validated here, at the boundary: a malformed message raises
:class:`~sessionfold.core.errors.InvalidMessageError` naming the message index and the field,
never a pydantic traceback. Beyond its shape, a message is refused when it holds what a reader
or the Messages API would refuse later (:func:`parse_message`): a value nested deeper than
:data:`MAX_NESTING_DEPTH`, a lone surrogate, a non-JSON number (see :mod:`.jsonvalues`), a
tool_use id used twice in the conversation, two results for one call, an image or document whose
base64 data does not decode or whose URL is not http(s) (:mod:`.media`), or no text at all. An empty
text block beside other content is dropped (the API refuses it, and its own responses hold such
blocks). The OpenAI chat-completions shape is converted by :mod:`.openai_shape`, and session
files are read by :mod:`.session_files`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeAlias

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
from .media import check_source
from .pydantic_errors import field_path, first_error

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
    "find_lone_surrogate",
    "parse_message",
    "parse_messages",
    "sdk_dict",
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


def sdk_dict(raw: Any) -> Any:
    """A provider SDK's object (anthropic's ``TextBlock``, openai's ``ChatCompletionMessage``...)
    as the plain dict it stands for, so an agent can append what a response holds as it came
    back; anything else (a dict, sessionfold's own models) as it is. Unset optional fields
    (``citations=None``) are left out, as the API itself leaves them."""
    if isinstance(raw, Mapping | Message | _Block) or not hasattr(raw, "model_dump"):
        return raw
    return raw.model_dump(mode="json", exclude_none=True)


def _parse_block(raw: Any, index: int, position: int) -> Block:
    where = f"content[{position}]"
    raw = sdk_dict(raw)
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
        loc, msg = first_error(exc)
        raise InvalidMessageError(msg, index=index, field=field_path(where, loc)) from None
    return block


def _not_a_message(raw: Any, index: int) -> InvalidMessageError:
    what = type(raw).__name__
    if isinstance(raw, str):  # e.g. what ``list(one_message)`` hands on: its keys
        what = f"the string {raw[:40]!r}"
    return InvalidMessageError(
        f'a message must be an object {{"role", "content"}}, got {what}; messages are passed '
        "as a list: [message] for one", index=index)


#: The fields of a Messages API response besides role and content (the anthropic SDK's
#: ``Message``): a message with ``"type": "message"`` may carry them, and they are not kept.
_RESPONSE_FIELDS = frozenset({"id", "type", "model", "stop_reason", "stop_sequence",
                              "stop_details", "usage", "container", "diagnostics"})


def parse_message(raw: Any, index: int = 0) -> Message:
    """Validate one Anthropic-shape message; errors name ``index`` and the field.

    A saved Messages API response (``"type": "message"``, with ``id``, ``model``,
    ``stop_reason``, ``usage``...) is read as its role and content; any other field is refused.

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
    if extra and raw.get("type") == "message":
        # A Messages API response saved as it came: its role and content are the message, the
        # rest is about the call (ids, usage), which no request takes back.
        extra -= _RESPONSE_FIELDS
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
    _check_sources(message, index)
    _check_unique_ids(message, index)
    return _without_empty_text(message, index)


def _check_sources(message: Message, index: int) -> None:
    """Every image and document (tool results' parts too) is one the provider takes: base64
    data that decodes, a URL that is http(s). Refused here because nothing later mends it: no
    fold edits an image, so every window holding it would fail at the provider."""
    if isinstance(message.content, str):
        return
    for pos, block in enumerate(message.content):
        if isinstance(block, ImageBlock | DocumentBlock):
            check_source(block.source, block.type, index, f"content[{pos}].source")
        elif isinstance(block, ToolResultBlock) and not isinstance(block.content, str):
            for part_pos, part in enumerate(block.content):
                if isinstance(part, ImageBlock | DocumentBlock):
                    check_source(part.source, part.type, index,
                                 f"content[{pos}].content[{part_pos}].source")


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
