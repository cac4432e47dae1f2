"""A script of replies for the stand-in model: what ``sessionfold standin --script FILE`` plays.

The file is JSON: a list of replies, played one per agent request, in order (a request from
sessionfold's summarizer is answered as always and leaves the script where it is). A reply is
a string (the assistant's text) or an object with ``text``, ``tool_calls`` or both; a tool call
is ``{"name": ..., "input": {...}}``, its ``id`` made by the stand-in in the API's form unless
given::

    [
      {"tool_calls": [{"name": "read_log", "input": {"page": 1}}]},
      {"text": "Page 1 is clean.", "tool_calls": [{"name": "read_log", "input": {"page": 2}}]},
      "Every refund is reconciled."
    ]

The text comes before the tool calls, as a model writes them; a reply with tool calls ends
with ``stop_reason: "tool_use"`` (``finish_reason: "tool_calls"`` in the OpenAI shape). Once
every reply is played the stand-in echoes, as it does without a script: a short text reply
naming the request, which ends a tool-using agent's loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sessionfold.core.errors import InvalidInputError

from .fakeprovider import Reply, ToolUse

__all__ = ["load_script", "parse_script"]

_REPLY_KEYS = frozenset({"text", "tool_calls"})
_CALL_KEYS = frozenset({"name", "input", "id"})


def load_script(path: Path) -> list[Reply]:
    """The replies of the script file at ``path`` (InvalidInputError naming what is wrong)."""
    where = f"--script {path.name}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInputError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"{where}: not JSON: {exc}") from None
    return parse_script(data, where=where)


def parse_script(data: object, *, where: str = "script") -> list[Reply]:
    """The replies of a script already read from JSON (see the module doc for its shape)."""
    if not isinstance(data, list) or not data:
        raise InvalidInputError(f"{where}: a script is a non-empty JSON list of replies")
    return [_reply(item, f"{where}: reply {i}") for i, item in enumerate(data)]


def _reply(item: object, where: str) -> Reply:
    if isinstance(item, str):
        return _text(item, where)
    if not isinstance(item, Mapping):
        raise InvalidInputError(f"{where}: a reply is a string or an object with text and/or "
                                f"tool_calls, got {type(item).__name__}")
    unknown = sorted(set(item) - _REPLY_KEYS)
    if unknown:
        raise InvalidInputError(f"{where}: unknown field(s) {', '.join(unknown)}; a reply has "
                                "text and/or tool_calls")
    if not _REPLY_KEYS & set(item):
        raise InvalidInputError(f"{where}: a reply needs text, tool_calls or both")
    parts: list[str | ToolUse] = []
    if "text" in item:
        parts.append(_text(item["text"], f"{where}.text"))
    calls = item.get("tool_calls", [])
    if not isinstance(calls, list) or ("tool_calls" in item and not calls):
        raise InvalidInputError(f"{where}.tool_calls: a non-empty list of tool calls")
    parts += [_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
    return parts


def _text(value: object, where: str) -> str:
    # The Messages API refuses an empty text block: a script must not make the stand-in send one.
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{where}: text must be a non-empty string")
    return value


def _call(call: object, where: str) -> ToolUse:
    if not isinstance(call, Mapping):
        raise InvalidInputError(f"{where}: a tool call is an object with a name and an input")
    unknown = sorted(set(call) - _CALL_KEYS)
    if unknown:
        raise InvalidInputError(f"{where}: unknown field(s) {', '.join(unknown)}; a tool call "
                                "has name, input and (optional) id")
    name, arguments, call_id = call.get("name"), call.get("input", {}), call.get("id")
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"{where}.name: the tool's name, a non-empty string")
    if not isinstance(arguments, Mapping):
        raise InvalidInputError(f"{where}.input: the tool's input, a JSON object")
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        raise InvalidInputError(f"{where}.id: a non-empty string when given")
    inputs: dict[str, Any] = dict(arguments)
    return ToolUse(name, inputs, call_id)
