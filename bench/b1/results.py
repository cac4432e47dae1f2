"""From per-request records to the B1 tables and charts.

:func:`totals` reduces one :class:`~b1.replay.SystemRun` to the numbers the issue asks for;
:func:`markdown` renders them (one table per budget, the stress step, each system's
configuration); :func:`charts` draws billed tokens per call for chosen transcripts;
:func:`update_section` rewrites only the generated part of the B1 section of RESULTS.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from .needed import recall_totals
from .prices import PRICES, Prices
from .replay import RequestRecord, SystemRun

__all__ = ["Totals", "charts", "markdown", "totals", "update_section"]



@dataclass(frozen=True)
class Totals:
    system: str
    budget: int
    calls: int
    billed: int
    peak: int
    over_budget: int
    summarizer_calls: int
    summarizer_input: int
    summarizer_output: int
    #: Summarizer seconds (model time: the scaled sleep divided by the scale) on the agent's
    #: thread, and on other threads.
    on_path_s: float
    off_path_s: float
    broken_pair_requests: int
    task_missing: int
    retrievable: bool
    cached: int
    #: Requests that do not extend the previous one (the prefix cache broke: a compaction).
    prefix_breaks: int
    agent_dollars: float
    summarizer_dollars: float
    wall_s: float
    #: Needed-context recall (:func:`b1.needed.recall_totals`): identifiers needed and present,
    #: over all calls and over the calls from each transcript's first compaction on.
    needed: int = 0
    present: int = 0
    calls_after: int = 0
    needed_after: int = 0
    present_after: int = 0
    under_half: int = 0
    #: The same with what the recall oracle's answers gave back (equal to the above for a
    #: system without the recall tool), and what its extra calls cost -- all of it already in
    #: ``billed``, ``cached``, ``peak``, ``over_budget`` and ``agent_dollars``.
    recall_tool: bool = False
    present_tool: int = 0
    present_tool_after: int = 0
    under_half_tool: int = 0
    recall_calls: int = 0
    recall_tokens: int = 0
    recall_dollars: float = 0.0

    @property
    def dollars(self) -> float:
        return self.agent_dollars + self.summarizer_dollars

    @property
    def recall(self) -> float | None:
        return self.present / self.needed if self.needed else None

    @property
    def recall_after(self) -> float | None:
        return self.present_after / self.needed_after if self.needed_after else None

    @property
    def recall_with_tool(self) -> float | None:
        return self.present_tool / self.needed if self.needed else None

    @property
    def recall_with_tool_after(self) -> float | None:
        return self.present_tool_after / self.needed_after if self.needed_after else None

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data.update(dollars=self.dollars, recall=self.recall, recall_after=self.recall_after,
                    recall_with_tool=self.recall_with_tool,
                    recall_with_tool_after=self.recall_with_tool_after)
        return data


@dataclass(frozen=True)
class _Counts:
    """What :func:`~b1.needed.recall_totals` reads of a call: its need, what was present
    (without the recall tool, or with what its answers gave back), the size of the call's last
    request and what its first request read from the cache (so a compaction is a request that
    does not extend the one before it, recall exchange included)."""

    needed: int
    present: int
    tokens: int
    cached: int

    @classmethod
    def of(cls, record: RequestRecord, *, with_tool: bool) -> _Counts:
        return cls(record.needed, record.present_with_tool if with_tool else record.present,
                   record.recall_tokens if record.recall_calls else record.tokens,
                   record.cached)


def _requests(record: RequestRecord) -> list[tuple[int, int]]:
    """(tokens, cached) of every request a call made: its own, and the recall oracle's extra
    one (the oracle makes at most one per call)."""
    own = [(record.tokens, record.cached)]
    return [*own, (record.recall_tokens, record.recall_cached)] if record.recall_calls else own


def totals(run: SystemRun, prices: Prices = PRICES) -> Totals:
    requests = [r for t in run.transcripts for r in t.requests]
    sent = [pair for r in requests for pair in _requests(r)]
    breaks = 0
    for transcript in run.transcripts:
        counted = [_Counts.of(r, with_tool=False) for r in transcript.requests]
        breaks += sum(now.cached < before.tokens
                      for before, now in pairwise(counted))
    recall = recall_totals([_Counts.of(r, with_tool=False) for r in t.requests]
                           for t in run.transcripts)
    tool = recall_totals([_Counts.of(r, with_tool=True) for r in t.requests]
                         for t in run.transcripts)
    extra = [r for r in requests if r.recall_calls]
    calls = run.summarizer_calls
    s_in = sum(int(c["input_tokens"]) for c in calls)
    s_out = sum(int(c["output_tokens"]) for c in calls)
    return Totals(
        system=run.system, budget=run.budget, calls=len(requests),
        billed=sum(n for n, _ in sent), peak=max((n for n, _ in sent), default=0),
        over_budget=sum(n > run.budget for n, _ in sent),
        summarizer_calls=len(calls), summarizer_input=s_in, summarizer_output=s_out,
        on_path_s=sum(float(c["seconds"]) for c in calls if c["on_agent_thread"]),
        off_path_s=sum(float(c["seconds"]) for c in calls if not c["on_agent_thread"]),
        broken_pair_requests=sum(r.broken_pairs > 0 for r in requests),
        task_missing=sum(not r.task for r in requests),
        retrievable=all(t.retrievable for t in run.transcripts),
        cached=sum(c for _, c in sent), prefix_breaks=breaks,
        agent_dollars=sum(prices.request_dollars(n, c) for n, c in sent),
        summarizer_dollars=prices.calls_dollars(calls),
        wall_s=sum(t.wall_s for t in run.transcripts),
        needed=recall.needed, present=recall.present, calls_after=recall.calls_after,
        needed_after=recall.needed_after, present_after=recall.present_after,
        under_half=recall.under_half, recall_tool=run.recall_tool,
        present_tool=tool.present, present_tool_after=tool.present_after,
        under_half_tool=tool.under_half, recall_calls=sum(r.recall_calls for r in extra),
        recall_tokens=sum(r.recall_tokens for r in extra),
        recall_dollars=sum(prices.request_dollars(r.recall_tokens, r.recall_cached)
                           for r in extra),
    )


def _n(value: int) -> str:
    return f"{value:,}"


def _ratio(value: int, base: int | None) -> str:
    return f"{value / base:.2f}×" if base else "–"


def _ratio_f(value: float, base: float | None) -> str:
    return f"{value / base:.2f}×" if base else "–"


def _share(value: float | None) -> str:
    """A recall figure: three decimals (the goal is 0.99), or – when nothing was needed."""
    return "–" if value is None else f"{value:.3f}"


RECALL_HEADER = (
    "| system | needed-context recall | after 1st compaction | calls under 0.5 | with the "
    "recall tool (oracle: upper bound) | after 1st compaction | calls under 0.5 | recall "
    "calls | recall tokens billed | recall $ | $ vs the same system without the tool |")


def _without_tool(t: Totals, at: Sequence[Totals]) -> Totals | None:
    """The row of the same system without the recall tool (``X-recall`` -> ``X``)."""
    name = t.system.removesuffix("-recall")
    return next((o for o in at if o.system == name and not o.recall_tool), None)


def _recall_table(budget: int, at: Sequence[Totals]) -> list[str]:
    """Needed-context recall of every system at one budget, with and without the tool."""
    lines = [f"Needed-context recall at {budget:,} tokens (share of the identifiers each call's "
             "answer names, and an earlier message named, that its request holds; micro-"
             "averages):", "", RECALL_HEADER, "|---|" + "---:|" * 9 + "---:|"]
    for t in at:
        cells = [_share(t.recall), _share(t.recall_after), str(t.under_half)]
        if t.recall_tool:
            base = _without_tool(t, at)
            delta = f"{t.dollars / base.dollars - 1:+.1%}" if base and base.dollars else "–"
            cells += [_share(t.recall_with_tool), _share(t.recall_with_tool_after),
                      str(t.under_half_tool), _n(t.recall_calls), _n(t.recall_tokens),
                      f"{t.recall_dollars:.3f} ({t.recall_dollars / t.dollars:.1%})"
                      if t.dollars else "–", delta]
        else:
            cells += ["–"] * 7
        lines.append(f"| {t.system} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def markdown(runs: Sequence[SystemRun], *, prices: Prices = PRICES) -> str:
    """The generated tables: per budget, the stress step, and the systems' configurations."""
    lines: list[str] = []
    budgets = sorted({r.budget for r in runs})
    for budget in budgets:
        at = [totals(r, prices) for r in runs if r.budget == budget]
        base = next((t.billed for t in at if t.system == "none"), None)
        base_dollars = next((t.dollars for t in at if t.system == "none"), None)
        calls = at[0].calls if at else 0
        lines += [
            f"#### Budget {budget:,} tokens ({calls} calls)",
            "",
            "| system | billed input tokens | vs none | peak request | over budget | "
            "compactions (prefix breaks) | summarizer calls | summarizer tokens in / out | "
            "summarizer s on agent's path | broken-pair requests | task missing | originals "
            "retrievable | cache reads | $ agent | $ summarizer | $ total | vs none |",
            "|---|" + "---:|" * 15 + "---:|",
        ]
        for t in at:
            lines.append(
                f"| {t.system} | {_n(t.billed)} | {_ratio(t.billed, base)} | {_n(t.peak)} | "
                f"{t.over_budget} | {t.prefix_breaks} | {t.summarizer_calls} | "
                f"{_n(t.summarizer_input)} / {_n(t.summarizer_output)} | {t.on_path_s:.0f} | "
                f"{t.broken_pair_requests} | {t.task_missing} | "
                f"{'yes' if t.retrievable else 'no'} | "
                f"{t.cached / t.billed:.1%} | {t.agent_dollars:.2f} | "
                f"{t.summarizer_dollars:.3f} | {t.dollars:.2f} | "
                f"{_ratio_f(t.dollars, base_dollars)} |")
        lines.append("")
        idle = [r for r in runs if r.budget == budget and r.idle]
        if idle:
            cold = sorted({sum(q.cold for t in r.transcripts for q in t.requests) for r in idle})
            lines += [f"Idle-gap scenario: {' / '.join(map(str, cold))} of the {calls} calls "
                      "came after an idle gap past the cache's lifetime and wrote their whole "
                      "prompt (the same calls for every system).", ""]
        lines += _recall_table(budget, at)
    stress = [r for r in runs if r.stress is not None]
    if stress:
        lines += [
            f"#### Stress step: one more request after {stress[0].stress.transcript}'s "  # type: ignore[union-attr]
            "868 K-character final tool output",
            "",
            "| system | budget | request tokens | over budget | task in request | newest step "
            "in request | characters of that output sent |",
            "|---|---:|---:|---|---|---|---:|",
        ]
        for run in stress:
            s = run.stress
            assert s is not None
            lines.append(
                f"| {run.system} | {run.budget:,} | {_n(s.tokens)} | "
                f"{'yes' if s.tokens > run.budget else 'no'} | {'yes' if s.task else 'no'} | "
                f"{'yes' if s.newest_step else 'no'} | {_n(s.newest_chars)} |")
        lines.append("")
    lines += ["#### How each system was configured and driven", ""]
    seen: set[str] = set()
    for run in runs:
        if run.system in seen:
            continue
        seen.add(run.system)
        lines.append(f"- **{run.system}** — {run.config}. Path: {run.source}.")
    lines.append("")
    return "\n".join(lines)


