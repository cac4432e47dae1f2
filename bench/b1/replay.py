"""The replay loop: every system sees the same transcripts, calls, latencies and counter.

A transcript is replayed as a standing agent: its messages are appended to the system one by one,
and before each assistant message the agent makes one model call whose request is the system
prompt plus the window as the system has it at that moment (``Session.request``; an inline
compactor folds there, on the agent's path). The scripted model then "answers" with the
transcript's assistant message after a scaled 4.0 s, and the session hears the call's usage
(``Session.reported``), as a real agent would publish it.

After the last message of ``psf__requests-1142`` (an 868 K-character tool output) one more
request is made: the *stress step*, reported apart from the per-call totals.

Each request is also scored for needed-context recall (:mod:`b1.needed`): the identifiers the
transcript's assistant message k names and an earlier message named, and how many of them the
request for call k holds.

A system plugs in through two small protocols (:class:`System`, :class:`Session`) and is measured
only through what it returns: the request, and at the end the originals it can still give back.
A session whose client makes the model call itself (:class:`CallingSession`: sessionfold's
``call(fn)``, which guards the request and, with the recall tool, answers recall tool calls from
the ledger and calls the model again) is handed the scripted model instead; every request the
client sends through it is billed, and when the client offers the recall tool the model plays
the recall oracle (:mod:`b1.oracle`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .cache import common_prefix_tokens
from .checks import broken_tool_pairs, has_task, retrievable
from .counting import Counter, Request, Unit
from .fakes import MODEL_SECONDS, FakeSummarizer, ScriptedModel
from .idle import CACHE_TTL_S, idle_gaps
from .needed import (
    RECALL_TOOL,
    CallRecall,
    named_identifiers,
    need_sets,
    request_recall,
    without_recall_echo,
)
from .oracle import ask, recovered
from .transcripts import STRESS_TRANSCRIPT, Transcript

__all__ = [
    "CallingSession",
    "Env",
    "ModelFn",
    "Reply",
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


@dataclass(frozen=True)
class Reply:
    """The scripted model's answer to one request: its content blocks, and the request's size
    in tokens (what the provider's usage would report)."""

    content: list[dict[str, Any]]
    input_tokens: int

    @property
    def stop_reason(self) -> str:
        return "tool_use" if any(b.get("type") == "tool_use" for b in self.content) else "end_turn"


#: The scripted model as a client calls it: one request in, one reply out.
ModelFn = Callable[[Request], Reply]


@runtime_checkable
class CallingSession(Protocol):
    """A session whose client makes the model call(s) of one agent step itself."""

    #: The client offers the recall tool: the scripted model then asks for what its first
    #: request lacks (the oracle), and the client answers.
    offers_recall: bool

    def call(self, model: ModelFn) -> None:
        """Make the agent's next call through the client, which calls ``model`` once per
        request it sends (again after answering a recall), and reports the usage itself."""


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
    #: Needed-context recall (:mod:`b1.needed`): identifiers the answer to this call needs,
    #: and how many of them the request holds.
    needed: int = 0
    present: int = 0
    #: The recall oracle (:mod:`b1.oracle`): missing identifiers its recall answers copied, the
    #: extra model calls it made for them, and their billing (tokens, cache reads).
    recovered: int = 0
    recall_calls: int = 0
    recall_tokens: int = 0
    recall_cached: int = 0
    #: The idle-gap scenario (:mod:`b1.idle`): model seconds the agent was idle before this
    #: call (0: none), and whether its cache had expired (the whole prompt written).
    idle_s: float = 0.0
    cold: bool = False

    @property
    def present_with_tool(self) -> int:
        return self.present + self.recovered

    def to_json(self) -> list[Any]:
        return [self.tokens, self.cached, self.broken_pairs, int(self.task), self.messages,
                round(self.wait_s, 4), self.needed, self.present, self.recovered,
                self.recall_calls, self.recall_tokens, self.recall_cached,
                round(self.idle_s, 1), int(self.cold)]

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> RequestRecord:
        # Rows written before the recall measure carry six fields: the rest read as 0.
        extra = [int(x) for x in row[6:12]] + [0] * (12 - max(len(row), 6))
        return cls(tokens=int(row[0]), cached=int(row[1]), broken_pairs=int(row[2]),
                   task=bool(row[3]), messages=int(row[4]), wait_s=float(row[5]),
                   needed=extra[0], present=extra[1], recovered=extra[2],
                   recall_calls=extra[3], recall_tokens=extra[4], recall_cached=extra[5],
                   idle_s=float(row[12]) if len(row) > 12 else 0.0,
                   cold=bool(row[13]) if len(row) > 13 else False)


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
    #: The system's client offered the recall tool and the oracle used it (:mod:`b1.oracle`).
    recall_tool: bool = False
    #: Replayed in the idle-gap scenario (:mod:`b1.idle`).
    idle: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "budget": self.budget, "time_scale": self.time_scale,
                "config": self.config, "source": self.source, "recall_tool": self.recall_tool,
                "idle": self.idle,
                "transcripts": [t.to_json() for t in self.transcripts],
                "stress": self.stress.to_json() if self.stress else None,
                "summarizer_calls": self.summarizer_calls}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SystemRun:
        stress = data.get("stress")
        return cls(system=str(data["system"]), budget=int(data["budget"]),
                   time_scale=float(data["time_scale"]), config=str(data["config"]),
                   source=str(data.get("source", "")),
                   recall_tool=bool(data.get("recall_tool", False)),
                   idle=bool(data.get("idle", False)),
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


def _score(need: frozenset[str], request: Request) -> CallRecall:
    """How much of ``need`` a request holds, recall exchanges read without their echoes."""
    return request_recall(need, request.system, without_recall_echo(request.messages))


@dataclass(frozen=True)
class _Sent:
    """One request as billed: its tokens, and those read from the prompt cache."""

    request: Request
    tokens: int
    cached: int
    #: Its cache had expired (the idle-gap scenario): nothing was read from it.
    cold: bool = False


#: What the scripted model says after the stress step's request (no transcript message follows).
_STRESS_REPLY = [{"type": "text", "text": "(the replay ends here)"}]


class _Agent:
    """Makes the calls of one transcript and measures each request."""

    def __init__(self, session: Session, transcript: Transcript, counter: Counter,
                 model: ScriptedModel) -> None:
        self.session = session
        self.transcript = transcript
        self.counter = counter
        self.model = model
        self.previous: list[Unit] = []
        #: Model time (seconds): each call takes MODEL_SECONDS; idle gaps add theirs. A call
        #: more than CACHE_TTL_S after the previous one reads nothing from the cache.
        self.clock = 0.0
        self.last_call_at: float | None = None
        #: NEED_k of every call, in order, and the assistant message k that answers it.
        self.need = need_sets(transcript.messages)
        self.answers = [[dict(b) for b in _blocks(m)] for m in transcript.messages
                        if m["role"] == "assistant"]

    def bill(self, request: Request) -> _Sent:
        """Count a request and what it shares with the agent's previous one (the cache)."""
        units = self.counter.request_units(request)
        cold = self.last_call_at is not None and self.clock - self.last_call_at > CACHE_TTL_S
        sent = _Sent(request, sum(u.count for u in units),
                     0 if cold else common_prefix_tokens(self.previous, units), cold)
        self.previous = units
        self.last_call_at = self.clock
        self.clock += MODEL_SECONDS
        return sent

    def idle(self, seconds: float, *, sleep: bool) -> None:
        """The agent is idle ``seconds`` of model time; ``sleep``: wait them out on the scaled
        clock (a system whose background work runs on the clock)."""
        self.clock += seconds
        if sleep:
            time.sleep(seconds * self.model.time_scale)

    def send(self) -> tuple[_Sent, float]:
        """One call with the request the session hands over; (what was sent, seconds waited)."""
        started = time.perf_counter()
        request = self.session.request()
        waited = time.perf_counter() - started
        sent = self.bill(request)
        self.model.call()
        self.session.reported(request, sent.tokens)
        return sent, waited

    def through_client(self, session: CallingSession, call: int | None) -> _ClientTurn:
        """One step made by the session's client, the scripted model playing the oracle."""
        need = self.need[call] if call is not None else frozenset()
        turn = _ClientTurn(self, call, need,
                           self.answers[call] if call is not None else _STRESS_REPLY,
                           ask_recall=session.offers_recall)
        session.call(turn)
        turn.check()
        return turn

    def step(self, k: int, idle_s: float = 0.0) -> RequestRecord:
        """Call k (the request before the transcript's k-th assistant message), ``idle_s``
        model seconds after the previous one ended (the idle-gap scenario)."""
        if isinstance(self.session, CallingSession):
            turn = self.through_client(self.session, k)
            sent, waited, extra = turn.sent[0], turn.waited, turn.sent[1:]
            recall = turn.window
        else:
            (sent, waited), extra = self.send(), []
            recall = _score(self.need[k], sent.request)
        assert recall is not None
        messages = sent.request.messages
        return RequestRecord(
            tokens=sent.tokens, cached=sent.cached, broken_pairs=broken_tool_pairs(messages),
            task=has_task(messages, self.transcript.task), messages=len(messages),
            wait_s=waited, needed=recall.needed, present=recall.present,
            recovered=turn.recovered if extra else 0, recall_calls=len(extra),
            recall_tokens=sum(x.tokens for x in extra),
            recall_cached=sum(x.cached for x in extra), idle_s=idle_s,
            cold=sent.cold)

    def stress(self) -> StressRecord:
        last = self.transcript.messages[-1]
        final_ids = [str(b["tool_use_id"]) for b in last["content"]
                     if isinstance(b, Mapping) and b.get("type") == "tool_result"]
        if isinstance(self.session, CallingSession):
            turn = self.through_client(self.session, None)
            request, tokens, waited = turn.sent[0].request, turn.sent[0].tokens, turn.waited
        else:
            sent, waited = self.send()
            request, tokens = sent.request, sent.tokens
        newest = None
        if request.messages and final_ids:
            newest = _tool_result_chars(request.messages[-1], final_ids[-1])
        return StressRecord(
            transcript=self.transcript.id, tokens=tokens,
            task=has_task(request.messages, self.transcript.task),
            broken_pairs=broken_tool_pairs(request.messages), newest_step=newest is not None,
            newest_chars=newest or 0, wait_s=waited)


class _ClientTurn:
    """The scripted model for one step made by a client (a :data:`ModelFn`): it bills every
    request, and on the first one asks for the missing identifiers of the call's NEED (one
    recall turn, :mod:`b1.oracle`); on the next, counts what the answers gave back. Its answer
    is then the transcript's message."""

    def __init__(self, agent: _Agent, call: int | None, need: frozenset[str],
                 answer: list[dict[str, Any]], *, ask_recall: bool = True) -> None:
        self.agent = agent
        self.call = call
        self.ask_recall = ask_recall
        self.need = need
        self.answer = answer
        self.started = time.perf_counter()
        self.waited = 0.0
        self.sent: list[_Sent] = []
        self.window: CallRecall | None = None
        self.recovered = 0
        self.offered = False

    def __call__(self, request: Request) -> Reply:
        if not self.sent:  # the client's own work before its first request: on the agent's path
            self.waited = time.perf_counter() - self.started
        sent = self.agent.bill(request)
        self.sent.append(sent)
        self.agent.model.call()
        if len(self.sent) == 1:
            self.window = _score(self.need, request)
            # The model can only call the tool the request offers (a client offers it once
            # the window holds something only recall gives back).
            self.offered = any(t.get("name") == RECALL_TOOL for t in request.tools or ())
            if (self.window.missing and self.call is not None and self.ask_recall
                    and self.offered):
                return Reply(ask(self.call, self.window.missing), sent.tokens)
        elif len(self.sent) == 2 and self.window is not None and self.call is not None:
            self.recovered = recovered(self.window.missing, request.messages, self.call)
        return Reply(self.answer, sent.tokens)

    def check(self) -> None:
        """The client sent a request, and answered the recall turn if one was asked."""
        if not self.sent:
            raise RuntimeError("the client made no model call")
        asked = (self.ask_recall and self.offered and self.window is not None
                 and bool(self.window.missing) and self.call is not None)
        if asked and len(self.sent) < 2:
            raise RuntimeError(f"call {self.call}: the client did not answer the recall turn")


def _blocks(message: Message) -> list[Mapping[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def replay(system: System, transcripts: Sequence[Transcript], budget: int, *,
           time_scale: float, counter: Counter | None = None, stress: bool = True,
           source: str = "", summarizer: FakeSummarizer | None = None,
           idle: bool = False) -> SystemRun:
    """Replay ``transcripts`` through ``system`` at ``budget`` tokens and record every request.

    ``summarizer`` is given when something outside the system needs it before the replay
    starts (the pipeline's fake summarizer server); its time scale must be ``time_scale``.
    ``idle``: the idle-gap scenario (:mod:`b1.idle`); a system with
    ``sleeps_through_idle_gaps`` waits each gap out on the scaled clock.
    """
    counter = counter or Counter()
    if summarizer is None:
        summarizer = FakeSummarizer(counter=counter, time_scale=time_scale)
    elif summarizer.time_scale != time_scale:
        raise ValueError("the summarizer's time scale differs from the replay's")
    summarizer.agent_thread = threading.get_ident()
    env = Env(counter=counter, summarizer=summarizer, time_scale=time_scale)
    run = SystemRun(system=system.name, budget=budget, time_scale=time_scale,
                    config=system.describe(budget), source=source, idle=idle)
    for transcript in transcripts:
        started = time.perf_counter()
        first_call = len(summarizer.calls)
        # The digest lists what this conversation named; a transcript's folds have all landed
        # (``Session.finish``) before the next one starts.
        summarizer.vocabulary = named_identifiers(transcript.messages)
        session = system.session(transcript, budget, env)
        run.recall_tool = run.recall_tool or (isinstance(session, CallingSession)
                                               and session.offers_recall)
        agent = _Agent(session, transcript, counter, ScriptedModel(time_scale))
        record = TranscriptRun(id=transcript.id)
        calls = sum(m["role"] == "assistant" for m in transcript.messages)
        gaps = idle_gaps(transcript.id, calls) if idle else {}
        sleeps = bool(getattr(system, "sleeps_through_idle_gaps", False))
        for message in transcript.messages:
            if message["role"] == "assistant":
                k = len(record.requests)
                if k in gaps:
                    # A session that acts on idle time (the simulated clock's scheduler) is told.
                    told = getattr(session, "idle", None)
                    if callable(told):
                        told(gaps[k])
                    agent.idle(gaps[k], sleep=sleeps)
                record.requests.append(agent.step(k, gaps.get(k, 0.0)))
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
                "batch": call.batch})  # priced by the report (b1.prices)
    return run
