"""Per-request invariants, computed the same way for every system on the request it sent.

- :func:`broken_tool_pairs`: a ``tool_result`` that does not answer a ``tool_use`` of the message
  just before it, or a ``tool_use`` the next message does not answer (Anthropic rejects both).
  A ``tool_use`` in the very last message is fine (the model is mid-call), though a request
  always ends with a user message here.
- :func:`has_task`: the task (the first user message's text) is in the request, whole, in a user
  message. A summary that paraphrases it does not count.
- :func:`retrievable`: every original message can still be read back, in full, from what the
  system itself retains (its ledger, event log or context store).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .counting import block_key

__all__ = ["broken_tool_pairs", "has_task", "message_text", "retrievable"]

Message = Mapping[str, Any]


def _blocks(message: Message) -> list[Mapping[str, Any]]:
    content = message["content"]
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


def _ids(message: Message, kind: str, field: str) -> list[str]:
    return [str(b[field]) for b in _blocks(message) if b.get("type") == kind]


def broken_tool_pairs(messages: Sequence[Message]) -> int:
    """How many tool_use/tool_result pairs the request breaks (0 for a well-formed one)."""
    broken = 0
    previous: Message | None = None
    for message in messages:
        results = _ids(message, "tool_result", "tool_use_id")
        asked = set(_ids(previous, "tool_use", "id")) if previous is not None else set()
        if message["role"] != "user":
            broken += len(results)
        else:
            broken += sum(1 for r in results if r not in asked)
        if previous is not None and asked:
            broken += len(asked - set(results))
        previous = message
    # The last message's own tool_use (if any) is a call in flight: never counted.
    return broken


def message_text(message: Message) -> str:
    """Every text a message carries (text blocks and tool output), joined."""
    parts: list[str] = []
    for block in _blocks(message):
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "tool_result":
            content = block.get("content", "")
            if isinstance(content, str):
                parts.append(content)
            else:
                parts.extend(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return "\n".join(parts)


def has_task(messages: Sequence[Message], task: str) -> bool:
    """Whether a user message of the request holds the task text whole."""
    return any(m["role"] == "user" and task in message_text(m) for m in messages)


def retrievable(originals: Sequence[Message], retained: Iterable[Message]) -> bool:
    """Whether every original message is among the messages a system still retains.

    Compared by canonical JSON, so a message counts only if it is retained byte for byte.
    """
    kept = {block_key(m) for m in retained}
    return all(block_key(m) in kept for m in originals)
