"""The demo's report: per agent and in total, from what the agents saw and what the store holds.

Billed input tokens are counted the same way on both sides, by the scripted provider: *with*
sessionfold, the prompt each call actually sent (the compacted window); *without*, the whole
ledger up to that call, which is what an agent that never compacts re-sends every time. Neither
side uses prompt caching, so the two columns compare like for like.

Folds, refusals (by reason) and background summarizer calls come from the session store's
records of every fold visit; summarizer calls *on the agents' path* are the ones the client made
inline (the overflow fallback), zero while the background keeps up. A ledger is *intact* when it
holds every message the agent appended, in order and unchanged: folds edit windows, never
ledgers.

Agents are named by their session ids (``demo-<run id>-<agent>``), the ids ``sessionfold
inspect`` and ``sessionfold list`` take: a reader goes from a row of the report to that
session's window.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from sessionfold.store import SessionStore, StoredRecord

from .fleet import AgentRun, QuestionCheck

__all__ = ["AgentReport", "DemoReport", "agent_report", "render_report", "write_json"]


@dataclass(frozen=True)
class AgentReport:
    """One agent at the end of the demo."""

    name: str
    session_id: str
    source: str
    messages: int
    calls: int
    folds: int
    visits: int
    refusals: dict[str, int]
    billed_with: int
    billed_without: int
    peak_wire_tokens: int
    last_wire_tokens: int
    last_ledger_tokens: int
    #: Calls whose whole ledger would have been over the model's context window.
    over_context_without: int
    agent_summarizer_calls: int
    inline_folds: int
    overflow_rejections: int
    background_summarizer_calls: int
    ledger_messages: int
    ledger_intact: bool
    questions: list[QuestionCheck]
    #: Turn (1-based call index) before which each fold landed, oldest first.
    fold_turns: list[int]
    error: str | None = None

    @property
    def saved_ratio(self) -> float:
        """Share of the input tokens sessionfold saved (0 when nothing was billed)."""
        if not self.billed_without:
            return 0.0
        return 1.0 - self.billed_with / self.billed_without


@dataclass
class DemoReport:
    """The whole demo: settings it ran with, every agent, and where things are."""

    agents: list[AgentReport]
    summarizer: str
    summarizer_kind: str
    budget_tokens: int
    context_window: int
    model_latency_s: float
    run_s: float = 0.0
    settle_s: float = 0.0
    settled: bool = True
    flower_url: str | None = None
    metrics_url: str | None = None
    chart_path: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def billed_with(self) -> int:
        return sum(a.billed_with for a in self.agents)

    @property
    def billed_without(self) -> int:
        return sum(a.billed_without for a in self.agents)

    @property
    def folds(self) -> int:
        return sum(a.folds for a in self.agents)

    @property
    def agent_summarizer_calls(self) -> int:
        return sum(a.agent_summarizer_calls for a in self.agents)

    @property
    def refusals(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for a in self.agents:
            total.update(a.refusals)
        return dict(sorted(total.items()))

    @property
    def questions(self) -> list[QuestionCheck]:
        return [q for a in self.agents for q in a.questions]

    def to_json(self) -> dict[str, Any]:
        """Everything in the report as plain JSON (what ``sessionfold-demo.json`` holds)."""
        agents = []
        for a in self.agents:
            data = asdict(a)
            data["saved_ratio"] = round(a.saved_ratio, 4)
            data["questions"] = [{**asdict(q), "answered": q.answered, "where": q.where}
                                 for q in a.questions]
            agents.append(data)
        questions = self.questions
        return {
            "summarizer": self.summarizer, "summarizer_kind": self.summarizer_kind,
            "budget_tokens": self.budget_tokens, "context_window": self.context_window,
            "model_latency_s": self.model_latency_s, "run_s": round(self.run_s, 2),
            "settle_s": round(self.settle_s, 2), "settled": self.settled,
            "flower_url": self.flower_url, "metrics_url": self.metrics_url,
            "chart_path": self.chart_path, "notes": self.notes,
            "totals": {
                "agents": len(self.agents), "calls": sum(a.calls for a in self.agents),
                "billed_with": self.billed_with, "billed_without": self.billed_without,
                "saved_ratio": round(1 - self.billed_with / self.billed_without, 4)
                if self.billed_without else 0.0,
                "folds": self.folds, "refusals": self.refusals,
                "agent_summarizer_calls": self.agent_summarizer_calls,
                "background_summarizer_calls": sum(a.background_summarizer_calls
                                                   for a in self.agents),
                "ledgers_intact": all(a.ledger_intact for a in self.agents),
                "questions": len(questions),
                "questions_answered": sum(q.answered for q in questions),
                "errors": sum(a.error is not None for a in self.agents),
            },
            "agents": agents,
        }


def agent_report(store: SessionStore, run: AgentRun, *, context_window: int) -> AgentReport:
    """Read the session's records and ledger and put them beside what the agent saw."""
    sid = run.session_id
    records = store.records(sid)
    folded = [r for r in records if r.outcome == "folded"]
    refusals: Counter[str] = Counter(ref.reason for r in records for ref in r.refusals)
    background = sum(r.summarizer_usage.calls for r in records if r.trigger != "overflow")
    ledger = store.read_ledger(sid)
    originals = run.script.conversation.messages[:run.appended]
    intact = len(ledger) == len(originals) and all(
        entry.seq == seq and entry.message == original
        for seq, (entry, original) in enumerate(zip(ledger, originals, strict=True)))
    calls = run.calls
    last = calls[-1] if calls else None
    return AgentReport(
        name=run.script.name, session_id=sid, source=run.script.source,
        messages=run.appended, calls=len(calls), folds=len(folded), visits=len(records),
        refusals=dict(sorted(refusals.items())),
        billed_with=run.wire_total, billed_without=run.ledger_total,
        peak_wire_tokens=max((c.wire_tokens for c in calls), default=0),
        last_wire_tokens=last.wire_tokens if last else 0,
        last_ledger_tokens=last.ledger_tokens if last else 0,
        over_context_without=sum(c.ledger_tokens > context_window for c in calls),
        agent_summarizer_calls=run.summarizer_calls, inline_folds=run.inline_folds,
        overflow_rejections=run.overflow_rejections, background_summarizer_calls=background,
        ledger_messages=len(ledger), ledger_intact=intact, questions=list(run.questions),
        fold_turns=_fold_turns(run, folded), error=run.error,
    )


