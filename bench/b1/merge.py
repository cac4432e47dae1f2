"""One per-session table from several B1 runs of the same transcripts (``runs.json`` files).

The peers, sessionfold on its simulated clock and landed main are run apart (each in its own
process, some in their own virtualenvs, one after the other on a shared machine); every run
replays the same transcripts against the same scripted model and counter, so their records
compare request for request. ``none`` is taken from the first file that has it.

    .venv/bin/python bench/b1/merge.py --label days /tmp/peers/days/runs.json \\
        main=/tmp/base/days/runs.json /tmp/full/days/runs.json

An argument ``NAME=PATH`` renames the systems of that file ``NAME:system`` (landed main beside
the work tree, say). Prints the :func:`b1.per_session.summary` table, and with
``--sessions 16000,...`` each session's row at those budgets
(:func:`b1.per_session.per_session_table`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from b1.per_session import per_session, per_session_table, summary
from b1.replay import SystemRun

__all__ = ["load_runs", "main"]


def load_runs(arguments: list[str]) -> list[SystemRun]:
    """The runs of every file, ``none`` once, a ``NAME=`` file's systems renamed."""
    runs: list[SystemRun] = []
    have_none: set[int] = set()
    for argument in arguments:
        prefix, sep, path = argument.partition("=")
        if not sep:
            prefix, path = "", argument
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        for raw in data["runs"]:
            run = SystemRun.from_json(raw)
            if run.system == "none":
                if run.budget in have_none:
                    continue
                have_none.add(run.budget)
            elif prefix:
                run.system = f"{prefix}:{run.system}"
            runs.append(run)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("runs", nargs="+", help="runs.json files, or NAME=runs.json")
    parser.add_argument("--label", default="", help="a title for the table")
    parser.add_argument("--sessions", default="", metavar="BUDGET[,BUDGET...]",
                        help="also print each session's row at these budgets")
    args = parser.parse_args(argv)
    title = f"#### {args.label}" if args.label else ""
    figures = per_session(load_runs(args.runs))
    print(summary(figures, title=title))
    for budget in filter(None, args.sessions.split(",")):
        print(per_session_table(figures, int(budget)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
