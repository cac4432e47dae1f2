"""The replay loop: every system sees the same transcripts, calls, latencies and counter.

A transcript is replayed as a standing agent: its messages are appended to the system one by one,
and before each assistant message the agent makes one model call whose request is the system
prompt plus the window as the system has it at that moment (``Session.request``; an inline
compactor folds there, on the agent's path). The scripted model then "answers" with the
transcript's assistant message after a scaled 4.0 s, and the session hears the call's usage
(``Session.reported``), as a real agent would publish it.

After the last message of ``psf__requests-1142`` (an 868 K-character tool output) one more
request is made: the *stress step*, reported apart from the per-call totals.

A system plugs in through two small protocols (:class:`System`, :class:`Session`) and is measured
only through what it returns: the request, and at the end the originals it can still give back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .cache import PRICES, common_prefix_tokens
from .checks import broken_tool_pairs, has_task, retrievable
from .counting import Counter, Request, Unit
from .fakes import FakeSummarizer, ScriptedModel
from .transcripts import STRESS_TRANSCRIPT, Transcript

__all__ = [
    "Env",
    "RequestRecord",
    "Session",
    "StressRecord",
    "System",
    "SystemRun",
    "TranscriptRun",
    "replay",
]

Message = Mapping[str, Any]


@dataclass(frozen=True)
class Env:
    """What a system is given to drive its compactor with: the one counter and summarizer."""

    counter: Counter
    summarizer: FakeSummarizer
    time_scale: float


class Session(Protocol):
    """One agent run under one system."""

    def append(self, message: Message) -> None:
        """A transcript message happened (the model's answer, a tool result, a user turn)."""

    def request(self) -> Request:
        """The request the agent sends now. Inline compaction happens here, on the agent's path."""

    def reported(self, request: Request, tokens: int) -> None:
        """The provider's usage for the call just made (``tokens`` = its prompt size)."""

    def finish(self) -> None:
        """The run is over: wait for work in flight, release resources."""

    def retained(self) -> Sequence[Message]:
        """Every original message the system can still give back, in the Anthropic shape."""


class System(Protocol):
    name: str

    def describe(self, budget: int) -> str:
        """The configuration, in one line, for the report."""

    def session(self, transcript: Transcript, budget: int, env: Env) -> Session: ...


@dataclass(frozen=True)
class RequestRecord:
    tokens: int
    cached: int
    broken_pairs: int
    task: bool
    messages: int
    #: Real seconds the agent spent in ``Session.request`` (compaction on its path).
    wait_s: float

    def to_json(self) -> list[Any]:
        return [self.tokens, self.cached, self.broken_pairs, int(self.task), self.messages,
                round(self.wait_s, 4)]

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> RequestRecord:
        return cls(tokens=int(row[0]), cached=int(row[1]), broken_pairs=int(row[2]),
                   task=bool(row[3]), messages=int(row[4]), wait_s=float(row[5]))


@dataclass(frozen=True)
class StressRecord:
    """The one request after the 868 K-character tool output."""

    transcript: str
    tokens: int
    task: bool
    broken_pairs: int
    #: The last message of the request answers the final tool call (the newest step is there).
    newest_step: bool
    #: Characters of that final tool output the request carries (0 if the step is gone).
    newest_chars: int
    wait_s: float

    def to_json(self) -> dict[str, Any]:
        return {"transcript": self.transcript, "tokens": self.tokens, "task": self.task,
                "broken_pairs": self.broken_pairs, "newest_step": self.newest_step,
                "newest_chars": self.newest_chars, "wait_s": round(self.wait_s, 4)}


@dataclass
class TranscriptRun:
    id: str
    requests: list[RequestRecord] = field(default_factory=list)
    retrievable: bool = False
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "retrievable": self.retrievable, "wall_s": round(self.wall_s, 3),
                "requests": [r.to_json() for r in self.requests]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TranscriptRun:
        return cls(id=str(data["id"]), retrievable=bool(data["retrievable"]),
                   wall_s=float(data["wall_s"]),
                   requests=[RequestRecord.from_json(r) for r in data["requests"]])


@dataclass
class SystemRun:
    """Everything one system did at one budget: per-request records and summarizer calls."""

    system: str
    budget: int
    time_scale: float
    config: str
    transcripts: list[TranscriptRun] = field(default_factory=list)
    stress: StressRecord | None = None
    summarizer_calls: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "budget": self.budget, "time_scale": self.time_scale,
                "config": self.config, "source": self.source,
                "transcripts": [t.to_json() for t in self.transcripts],
                "stress": self.stress.to_json() if self.stress else None,
                "summarizer_calls": self.summarizer_calls}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SystemRun:
        stress = data.get("stress")
        return cls(system=str(data["system"]), budget=int(data["budget"]),
                   time_scale=float(data["time_scale"]), config=str(data["config"]),
                   source=str(data.get("source", "")),
                   transcripts=[TranscriptRun.from_json(t) for t in data["transcripts"]],
                   stress=StressRecord(**stress) if stress else None,
                   summarizer_calls=list(data["summarizer_calls"]))


