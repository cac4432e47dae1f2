"""The Anthropic Messages API's wire format, as the stand-in speaks it: what it refuses in a
request's shape, its reply body, and its Server-Sent Events stream.

The stream is the API's own: ``message_start`` with the usage and its cache fields, ``ping``,
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``) /
``content_block_stop`` per block, ``message_delta`` with the stop reason and the usage, and
``message_stop``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from .replies import Served
from .sse import pieces, sse_frame

__all__ = ["message_body", "message_events", "request_problem"]


def request_problem(request: Mapping[str, Any]) -> str:
    """What the real API would reject in the request's shape ("" when it is well formed)."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: field required (a non-empty list)"
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: must be 'user' or 'assistant'"
        if not isinstance(message.get("content"), str | list):
            return f"messages.{i}.content: must be a string or a list of blocks"
    return ""


def message_body(served: Served) -> dict[str, Any]:
    """The Messages API's reply (a refusal: its text, ``stop_reason: "refusal"``)."""
    usage = {"input_tokens": served.prompt - served.cache_read - served.cache_created,
             "output_tokens": served.output_tokens,
             "cache_read_input_tokens": served.cache_read,
             "cache_creation_input_tokens": served.cache_created}
    content = [{"type": "text", "text": b["text"]} if b["type"] == "refusal" else b
               for b in served.content]
    stop = "refusal" if served.refused else "tool_use" if served.calls_tools else "end_turn"
    return {"id": f"msg_fake_{uuid.uuid4().hex[:20]}", "type": "message",
            "role": "assistant", "model": served.model, "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": usage}


def message_events(message: Mapping[str, Any]) -> Iterator[bytes]:
    """The Messages API's stream of ``message``, event by event, as the API sends it."""
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": 1}}
    yield sse_frame("message_start", {"type": "message_start", "message": start})
    yield sse_frame("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        first: dict[str, Any]
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces(block["text"])]
        else:
            first = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": piece}
                      for piece in ["", *pieces(json.dumps(block["input"]))]]
        yield sse_frame("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": first})
        for delta in deltas:
            yield sse_frame("content_block_delta", {"type": "content_block_delta",
                                                    "index": index, "delta": delta})
        yield sse_frame("content_block_stop", {"type": "content_block_stop", "index": index})
    # The usage on message_delta is cumulative: the whole reply's, input counts included.
    yield sse_frame("message_delta", {"type": "message_delta", "usage": usage, "delta": {
        "stop_reason": message["stop_reason"], "stop_sequence": None}})
    yield sse_frame("message_stop", {"type": "message_stop"})
