"""The live view while the fleet runs: where things listen, and each agent's progress."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .fleet import AgentRun

__all__ = ["Dashboard", "progress_line"]


def _k(tokens: int) -> str:
    return f"{tokens / 1000:,.1f}k"


class Dashboard:
    """A rich renderable, rebuilt from the agents' runs at every refresh (see ``__rich__``)."""

    def __init__(self, runs: Sequence[AgentRun], header: Sequence[str]) -> None:
        self.runs = list(runs)
        self.header = list(header)

    def __rich__(self) -> RenderableType:
        table = Table(title_justify="left", expand=False)
        for name, justify in (("session", "left"), ("turns", "right"), ("folds", "right"),
                              ("window now", "right"), ("ledger now", "right"),
                              ("sent so far", "right"), ("ledger re-sent would be", "right")):
            table.add_column(name, justify=justify,  # type: ignore[arg-type]
                             no_wrap=name == "session")
        for run in self.runs:
            last = run.last
            state = " (error)" if run.error else (" done" if run.done else "")
            table.add_row(
                run.session_id + state, f"{len(run.calls)}/{run.script.model_calls}",
                str(run.folds_seen), _k(last.wire_tokens) if last else "-",
                _k(last.ledger_tokens) if last else "-", _k(run.wire_total),
                _k(run.ledger_total))
        table.add_section()
        table.add_row(Text("fleet", style="bold"), *_totals(self.runs))
        return Group(Text("\n".join(self.header), style="cyan"), table)


def _totals(runs: Sequence[AgentRun]) -> list[str]:
    done = sum(len(r.calls) for r in runs)
    planned = sum(r.script.model_calls for r in runs)
    return [f"{done}/{planned}", str(sum(r.folds_seen for r in runs)), "", "",
            _k(sum(r.wire_total for r in runs)), _k(sum(r.ledger_total for r in runs))]


def progress_line(runs: Sequence[AgentRun]) -> str:
    """One line of progress, for output that is not a terminal (logs, CI)."""
    turns, folds, _, _, sent, ledger = _totals(runs)
    return (f"turns {turns}, folds committed {folds}, tokens on the wire {sent} "
            f"vs in the ledger {ledger}")
