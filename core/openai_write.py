"""A conversation written as OpenAI chat-completions messages: :mod:`.openai_shape` reversed.

A tool call goes back as the call it came as (a custom call, or a function whose arguments text
is written as it came); what the chat shape has no place for (thinking, server tools' blocks,
other sources) is left out of this rendering, never out of the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .messages import (
    Block,
    Conversation,
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .openai_shape import CUSTOM_INPUT_KEY, RAW_ARGUMENTS_KEY, reserved_input

__all__ = ["to_openai"]


def to_openai(conversation: Conversation) -> list[dict[str, Any]]:
    """Write a :class:`Conversation` as OpenAI chat-completions messages.

    The system prompt first; a tool call as the call it came as (custom, or a function whose
    arguments are written back as they came); each tool result its own ``tool`` message
    (text only: a tool message holds no image), then the user's text, images (``image_url``)
    and PDFs (``file``). Thinking, blocks sessionfold keeps as given (server tools) and other
    sources have no place in the chat shape and are left out of this rendering, never out of
    the ledger; an assistant message left with nothing is left out whole (OpenAI refuses an
    assistant message with neither content nor tool calls).
    """
    out: list[dict[str, Any]] = []
    if conversation.system:
        out.append({"role": "system", "content": conversation.system})
    for msg in conversation.messages:
        if msg.role == "assistant":
            reply = _openai_reply(msg)
            if reply is not None:
                out.append(reply)
        elif isinstance(msg.content, str):
            out.append({"role": "user", "content": msg.content})
        else:
            out.extend(_openai_user_turn(msg.content))
    return out


def _openai_reply(msg: Message) -> dict[str, Any] | None:
    calls = [_openai_call(b) for b in msg.blocks() if isinstance(b, ToolUseBlock)]
    text = msg.text()
    if not text and not calls:
        return None
    reply: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        reply["tool_calls"] = calls
    return reply


def _openai_call(block: ToolUseBlock) -> dict[str, Any]:
    reserved = reserved_input(block.input)
    if reserved == CUSTOM_INPUT_KEY:
        return {"id": block.id, "type": "custom",
                "custom": {"name": block.name, "input": block.input[CUSTOM_INPUT_KEY]}}
    arguments = (block.input[RAW_ARGUMENTS_KEY] if reserved == RAW_ARGUMENTS_KEY
                 else json.dumps(block.input))
    return {"id": block.id, "type": "function",
            "function": {"name": block.name, "arguments": arguments}}


def _openai_user_turn(blocks: Sequence[Block]) -> list[dict[str, Any]]:
    """A user message's tool results as ``tool`` messages, then the rest as one user message."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, ToolResultBlock):
            out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                        "content": b.output_text()})
            continue
        part = _openai_part_of(b)
        if part is not None:
            parts.append(part)
    if parts and all(p["type"] == "text" for p in parts):
        out.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
    elif parts:
        out.append({"role": "user", "content": parts})
    return out


def _openai_part_of(block: Block) -> dict[str, Any] | None:
    """The OpenAI content part a user message's block is written as; None: it has none."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    source = block.source if isinstance(block, ImageBlock | DocumentBlock) else {}
    if source.get("type") == "base64" and isinstance(source.get("data"), str) and isinstance(
            source.get("media_type"), str):
        url = f"data:{source['media_type']};base64,{source['data']}"
        if isinstance(block, ImageBlock):
            return {"type": "image_url", "image_url": {"url": url}}
        if source.get("media_type") == "application/pdf":
            file: dict[str, Any] = {"file_data": url}
            title = (block.model_extra or {}).get("title")
            if isinstance(title, str) and title:
                file["filename"] = title
            return {"type": "file", "file": file}
    if isinstance(block, ImageBlock) and source.get("type") == "url" and isinstance(
            source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    return None
