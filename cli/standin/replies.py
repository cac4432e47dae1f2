"""What the stand-in model says: the replies it can be scripted to give, the default one, and a
reply as served before either API's shape is put on it.

A reply (:data:`Reply`) is the assistant's text, one :class:`ToolUse`, a list of both (content
blocks in order), or a :class:`Refusal`. Without a script or a ``reply`` callback the provider
answers with :func:`echo_reply`, which gives sessionfold's summarizer a summary that keeps the
identifiers it must keep.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionfold.core.retention import find_identifiers
from sessionfold.runtime.providers.prompt import parse_prompt

__all__ = [
    "Refusal",
    "Reply",
    "ReplyFn",
    "Served",
    "ToolUse",
    "content_text",
    "echo_reply",
    "is_summarizer_request",
    "reply_blocks",
]


@dataclass(frozen=True)
class ToolUse:
    """A tool call the stand-in model makes: ``name`` and ``input`` (``id``: generated, in the
    API's ``toolu_`` form, when not given)."""

    name: str
    input: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None

    def block(self, make_id: Callable[[], str]) -> dict[str, Any]:
        return {"type": "tool_use", "id": self.id or make_id(), "name": self.name,
                "input": dict(self.input)}


@dataclass(frozen=True)
class Refusal:
    """The stand-in model declines, saying ``text``, as each API words a refusal."""

    text: str = "I can't help with that."


#: A reply: the assistant's text, one tool call, or a list of both (content blocks in order),
#: or a refusal.
Reply = str | ToolUse | Refusal | Sequence[str | ToolUse]
#: What a reply function receives (the request body) and returns (the assistant's reply).
ReplyFn = Callable[[Mapping[str, Any]], Reply]


def reply_blocks(reply: Reply, make_id: Callable[[], str]) -> list[dict[str, Any]]:
    """The content blocks of ``reply``, tool calls given fresh ids (``make_id``) where they have
    none."""
    if isinstance(reply, Refusal):
        return [{"type": "refusal", "text": reply.text}]
    parts: Sequence[str | ToolUse] = [reply] if isinstance(reply, str | ToolUse) else reply
    blocks = [{"type": "text", "text": part} if isinstance(part, str)
              else part.block(make_id) for part in parts]
    return blocks or [{"type": "text", "text": "Noted."}]


@dataclass(frozen=True)
class Served:
    """A reply as served, before it is written in either API's shape
    (:func:`~.messages_api.message_body`, :func:`~.chat_completions.completion_body`)."""

    content: list[dict[str, Any]]
    prompt: int
    cache_read: int
    cache_created: int
    model: str
    chars_per_token: float

    @property
    def output_tokens(self) -> int:
        return max(1, round(sum(_block_chars(b) for b in self.content) / self.chars_per_token))

    @property
    def calls_tools(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.content)

    @property
    def refused(self) -> bool:
        return any(block["type"] == "refusal" for block in self.content)


def _block_chars(block: Mapping[str, Any]) -> int:
    if block["type"] in ("text", "refusal"):
        return len(block["text"])
    return len(block["name"]) + len(json.dumps(block["input"]))


def echo_reply(request: Mapping[str, Any]) -> str:
    """The default reply: short and deterministic, as a cheap model's would be.

    A summarizer request (one carrying a transcript between sessionfold's markers) is answered
    with a summary that keeps identifiers verbatim, as the instruction asks and a good model
    does: those the request lists as must-keep, then the transcript's most frequent ones. Any
    other request gets a sentence naming the request it answers.
    """
    messages = request.get("messages") or []
    last = messages[-1] if messages else {}
    text = content_text(last.get("content", "")) if isinstance(last, Mapping) else ""
    prompt = parse_prompt(text)
    if prompt is not None:
        keep = [k.strip() for k in prompt.must_keep if k.strip()]
        frequent = [ident for ident, _ in Counter(find_identifiers(text)).most_common(60)]
        identifiers = list(dict.fromkeys([*keep, *frequent]))
        summary = (f"The agent worked through {text.count('[')} transcript entries "
                   f"({len(text)} characters) on its task.")
        return summary + (" Identifiers: " + "; ".join(identifiers) + "." if identifiers else "")
    head = " ".join(text.split())[:160]
    return f"Noted ({len(messages)} messages). Latest: {head}" if head else "Noted."


def is_summarizer_request(request: Mapping[str, Any]) -> bool:
    """A request from sessionfold's summarizer: its transcript between nonce markers."""
    messages = request.get("messages") or []
    last = messages[-1] if messages else {}
    return isinstance(last, Mapping) and parse_prompt(content_text(last.get("content"))) \
        is not None


def content_text(content: Any) -> str:
    """What ``content`` reads as, for the replies and the summarizer check (its size is
    :mod:`.request_size`'s)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "thinking":
            parts.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            parts.append(str(block.get("name", "")) + json.dumps(block.get("input", {})))
        elif kind == "tool_result":
            parts.append(content_text(block.get("content", "")))
        else:  # images, documents, redacted thinking: their JSON (sizes: request_size)
            parts.append(json.dumps(block, sort_keys=True))
    return "\n".join(parts)