def _fold_turns(run: AgentRun, folded: list[StoredRecord]) -> list[int]:
    """For each fold, the first call that started after it was committed (its turn number).

    Both clocks are this machine's wall clock. A fold committed after the last call gets the
    turn after it.
    """
    turns = []
    for record in folded:
        at = _timestamp(record.created_at)
        turn = next((c.turn for c in run.calls if c.started_at >= at), len(run.calls) + 1)
        turns.append(turn)
    return sorted(turns)


def _timestamp(moment: datetime) -> float:
    if moment.tzinfo is None:  # the store writes UTC; a naive value read back means UTC too
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


# --- rendering --------------------------------------------------------------------------------

def _k(tokens: int) -> str:
    return f"{tokens / 1000:,.1f}k" if tokens >= 10_000 else f"{tokens:,}"


def _yes(flag: bool) -> Text:
    return Text("yes", style="green") if flag else Text("NO", style="bold red")


def render_report(report: DemoReport) -> RenderableType:
    """The report as rich tables: per agent, totals, refusals, late questions, and notes."""
    parts: list[RenderableType] = [_agents_table(report)]
    refusals = report.refusals
    if refusals:
        table = Table(title="Refusals to fold, by reason (every visit is recorded)",
                      title_justify="left")
        table.add_column("reason")
        table.add_column("count", justify="right")
        for reason, count in refusals.items():
            table.add_row(reason, str(count))
        parts.append(table)
    if report.questions:
        parts.append(_questions_table(report))
    parts.append(Text("\n".join(_summary_lines(report))))
    return Group(*parts)


