"""Per-session figures: each session's dollars against its own no-compaction dollars.

Totals hide what a promise is about. "Never dearer than no compaction" and "never over budget"
are promises to each session, so :func:`per_session` prices every transcript of every run on
its own (the agent's requests, recall rounds included, and the summarizer calls made for that
transcript) and :func:`summary` reduces them per system and budget to what the promises need:
sessions above their own no-compaction cost (ratio > 1.01), the worst ratio and its session,
the median, the total ratio, requests over budget and the sessions that had any, the peak
request, needed-context recall without the tool, and the summarizer's share of the dollars.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .prices import PRICES, Prices
from .replay import RequestRecord, SystemRun

__all__ = ["ABOVE_NONE", "SessionFigures", "per_session", "per_session_table", "summary"]

#: A session costs "more than no compaction" past this ratio (1 % of rounding and counting).
ABOVE_NONE = 1.01


@dataclass(frozen=True)
class SessionFigures:
    system: str
    budget: int
    transcript: str
    calls: int
    agent_dollars: float
    summarizer_dollars: float
    none_dollars: float
    over_budget: int
    peak: int
    needed: int
    present: int

    @property
    def dollars(self) -> float:
        return self.agent_dollars + self.summarizer_dollars

    @property
    def ratio(self) -> float:
        return self.dollars / self.none_dollars if self.none_dollars else 1.0


def _sent(record: RequestRecord) -> list[tuple[int, int]]:
    own = [(record.tokens, record.cached)]
    return [*own, (record.recall_tokens, record.recall_cached)] if record.recall_calls else own


def per_session(runs: Sequence[SystemRun], prices: Prices = PRICES) -> list[SessionFigures]:
    """Figures of every (system, budget, transcript) of ``runs`` that has a ``none`` run at the
    same budget to compare with (the ``none`` rows themselves included, at ratio 1)."""
    none: dict[tuple[int, str], float] = {}
    for run in runs:
        if run.system == "none":
            for t in run.transcripts:
                none[(run.budget, t.id)] = sum(prices.request_dollars(n, c)
                                               for r in t.requests for n, c in _sent(r))
    found: list[SessionFigures] = []
    for run in runs:
        calls: dict[str, list[Mapping[str, Any]]] = {}
        for call in run.summarizer_calls:
            calls.setdefault(str(call["transcript"]), []).append(call)
        for t in run.transcripts:
            base = none.get((run.budget, t.id))
            if base is None:
                continue
            sent = [pair for r in t.requests for pair in _sent(r)]
            found.append(SessionFigures(
                system=run.system, budget=run.budget, transcript=t.id, calls=len(t.requests),
                agent_dollars=sum(prices.request_dollars(n, c) for n, c in sent),
                summarizer_dollars=prices.calls_dollars(calls.get(t.id, [])),
                none_dollars=base, over_budget=sum(n > run.budget for n, _ in sent),
                peak=max((n for n, _ in sent), default=0),
                needed=sum(r.needed for r in t.requests),
                present=sum(r.present for r in t.requests)))
    return found


def summary(figures: Sequence[SessionFigures], *, title: str = "") -> str:
    """One row per (budget, system): the per-session promises (module doc)."""
    lines = [title, ""] if title else []
    lines += [
        "| budget | system | sessions | above none (>1.01×) | worst (session) | median | "
        "total vs none | requests over budget (sessions) | peak request | recall (no tool) | "
        "summarizer share of $ |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    keys = list(dict.fromkeys((f.budget, f.system) for f in figures))
    for budget, system in sorted(keys, key=lambda k: k[0]):
        rows = [f for f in figures if f.budget == budget and f.system == system]
        worst = max(rows, key=lambda f: f.ratio)
        dollars = sum(f.dollars for f in rows)
        none = sum(f.none_dollars for f in rows)
        needed = sum(f.needed for f in rows)
        present = sum(f.present for f in rows)
        summarizer = sum(f.summarizer_dollars for f in rows)
        lines.append(
            f"| {budget:,} | {system} | {len(rows)} | "
            f"{sum(f.ratio > ABOVE_NONE for f in rows)} | "
            f"{worst.ratio:.3f}× ({worst.transcript}) | "
            f"{statistics.median(f.ratio for f in rows):.3f}× | "
            f"{dollars / none if none else 1.0:.3f}× | "
            f"{sum(f.over_budget for f in rows)} ({sum(f.over_budget > 0 for f in rows)}) | "
            f"{max(f.peak for f in rows):,} | "
            f"{present / needed if needed else 1.0:.3f} | "
            f"{summarizer / dollars if dollars else 0.0:.1%} |")
    lines.append("")
    return "\n".join(lines)


def per_session_table(figures: Sequence[SessionFigures], budget: int) -> str:
    """Each session at one budget: its calls, then per system its ratio to its own no
    compaction and its requests over budget (``ratio / over``)."""
    at = [f for f in figures if f.budget == budget]
    systems = [s for s in dict.fromkeys(f.system for f in at) if s != "none"]
    transcripts = list(dict.fromkeys(f.transcript for f in at))
    lines = [f"Per session at {budget:,} tokens: $ vs its own no compaction / requests over "
             "budget", "",
             "| session | calls | none $ | " + " | ".join(systems) + " |",
             "|---|---:|---:|" + "---:|" * len(systems)]
    by = {(f.system, f.transcript): f for f in at}
    for tid in transcripts:
        base = by.get(("none", tid)) or next(f for f in at if f.transcript == tid)
        cells = []
        for system in systems:
            f = by.get((system, tid))
            cells.append("–" if f is None else f"{f.ratio:.3f}× / {f.over_budget}")
        lines.append(f"| {tid} | {base.calls} | {base.none_dollars:.3f} | "
                     + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)
