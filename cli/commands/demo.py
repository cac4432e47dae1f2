"""``sessionfold demo``: run a fleet of standing agents through the whole pipeline and report.

::

    sessionfold demo                                  # 12 generated agents x 150 turns
    sessionfold demo --agents 2 --turns 40 --budget 8000 --out /tmp/demo
    sessionfold demo --transcripts ~/agent-runs/      # replay your own session files
    sessionfold demo --keep-running                   # then keep Flower and the rest up

Starts the pipeline (embedded Redis and SQLite unless ``REDIS_URL`` / ``DATABASE_URL`` name real
services; two workers, the scheduler, Flower, metrics), runs the agents concurrently with a
scripted, time-scaled model, waits for the last folds, prints the report and writes
``sessionfold-demo.png`` and ``sessionfold-demo.json`` to ``--out``. Exits 1 when an agent failed
or folds were still pending at the end. The report names each agent by its session id, which
``sessionfold inspect`` and ``sessionfold list`` take; ``--keep-running`` leaves the pipeline up
after the report until Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

__all__ = ["register"]

log = logging.getLogger(__name__)

#: Columns of the report written to a log or a pipe: its widest table (session ids of 26
#: characters) fits on one line per agent.
REPORT_WIDTH = 170


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``demo`` subcommand."""
    demo = subparsers.add_parser(
        "demo", help="run a fleet of standing agents through the pipeline and report",
        description="Start the pipeline (embedded Redis and SQLite unless REDIS_URL / "
                    "DATABASE_URL are set; two workers, the scheduler, Flower and metrics), "
                    "run a fleet of standing agents through the client with a scripted model, "
                    "and report billed input tokens with and without sessionfold, folds, "
                    "refusals, summarizer calls on the agents' path and late questions about "
                    "early identifiers. Writes sessionfold-demo.png and sessionfold-demo.json. "
                    "Uses ANTHROPIC_API_KEY for the summarizer when set, the offline one "
                    "otherwise. Agents are named by their session ids: `sessionfold inspect "
                    "ID` shows one's window, `sessionfold list` every session.")
    demo.add_argument("--agents", type=int, default=None, metavar="N",
                      help="agents to run (default 12; with --transcripts, every file)")
    demo.add_argument("--turns", type=int, default=150, metavar="T",
                      help="tool steps per generated agent (default 150)")
    demo.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                      help="where the chart and the JSON report go (default: here)")
    demo.add_argument("--transcripts", type=Path, default=None, metavar="DIR",
                      help="replay the session files (*.json) in DIR instead of generated agents")
    demo.add_argument("--budget", type=int, default=24_000, metavar="B",
                      help="token budget of every session (default 24000)")
    demo.add_argument("--context-window", type=int, default=200_000, metavar="W",
                      help="the scripted model's context window (default 200000)")
    demo.add_argument("--model-latency", type=float, default=0.05, metavar="S",
                      help="seconds per scripted model call, time-scaled (default 0.05)")
    demo.add_argument("--seed", type=int, default=7, help="seed of the generated agents")
    demo.add_argument("--keep-running", action="store_true",
                      help="after the report, keep the pipeline (Redis, workers, scheduler, "
                           "Flower, metrics) up until Ctrl-C, to look at the fold jobs in "
                           "Flower")
    demo.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    # rich and the pipeline (the demo extra, which brings the worker extra) load only now.
    from rich.console import Console
    from sessionfold.runtime.settings import Settings

    from ..demo import DemoOptions, run_demo

    options = DemoOptions(agents=args.agents, turns=args.turns, out=args.out,
                          transcripts=args.transcripts, budget=args.budget,
                          context_window=args.context_window, model_latency_s=args.model_latency,
                          seed=args.seed, keep_running=args.keep_running)
    console = Console()
    if not console.is_terminal:  # a log or a pipe: wide enough that no table row wraps
        console = Console(width=max(console.width, REPORT_WIDTH))
    settings = Settings()
    embedded_data = settings.embedded_data()
    if embedded_data is not None:
        log.info("sessionfold demo: %s", embedded_data)
    report = run_demo(settings, options, console)
    failed = any(a.error for a in report.agents) or not report.settled
    return 1 if failed else 0