def _agents_table(report: DemoReport) -> Table:
    table = Table(title="Billed input tokens per agent: with sessionfold vs re-sending the "
                        "whole ledger", title_justify="left")
    for name, justify in (("session", "left"), ("calls", "right"), ("with", "right"),
                          ("without", "right"), ("saved", "right"), ("folds", "right"),
                          ("peak window", "right"), ("window / ledger now", "right"),
                          ("agent-path summarizer calls", "right"), ("ledger intact", "center"),
                          ("late questions", "right")):
        # Session ids are what a reader copies into `sessionfold inspect`: never cut.
        table.add_column(name, justify=justify,  # type: ignore[arg-type]
                         no_wrap=name == "session")
    for a in report.agents:
        answered = sum(q.answered for q in a.questions)
        table.add_row(
            a.session_id + (" (error)" if a.error else ""), str(a.calls), _k(a.billed_with),
            _k(a.billed_without), f"{a.saved_ratio:.0%}", str(a.folds),
            _k(a.peak_wire_tokens), f"{_k(a.last_wire_tokens)} / {_k(a.last_ledger_tokens)}",
            str(a.agent_summarizer_calls), _yes(a.ledger_intact),
            f"{answered}/{len(a.questions)}" if a.questions else "-")
    total_without = report.billed_without
    saved = 1 - report.billed_with / total_without if total_without else 0.0
    questions = report.questions
    table.add_section()
    table.add_row(
        Text("total", style="bold"), str(sum(a.calls for a in report.agents)),
        _k(report.billed_with), _k(total_without), f"{saved:.0%}", str(report.folds),
        _k(max((a.peak_wire_tokens for a in report.agents), default=0)), "",
        str(report.agent_summarizer_calls), _yes(all(a.ledger_intact for a in report.agents)),
        f"{sum(q.answered for q in questions)}/{len(questions)}" if questions else "-")
    return table


def _questions_table(report: DemoReport) -> Table:
    table = Table(title="Late questions about early identifiers: answerable from the window "
                        "sent with the question?", title_justify="left")
    for name in ("session", "identifier", "first seen", "asked at", "answered", "found in"):
        table.add_column(name, no_wrap=name in ("session", "identifier"))
    for a in report.agents:
        for q in a.questions:
            table.add_row(a.session_id, q.identifier, f"#{q.first_seen_seq}", f"#{q.asked_seq}",
                          _yes(q.answered), q.where)
    return table


def _summary_lines(report: DemoReport) -> list[str]:
    lines = [
        f"summarizer: {report.summarizer}",
        f"budget {report.budget_tokens:,} tokens per agent; scripted model: context window "
        f"{report.context_window:,}, {report.model_latency_s:g}s per call (time-scaled)",
        f"agents ran {report.run_s:.1f}s; the last folds landed {report.settle_s:.1f}s later"
        + ("" if report.settled else " (gave up waiting: some folds were still pending)"),
        f"summarizer calls on the agents' path: {report.agent_summarizer_calls}"
        + ("" if report.agent_summarizer_calls else " (every fold ran in the background)"),
    ]
    over = sum(a.over_context_without for a in report.agents)
    if over:
        lines.append(f"without sessionfold, {over} calls would have exceeded the model's "
                     "context window and been rejected")
    errors = [f"{a.session_id}: {a.error}" for a in report.agents if a.error]
    lines += [f"error: {e}" for e in errors]
    if report.agents:
        lines.append(f"a session's window, fold seams and all: sessionfold inspect "
                     f"{report.agents[0].session_id} (every session: sessionfold list)")
    if report.chart_path:
        lines.append(f"chart: {report.chart_path}")
    lines += report.notes
    return lines


def write_json(report: DemoReport, path: Path) -> None:
    """Write :meth:`DemoReport.to_json` to ``path``."""
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
