"""A fold's CPU in a loop under the conditions a worker's pool child meets, alternated.

A whole worker folds a ~300-item window in more CPU time than ``bench/profile_fold.py``'s loop
does for only ~10 % more instructions (bench/RESULTS.md, "Fold CPU a fifth time"). This runs the
same loop (``runtime.fold_procedure.run_fold``, the offline summarizer, the store opened as a
worker opens it, the collector settled) under one condition at a time, each in a fresh
interpreter, the order rotated every round, so that a condition that costs CPU shows up beside
the plain loop measured minutes apart on the same machine:

- ``plain``: the loop ``bench/profile_fold.py`` times;
- ``celery-heap``: Celery's app, worker, prefork pool and broker transport built in the process
  first, so the heap a fold walks is a pool child's size;
- ``cache-flush``: between two folds, 8 MB written one byte per cache line, as when the
  consumer, Redis and the broker ran on the core since the last fold (cold L1 and L2);
- ``pause``: 10 ms asleep between folds, as a child waiting for its next job gives its core
  away.

Only the folds are timed (``time.process_time``); the flush and the pause are not. Nothing is
asserted here (``tests/bench/test_fold_conditions_quick.py`` runs ``--quick``)::

    .venv/bin/python bench/fold_conditions.py                  # 3 rounds, 40 folds, 291 messages
    .venv/bin/python bench/fold_conditions.py --rounds 5 --json bench/out/fold-conditions.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_fold import SIZES, folding_sessions

CONDITIONS = ("plain", "celery-heap", "cache-flush", "pause")
#: Bytes written between two folds by ``cache-flush``: more than L1 and L2 together.
FLUSH_BYTES = 8 << 20
#: A cache line: ``cache-flush`` writes one byte of each.
LINE = 64
PAUSE_S = 0.010


def _celery_heap() -> Any:
    """What a pool child holds: the app (returned: keep it for the run, as a child keeps its
    app), and the modules of the worker and its pool imported."""
    import celery.concurrency.prefork
    import celery.worker  # noqa: F401
    import kombu.transport.redis  # noqa: F401
    from sessionfold.runtime.settings import Settings
    from sessionfold.workers.celery_app import make_celery

    # Built, never connected: nothing here talks to Redis.
    app = make_celery(Settings(summarizer="offline", anthropic_api_key=None),
                      redis_url="redis://127.0.0.1:6379/0")
    app.loader.import_default_modules()
    return app


def one(condition: str, messages: int, folds: int) -> dict[str, Any]:
    """Fold ``folds`` sessions under ``condition`` in this process; CPU ms of each fold."""
    from sessionfold.core.summarizers import ExtractiveSummarizer
    from sessionfold.runtime.fold_procedure import FoldJob, run_fold

    app = _celery_heap() if condition == "celery-heap" else None
    label, transcript, n = next(s for s in SIZES if s[2] == messages)
    scratch = bytearray(FLUSH_BYTES) if condition == "cache-flush" else None
    summarizer = ExtractiveSummarizer()
    cpu: list[float] = []
    folded = 0
    with tempfile.TemporaryDirectory(prefix="sf-fold-conditions-") as tmp, folding_sessions(
            f"sqlite:///{Path(tmp) / 'store.db'}", transcript, n, folds, summarizer) as ready:
        for i, sid in enumerate(ready.ids):
            if scratch is not None:
                for k in range(0, FLUSH_BYTES, LINE):
                    scratch[k] ^= 1
            elif condition == "pause":
                time.sleep(PAUSE_S)
            c0 = time.process_time()
            report = run_fold(ready.store, summarizer, FoldJob(session_id=sid, job_id=f"j{i}"))
            cpu.append((time.process_time() - c0) * 1000)
            folded += report.outcome == "folded"
    del app  # held until the folds are done
    return {"condition": condition, "label": label, "folds": len(cpu), "folded": folded,
            "cpu_median_ms": round(statistics.median(cpu), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--folds", type=int, default=40, help="timed folds per run")
    parser.add_argument("--messages", type=int, choices=[s[2] for s in SIZES], default=291)
    parser.add_argument("--conditions", default=",".join(CONDITIONS),
                        help=f"comma-separated, of: {', '.join(CONDITIONS)}")
    parser.add_argument("--quick", action="store_true", help="1 round, 5 folds, 40 messages")
    parser.add_argument("--json")
    parser.add_argument("--one", choices=CONDITIONS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.folds, args.messages = 1, 5, 40
    if args.rounds < 1 or args.folds < 1:
        parser.error("--rounds and --folds must be at least 1")
    if args.one:  # a child run: one condition, its result as one JSON line
        print(json.dumps(one(args.one, args.messages, args.folds)))
        return 0
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    unknown = sorted(set(conditions) - set(CONDITIONS))
    if unknown or not conditions:
        parser.error(f"--conditions takes {', '.join(CONDITIONS)}; got {args.conditions!r}")
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in conditions}
    for r in range(args.rounds):
        order = conditions[r % len(conditions):] + conditions[:r % len(conditions)]
        for condition in order:
            done = subprocess.run(
                [sys.executable, __file__, "--one", condition, "--messages", str(args.messages),
                 "--folds", str(args.folds)], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.stderr.write(done.stdout + done.stderr)
                raise SystemExit(f"the {condition} run failed (exit {done.returncode})")
            runs[condition].append(json.loads(done.stdout.strip().splitlines()[-1]))
    label = runs[conditions[0]][0]["label"]
    print(f"Command: `.venv/bin/python bench/fold_conditions.py --rounds {args.rounds} --folds "
          f"{args.folds} --messages {args.messages}`. Run {datetime.now(UTC):%Y-%m-%d %H:%M} "
          f"UTC; machine {platform.machine()}, Python {platform.python_version()}; store "
          f"SQLite; {label}, the offline summarizer; each run a fresh process.\n")
    print("| condition | CPU ms/fold, median of the rounds | each round's median |")
    print("|---|---:|---|")
    rows = []
    for condition in conditions:
        medians = [run["cpu_median_ms"] for run in runs[condition]]
        rows.append({"condition": condition, "label": label, "rounds": runs[condition],
                     "cpu_median_ms": round(statistics.median(medians), 2)})
        print(f"| {condition} | **{statistics.median(medians):.1f}** | "
              f"{', '.join(f'{m:.1f}' for m in medians)} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