def charts(runs: Sequence[SystemRun], transcript_ids: Sequence[str], directory: Path,
           prefix: str = "b1") -> list[Path]:
    """One PNG per transcript: billed tokens of each call, one line per system, a panel per
    budget. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    budgets = sorted({r.budget for r in runs})
    names = list(dict.fromkeys(r.system for r in runs))
    colors = plt.get_cmap("tab10")
    written: list[Path] = []
    for tid in transcript_ids:
        fig, axes = plt.subplots(1, len(budgets), figsize=(6.5 * len(budgets), 4.6),
                                 squeeze=False)
        for ax, budget in zip(axes[0], budgets, strict=True):
            for run in runs:
                match = next((t for t in run.transcripts if t.id == tid), None)
                if run.budget != budget or match is None:
                    continue
                ys = [r.tokens for r in match.requests]
                ax.plot(range(1, len(ys) + 1), ys, label=run.system,
                        color=colors(names.index(run.system) % 10),
                        linestyle=":" if run.system.endswith("-inprocess") else "-",
                        linewidth=2.0 if run.system.startswith("sessionfold") else 1.3)
            ax.axhline(budget, color="black", linestyle="--", linewidth=0.8)
            ax.text(1, budget, f" budget {budget:,}", va="bottom", fontsize=8)
            ax.set_title(f"{tid}, budget {budget:,}")
            ax.set_xlabel("model call")
            ax.set_ylabel("billed input tokens of the request")
            top = max(budget * 1.6, ax.get_ylim()[1] if ax.lines else budget)
            ax.set_ylim(0, min(top, budget * 2.2))  # the baseline may leave the frame
            ax.grid(alpha=0.3)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8,
                   frameon=False)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        path = directory / f"{prefix}-{re.sub(r'[^A-Za-z0-9_.-]', '_', tid)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def update_section(results_md: Path, generated: str, *, title: str,
                   part: str = "generated") -> None:
    """Replace one generated part of the B1 section (between its markers), keeping the rest of
    the file -- other sections, other parts and the hand-written reading -- as it is.

    A part not in the file yet goes right after the last B1 part (or, with no B1 section yet,
    at the end of the file under ``title``).
    """
    begin, end = f"<!-- B1:{part}:begin -->", f"<!-- B1:{part}:end -->"
    block = f"{begin}\n{generated.rstrip()}\n{end}"
    text = results_md.read_text(encoding="utf-8") if results_md.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        ends = list(re.finditer(r"<!-- B1:[A-Za-z0-9_.-]+:end -->", text))
        if ends:
            at = ends[-1].end()
            text = text[:at] + "\n\n" + block + text[at:]
        else:
            text = (text.rstrip() + "\n\n" if text.strip() else "") + f"{title}\n\n{block}\n"
    results_md.write_text(text, encoding="utf-8")
