"""Small helpers the adapters share to read and write Anthropic-shape messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from b1.checks import retrievable
from b1.counting import block_key

__all__ = ["blocks", "check_round_trip", "explicit_is_error", "merge_tool_results", "text_of"]

Message = Mapping[str, Any]


def blocks(message: Message) -> list[Mapping[str, Any]]:
    content = message["content"]
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


def text_of(message: Message) -> str:
    """The message's text blocks, joined (tool blocks left out)."""
    return "\n".join(str(b["text"]) for b in blocks(message) if b.get("type") == "text")


def explicit_is_error(messages: Sequence[Message]) -> tuple[Message, ...]:
    """The messages with ``"is_error": false`` written into every tool result that leaves it out.

    The Messages API reads a missing ``is_error`` as false, and B1's counter does not count it,
    but the peers' types cannot leave it out (LangChain's ``ToolMessage.status``, OpenHands'
    ``Observation.is_error``, AutoGen's ``FunctionExecutionResult.is_error`` always hold a
    value): without this, a transcript whose results omit it (``b1.public_traces``) fails the
    round-trip check and reads as not retrievable, for a field that changes nothing sent.
    """
    return tuple(_with_is_error(m) for m in messages)


def _with_is_error(message: Message) -> Message:
    content = message["content"]
    if isinstance(content, str) or all(
            b.get("type") != "tool_result" or "is_error" in b for b in content):
        return message
    return {**message, "content": [
        {**b, "is_error": False} if b.get("type") == "tool_result" and "is_error" not in b
        else b for b in content]}


def merge_tool_results(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Join consecutive user messages made only of tool results into one (the Anthropic shape:
    every answer to one assistant message sits in the next user message)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        previous = out[-1] if out else None
        if (previous is not None and previous["role"] == "user" == message["role"]
                and _only_results(previous) and _only_results(message)):
            previous["content"] = [*previous["content"], *message["content"]]
        else:
            out.append(message)
    return out


def _only_results(message: Message) -> bool:
    content = message["content"]
    return isinstance(content, list) and bool(content) and all(
        b.get("type") == "tool_result" for b in content)


def check_round_trip(name: str, originals: Sequence[Message],
                     back: Sequence[Message]) -> None:
    """Raise unless converting to the peer's types and back changed no byte of any message."""
    if len(originals) != len(back) or not retrievable(originals, back):
        for index, (a, b) in enumerate(zip(originals, back, strict=False)):
            if block_key(a) != block_key(b):
                raise AssertionError(
                    f"{name}: message {index} does not survive the round trip through the "
                    f"peer's types:\n  {block_key(a)[:300]}\n  {block_key(b)[:300]}")
        raise AssertionError(f"{name}: {len(originals)} messages came back as {len(back)}")
