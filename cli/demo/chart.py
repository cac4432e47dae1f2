"""The demo's chart: window tokens and ledger tokens per turn for a few agents, folds marked.

matplotlib draws off screen (the Agg backend, chosen here before pyplot is imported), so the
chart is written on a machine without a display. matplotlib is a development dependency: without
it :func:`write_chart` raises :class:`ChartUnavailableError` and the demo says so instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sessionfold.core.errors import SessionfoldError

from .fleet import AgentRun

__all__ = ["CHART_NAME", "ChartUnavailableError", "write_chart"]

CHART_NAME = "sessionfold-demo.png"


class ChartUnavailableError(SessionfoldError):
    """matplotlib is not installed."""


def write_chart(path: Path, runs: Sequence[AgentRun], fold_turns: Sequence[Sequence[int]], *,
                budget_tokens: int, trigger_tokens: int, max_agents: int = 3) -> Path:
    """Draw up to ``max_agents`` agents, one panel each; returns ``path``.

    ``fold_turns[i]`` are the turns before which folds of ``runs[i]`` landed.
    """
    try:
        import matplotlib
    except ImportError:
        raise ChartUnavailableError(
            "matplotlib is not installed (pip install matplotlib, or install sessionfold with "
            "its [dev] extra); no chart was drawn") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(run, turns) for run, turns in zip(runs, fold_turns, strict=True) if run.calls]
    shown = shown[:max_agents]
    if not shown:
        raise ChartUnavailableError("no agent made a model call: nothing to draw")
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 3.2 * len(shown) + 0.6), sharex=True,
                             squeeze=False)
    try:
        for ax, (run, turns) in zip(axes[:, 0], shown, strict=True):
            _panel(ax, run, turns, budget_tokens, trigger_tokens)
        axes[-1, 0].set_xlabel("turn (one model call each)")
        fig.suptitle("sessionfold demo: what each call sent (window) vs the whole ledger",
                     fontsize=12)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def _panel(ax: object, run: AgentRun, fold_turns: Sequence[int], budget: int,
           trigger: int) -> None:
    from matplotlib.axes import Axes

    assert isinstance(ax, Axes)
    x = [c.turn for c in run.calls]
    ax.plot(x, [c.ledger_tokens for c in run.calls], color="#999999", linewidth=1.5,
            label="ledger (re-sent without sessionfold)")
    ax.plot(x, [c.wire_tokens for c in run.calls], color="#1f77b4", linewidth=1.8,
            label="window sent (with sessionfold)")
    ax.axhline(budget, color="#d62728", linestyle="--", linewidth=1, label="budget")
    ax.axhline(trigger, color="#ff7f0e", linestyle=":", linewidth=1, label="fold trigger")
    by_turn = {c.turn: c.wire_tokens for c in run.calls}
    marked = [t for t in fold_turns if t in by_turn]
    if marked:
        ax.scatter(marked, [by_turn[t] for t in marked], marker="v", color="#2ca02c", s=40,
                   zorder=3, label=f"fold landed ({len(fold_turns)})")
    ax.set_title(f"{run.script.name} ({run.session_id})", fontsize=10, loc="left")
    ax.set_ylabel("tokens")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
