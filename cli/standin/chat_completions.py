"""OpenAI's chat completions wire format, as the stand-in speaks it: a request read as the
Messages request it amounts to, the completion body, and its stream of chunks.

A request is read through :func:`~sessionfold.core.messages.from_openai`, so reply callbacks
and the script see it in the Anthropic shape and it is counted, scripted and faulted as a
Messages request is. The stream is ``chat.completion.chunk`` events ending with
``data: [DONE]``, the usage chunk only with ``stream_options.include_usage``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from sessionfold.core.errors import InvalidInputError
from sessionfold.core.openai_shape import from_openai

from .replies import Served
from .sse import pieces, sse_frame

__all__ = ["chat_events", "completion_body", "messages_request"]


def messages_request(request: Mapping[str, Any]) -> dict[str, Any] | str:
    """A chat completions request as the Messages request it amounts to, or why OpenAI would
    refuse it."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: field required (a non-empty list)"
    try:
        conversation = from_openai(messages)
    except InvalidInputError as exc:
        return f"messages: {exc}"
    if not conversation.messages:
        return "messages: at least one user or assistant message is required"
    tools = []
    for i, tool in enumerate(request.get("tools") or []):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            return f"tools[{i}]: a function tool needs a function with a name"
        tools.append({"name": function["name"], "description": function.get("description", ""),
                      "input_schema": function.get("parameters") or {"type": "object"}})
    converted: dict[str, Any] = {"model": request.get("model"), "system": conversation.system,
                                 "messages": [m.to_json() for m in conversation.messages]}
    if tools:
        converted["tools"] = tools
    return converted


def completion_body(served: Served) -> dict[str, Any]:
    """OpenAI's chat completion (its ``usage`` counts the whole prompt, cached included)."""
    text = "".join(b["text"] for b in served.content if b["type"] == "text")
    refusal = "".join(b["text"] for b in served.content if b["type"] == "refusal")
    message: dict[str, Any] = {"role": "assistant", "content": text or None,
                               "refusal": refusal or None}
    calls = [{"id": b["id"], "type": "function",
              "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
             for b in served.content if b["type"] == "tool_use"]
    if calls:
        message["tool_calls"] = calls
    output = served.output_tokens
    return {"id": f"chatcmpl-fake{uuid.uuid4().hex[:20]}", "object": "chat.completion",
            "created": int(time.time()), "model": served.model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": served.prompt, "completion_tokens": output,
                      "total_tokens": served.prompt + output,
                      "prompt_tokens_details": {"cached_tokens": served.cache_read,
                                                "audio_tokens": 0},
                      "completion_tokens_details": {"reasoning_tokens": 0,
                                                    "audio_tokens": 0}}}


def chat_events(completion: Mapping[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """OpenAI's stream of ``completion``: ``chat.completion.chunk`` events, then the usage
    chunk when asked for, then ``[DONE]``."""
    head = {"id": completion["id"], "object": "chat.completion.chunk",
            "created": completion["created"], "model": completion["model"],
            "system_fingerprint": None, **({"usage": None} if include_usage else {})}
    (choice,) = completion["choices"]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse_frame(None, {**head, "choices": [{"index": 0, "delta": delta,
                                                     "logprobs": None, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    if message["refusal"]:
        yield chunk({"refusal": message["refusal"]})
    if message["content"]:
        for piece in pieces(message["content"]):
            yield chunk({"content": piece})
    for index, call in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"],
                                                  "arguments": ""}}]})
        for piece in pieces(call["function"]["arguments"]):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield sse_frame(None, {**head, "choices": [], "usage": completion["usage"]})
    yield sse_frame(None, "[DONE]")