def _tool_result_chars(message: Message, tool_use_id: str) -> int | None:
    content = message["content"]
    if isinstance(content, str):
        return None
    for block in content:
        if block.get("type") == "tool_result" and block.get("tool_use_id") == tool_use_id:
            body = block.get("content", "")
            if isinstance(body, str):
                return len(body)
            return sum(len(str(p.get("text", ""))) for p in body)
    return None


class _Agent:
    """Makes the calls of one transcript and measures each request."""

    def __init__(self, session: Session, transcript: Transcript, counter: Counter,
                 model: ScriptedModel) -> None:
        self.session = session
        self.transcript = transcript
        self.counter = counter
        self.model = model
        self.previous: list[Unit] = []

    def call(self) -> tuple[Request, int, int, float]:
        started = time.perf_counter()
        request = self.session.request()
        waited = time.perf_counter() - started
        units = self.counter.request_units(request)
        tokens = sum(u.count for u in units)
        cached = common_prefix_tokens(self.previous, units)
        self.previous = units
        self.model.call()
        self.session.reported(request, tokens)
        return request, tokens, cached, waited

    def step(self) -> RequestRecord:
        request, tokens, cached, waited = self.call()
        return RequestRecord(
            tokens=tokens, cached=cached, broken_pairs=broken_tool_pairs(request.messages),
            task=has_task(request.messages, self.transcript.task),
            messages=len(request.messages), wait_s=waited)

    def stress(self) -> StressRecord:
        last = self.transcript.messages[-1]
        final_ids = [str(b["tool_use_id"]) for b in last["content"]
                     if isinstance(b, Mapping) and b.get("type") == "tool_result"]
        request, tokens, _cached, waited = self.call()
        newest = None
        if request.messages and final_ids:
            newest = _tool_result_chars(request.messages[-1], final_ids[-1])
        return StressRecord(
            transcript=self.transcript.id, tokens=tokens,
            task=has_task(request.messages, self.transcript.task),
            broken_pairs=broken_tool_pairs(request.messages), newest_step=newest is not None,
            newest_chars=newest or 0, wait_s=waited)


def replay(system: System, transcripts: Sequence[Transcript], budget: int, *,
           time_scale: float, counter: Counter | None = None, stress: bool = True,
           source: str = "", summarizer: FakeSummarizer | None = None) -> SystemRun:
    """Replay ``transcripts`` through ``system`` at ``budget`` tokens and record every request.

    ``summarizer`` is given when something outside the system needs it before the replay
    starts (the pipeline's fake summarizer server); its time scale must be ``time_scale``.
    """
    counter = counter or Counter()
    if summarizer is None:
        summarizer = FakeSummarizer(counter=counter, time_scale=time_scale)
    elif summarizer.time_scale != time_scale:
        raise ValueError("the summarizer's time scale differs from the replay's")
    summarizer.agent_thread = threading.get_ident()
    env = Env(counter=counter, summarizer=summarizer, time_scale=time_scale)
    run = SystemRun(system=system.name, budget=budget, time_scale=time_scale,
                    config=system.describe(budget), source=source)
    for transcript in transcripts:
        started = time.perf_counter()
        first_call = len(summarizer.calls)
        session = system.session(transcript, budget, env)
        agent = _Agent(session, transcript, counter, ScriptedModel(time_scale))
        record = TranscriptRun(id=transcript.id)
        for message in transcript.messages:
            if message["role"] == "assistant":
                record.requests.append(agent.step())
            session.append(message)
        if stress and transcript.id == STRESS_TRANSCRIPT and \
                transcript.messages[-1]["role"] == "user":
            run.stress = agent.stress()
        session.finish()
        record.retrievable = retrievable(transcript.messages, session.retained())
        record.wall_s = time.perf_counter() - started
        run.transcripts.append(record)
        for call in summarizer.calls[first_call:]:
            run.summarizer_calls.append({
                "transcript": transcript.id, "input_tokens": call.input_tokens,
                "output_tokens": call.output_tokens, "seconds": call.seconds,
                "measured_s": round(call.measured_s, 3),
                "on_agent_thread": call.on_agent_thread,
                "dollars": round(PRICES.summarizer_dollars(call.input_tokens,
                                                           call.output_tokens), 6)})
    return run
