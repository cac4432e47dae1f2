"""Run the fleet: each agent a thread that drives its session through the client, and what it saw.

An agent does what :mod:`sessionfold.cli.replay` does with a session file — one model call
(:meth:`SessionHandle.call`) with the window as it stands before each assistant message, then the
appends, in order — and additionally keeps, per call, what the demo reports:

- **on the wire**: the prompt size the scripted provider reported for the window it was sent
  (``input + cache read + cache creation`` tokens);
- **in the ledger**: the size the same provider gives the whole ledger so far — what the call
  would have cost had the agent re-sent everything, as it does without sessionfold;
- **late questions**: for the call that answers a question about an early identifier, where
  that identifier appears in the window it was sent (in a summary, in a kept message, or not at
  all). The question's own message is left out: it does not carry the answer.

Sharing with the live display: an :class:`AgentRun` is written only by its agent's thread; the
display reads its counters and the length of its list of calls, which a concurrent append never
leaves half-done under the GIL, so a reading is at worst one call behind.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionfold.client import SessionHandle
from sessionfold.core.frame import frame_info
from sessionfold.core.messages import parse_message
from sessionfold.core.retention import mentions
from sessionfold.core.usage import read_usage

from ..standin.fakeprovider import FakeProvider
from ..standin.opsagent import LateQuestion
from .agents import AgentScript

__all__ = ["AgentRun", "CallTrace", "QuestionCheck", "check_question", "drive"]


@dataclass(frozen=True)
class CallTrace:
    """One model call: which one, when it started, and its size on the wire and in the ledger."""

    turn: int
    #: Ledger seq of the assistant message the call stands for.
    seq: int
    started_at: float
    wire_tokens: int
    ledger_tokens: int


@dataclass(frozen=True)
class QuestionCheck:
    """Whether a late question about an early identifier could be answered from the window."""

    identifier: str
    asked_seq: int
    first_seen_seq: int
    #: The identifier is in a summary sent with the request.
    in_summary: bool
    #: Ledger seqs of kept (unfolded) messages sent with the request that name it; -1 stands for
    #: a kept message whose seq could not be told (one a layer edited, e.g. masked output).
    kept_seqs: tuple[int, ...]

    @property
    def answered(self) -> bool:
        return self.in_summary or bool(self.kept_seqs)

    @property
    def where(self) -> str:
        """A short account for the report: ``summary``, ``message #12`` or both."""
        parts = ["summary"] if self.in_summary else []
        known = [s for s in self.kept_seqs if s >= 0]
        if known:
            more = f" (+{len(self.kept_seqs) - 1} more)" if len(self.kept_seqs) > 1 else ""
            parts.append(f"message #{known[0]}{more}")
        elif self.kept_seqs:
            parts.append("an edited kept message")
        return ", ".join(parts) if parts else "not in the window"


@dataclass
class AgentRun:
    """What one agent did and saw (written by its own thread only; see the module doc)."""

    script: AgentScript
    session_id: str
    calls: list[CallTrace] = field(default_factory=list)
    questions: list[QuestionCheck] = field(default_factory=list)
    appended: int = 0
    #: Summarizer calls and inline folds on the agent's own path (overflow fallback).
    summarizer_calls: int = 0
    inline_folds: int = 0
    #: Requests the scripted provider rejected as too long (each one took the inline fallback).
    overflow_rejections: int = 0
    error: str | None = None
    done: bool = False
    #: Folds committed so far, as the supervisor last counted them in the store.
    folds_seen: int = 0

    @property
    def wire_total(self) -> int:
        return sum(c.wire_tokens for c in self.calls)

    @property
    def ledger_total(self) -> int:
        return sum(c.ledger_tokens for c in self.calls)

    @property
    def last(self) -> CallTrace | None:
        return self.calls[-1] if self.calls else None


def drive(handle: SessionHandle, run: AgentRun, provider: FakeProvider,
          stop: threading.Event) -> None:
    """Play ``run.script`` through ``handle`` (see the module doc); ends early when ``stop`` is set.

    An error ends this agent only: it is kept in ``run.error`` for the report.
    """
    conv = run.script.conversation
    questions = {q.seq: q for q in run.script.late_questions}
    ledger: list[dict[str, Any]] = []
    try:
        for index, message in enumerate(conv.messages):
            if stop.is_set():
                break
            if message.role == "assistant" and index > 0:
                _one_call(handle, run, provider, index, ledger, questions.get(index - 1))
            handle.append([message], key=f"demo-{index}")
            ledger.append(message.to_json())
            run.appended += 1
    except Exception as exc:  # reported per agent; the rest of the fleet goes on
        run.error = f"{type(exc).__name__}: {exc}"
    finally:
        run.summarizer_calls = handle.summarizer_calls
        run.inline_folds = handle.inline_folds
        run.overflow_rejections = provider.stats.by_status.get(400, 0)
        run.done = True


def _one_call(handle: SessionHandle, run: AgentRun, provider: FakeProvider, index: int,
              ledger: list[dict[str, Any]], question: LateQuestion | None) -> None:
    sent: list[list[dict[str, Any]]] = []

    def model(system: str, messages: list[dict[str, Any]]) -> Any:
        sent.append(messages)  # the last one is the request that succeeded
        return provider(system, messages)

    started = time.time()
    response = handle.call(model)
    without = provider.count_tokens({"system": run.script.conversation.system,
                                     "messages": ledger})
    run.calls.append(CallTrace(turn=len(run.calls) + 1, seq=index, started_at=started,
                               wire_tokens=read_usage(response.usage).prompt,
                               ledger_tokens=without))
    if question is not None and sent:
        run.questions.append(check_question(question, sent[-1], ledger))


def check_question(question: LateQuestion, window: Sequence[Mapping[str, Any]],
                   ledger: Sequence[Mapping[str, Any]]) -> QuestionCheck:
    """Where ``question.identifier`` appears in ``window`` (the messages one request sent).

    The last message of the window is the question itself and is not searched. Kept messages
    are told apart from summaries by sessionfold's frame line, and matched to their ledger seq
    by content.
    """
    seq_of: dict[str, int] | None = None
    in_summary = False
    kept: list[int] = []
    for raw in window[:-1]:
        if not mentions("\n".join(_strings(raw.get("content"))), question.identifier):
            continue
        if frame_info(parse_message(raw)) is not None:
            in_summary = True
            continue
        if seq_of is None:
            seq_of = {_canonical(m): seq for seq, m in enumerate(ledger)}
        kept.append(seq_of.get(_canonical(raw), -1))
    return QuestionCheck(question.identifier, question.seq, question.first_seen_seq,
                         in_summary, tuple(kept))


def _canonical(message: Mapping[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, separators=(",", ":"))


def _strings(value: Any) -> list[str]:
    """Every string inside a message's content (text, tool input, tool output)."""
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return out
