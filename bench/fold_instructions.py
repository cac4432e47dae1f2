"""Instructions a fold executes, counted by valgrind: a figure the machine's load cannot move.

``bench/profile_fold.py`` reports CPU time, which on a shared machine moves by a factor of two
from one minute to the next (another tenant's load, the host's clock). Comparing two versions
of the code by CPU time then takes many alternating rounds. Counting instructions does not:
``valgrind --tool=callgrind`` counts every instruction the process executes, and the same code
on the same input gives the same count to a few parts in ten thousand, whatever else runs.

What is counted: the fold procedure the Celery task runs (``runtime.fold_procedure.run_fold``)
with the offline summarizer, on sessions made from a shipped transcript (as profile_fold makes
them: twice over their budget, so every visit folds), with the store opened as a fold worker
opens it. A process that folds ``--folds`` sessions (``30`` by default) is counted beside one
that folds 10 (same start-up, same warm-up fold): the difference divided by the difference in
folds is one fold's instructions, start-up and imports cancelled out. Both run at once.

    .venv/bin/python bench/fold_instructions.py                     # 291 messages, unpriced
    .venv/bin/python bench/fold_instructions.py --economics dollars --messages 40
    .venv/bin/python bench/fold_instructions.py --json bench/out/fold-instructions.json

Instructions are not time (a cache miss costs more than an add), so the figure ranks versions
of the code; profile_fold turns it into CPU milliseconds. Needs valgrind (Debian package
``valgrind``); about two minutes per run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from profile_fold import SIZES, TRANSCRIPTS, _sessions  # noqa: E402

_TOTALS = re.compile(r"^totals:\s+(\d+)", re.MULTILINE)
#: Folds of the short run: start-up, imports and the warm-up fold are the same in both runs.
BASE_FOLDS = 10


def _transcript(messages: int) -> str:
    return next(name for _, name, n in SIZES if n == messages)


def prepare(db: Path, messages: int, economics: str, sessions: int) -> None:
    """A store holding ``sessions`` sessions of the transcript, ready to fold."""
    from sessionfold.cli.files import load_conversation_file
    from sessionfold.store import SessionStore

    conv = load_conversation_file(TRANSCRIPTS / _transcript(messages))
    store = SessionStore.from_url(f"sqlite:///{db}")
    store.migrate()
    try:
        _sessions(store, conv.messages[:messages], conv.system, sessions, economics)
    finally:
        store.close()


def fold(db: Path, folds: int, economics: str) -> None:
    """The counted process: a warm-up fold, the collector settled as a worker child settles
    it, then ``folds`` folds."""
    from sessionfold.core.summarizers import ExtractiveSummarizer
    from sessionfold.runtime.collector import freeze_startup_objects
    from sessionfold.runtime.fold_procedure import FoldJob, run_fold
    from sessionfold.store import SessionStore
    from sessionfold.workers.runtime import FOLD_WORKER_ITEM_CACHE

    pricing = None
    if economics == "dollars":
        from sessionfold.runtime.prices import fold_pricing
        from sessionfold.runtime.settings import Settings

        pricing = fold_pricing(Settings(summarizer="offline", anthropic_api_key=None))
    store = SessionStore.from_url(f"sqlite:///{db}", item_cache=FOLD_WORKER_ITEM_CACHE)
    summarizer = ExtractiveSummarizer()
    ids = [f"pf-{i:05d}" for i in range(folds + 1)]
    run_fold(store, summarizer, FoldJob(session_id=ids[0], job_id="warm"), pricing=pricing)
    freeze_startup_objects()
    for i, sid in enumerate(ids[1:]):
        report = run_fold(store, summarizer, FoldJob(session_id=sid, job_id=f"job-{i}"),
                          pricing=pricing)
        if report.outcome != "folded":
            raise SystemExit(f"fold of {sid} came to {report.outcome!r}, not 'folded'")
    store.close()


def _counted(db: Path, folds: int, economics: str, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in every run
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         str(Path(__file__).resolve()), "--child", str(db), "--child-folds", str(folds),
         "--economics", economics],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _total(out: Path) -> int:
    found = _TOTALS.search(out.read_text(encoding="utf-8", errors="replace"))
    if found is None:
        raise SystemExit(f"no instruction total in {out}")
    return int(found.group(1))


def measure(messages: int, economics: str, folds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sf-fold-instructions-") as tmp:
        base = Path(tmp) / "base.db"
        prepare(base, messages, economics, folds + 1)
        runs = {}
        for n in (BASE_FOLDS, folds):
            db = Path(tmp) / f"run-{n}.db"
            shutil.copyfile(base, db)  # each run folds its own copy (no -wal beside it)
            runs[n] = (_counted(db, n, economics, Path(tmp) / f"callgrind-{n}.out"),
                       Path(tmp) / f"callgrind-{n}.out")
        totals = {}
        for n, (proc, out) in runs.items():
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"the counted run of {n} folds failed:\n"
                                 f"{err.decode(errors='replace')[-3000:]}")
            totals[n] = _total(out)
    per_fold = (totals[folds] - totals[BASE_FOLDS]) / (folds - BASE_FOLDS)
    return {"messages": messages, "economics": economics, "folds": folds,
            "instructions_per_fold": round(per_fold), "totals": totals}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, choices=[n for _, _, n in SIZES], default=291)
    parser.add_argument("--economics", choices=("window", "dollars"), default="window")
    parser.add_argument("--folds", type=int, default=30,
                        help=f"folds of the long run (more than {BASE_FOLDS})")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-folds", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        fold(args.child, args.child_folds, args.economics)
        return 0
    if args.folds <= BASE_FOLDS:
        parser.error(f"--folds must be more than {BASE_FOLDS}")
    if shutil.which("valgrind") is None:
        raise SystemExit("fold_instructions needs valgrind (Debian: apt-get install valgrind)")
    result = measure(args.messages, args.economics, args.folds)
    result.update(run=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  machine=f"{platform.machine()}, Python {platform.python_version()}")
    print(f"{args.messages} messages, economics={args.economics}: "
          f"{result['instructions_per_fold'] / 1e6:.2f} M instructions per fold "
          f"({args.folds} folds counted against {BASE_FOLDS})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
