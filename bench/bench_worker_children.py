"""What each pool child of a fold worker costs: CPU at its start, and memory of its own.

A Celery prefork worker forks its children from the main process. Whatever a child does to the
heap it inherited (a garbage collection walks every object, writing to each) turns shared pages
into private copies, and whatever the parent did not build (the tokenizer) each child builds
again at its first fold, and again whenever a child is replaced. This starts ``sessionfold
worker`` at ``--concurrency`` children on the offline (instant) summarizer, then reads each child
from ``/proc`` (Linux only):

- at start (once the worker is ready and idle for ``--settle`` seconds): CPU the child spent
  since its fork (user + system), its private dirty memory and its PSS (proportional set size:
  shared pages split between the processes sharing them);
- after ``--folds`` folds of 291-message windows spread over the children: the same again.

Both numbers are the child's own: the parent's are not counted. Run the trees to compare one
after the other in one sitting::

    .venv/bin/python bench/bench_worker_children.py                      # 2 children, 200 folds
    .venv/bin/python bench/bench_worker_children.py --concurrency 4 --folds 0
    .venv/bin/python bench/bench_worker_children.py --json bench/out/worker-children.json

Nothing here is asserted: ``tests/bench/test_bench_worker_children_quick.py`` runs ``--quick``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_pipeline import THROUGHPUT_WINDOWS, _exit_on_sigterm, _sessions, proc_stat, process
from sessionfold.cli.files import load_conversation_file
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore
from sessionfold.workers.celery_app import make_celery, make_enqueue

MESSAGES = 291


def child_pids(pid: int) -> list[int]:
    """The live children of process ``pid`` (its pool's children, for a worker)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(p) for p in (task / "children").read_text().split()]
    return sorted(children)


def child_state(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) and private dirty and PSS memory in MB of process ``pid``."""
    fields = proc_stat(pid)
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    memory: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        memory[name] = int(value.split()[0]) / 1024  # kB -> MB
    return {"cpu_s": cpu, "private_dirty_mb": memory["Private_Dirty"], "pss_mb": memory["Pss"]}


def _median(states: list[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in states)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not Path("/proc/self/smaps_rollup").exists():
        raise SystemExit("bench_worker_children reads /proc/PID/smaps_rollup: Linux only")
    redis_url = args.redis_url or os.environ.get("SF_TEST_REDIS_URL") or os.environ.get(
        "REDIS_URL") or "redis://127.0.0.1:6379/15"
    prefix = f"bench-children:{uuid.uuid4().hex[:8]}:"
    with tempfile.TemporaryDirectory(prefix="sf-bench-children-") as tmp:
        workdir = Path(tmp)
        db_url = f"sqlite:///{workdir / 'store.db'}"
        settings = Settings(redis_url=redis_url, database_url=db_url, key_prefix=prefix,
                            data_dir=workdir / "data", metrics_port=0, summarizer="offline",
                            anthropic_api_key=None, task_time_limit_s=120,
                            task_soft_time_limit_s=100, lock_ttl_s=300)
        store = SessionStore.from_url(db_url)
        store.migrate()
        try:
            with process(["worker", f"--concurrency={args.concurrency}"], settings,
                         workdir / "worker.log", "ready.") as worker:
                time.sleep(args.settle)
                kids = child_pids(worker.pid)
                start = [child_state(pid) for pid in kids]
                after: list[dict[str, float]] = []
                if args.folds:
                    conv = load_conversation_file(THROUGHPUT_WINDOWS[MESSAGES])
                    ids, _ = _sessions(store, "wc-", args.folds, conv.messages[:MESSAGES],
                                       conv.system, 2.0)
                    app = make_celery(settings)
                    enqueue = make_enqueue(app)
                    jobs = [enqueue(sid, None, "manual", None) for sid in ids]
                    for job in jobs:  # every job ends, whatever its outcome
                        app.AsyncResult(job).get(timeout=600, propagate=False)
                    app.close()
                    after = [child_state(pid) for pid in kids]
        finally:
            store.close()
            client = redis_client(redis_url)
            for key in client.scan_iter(match=Keys(prefix).all_pattern(), count=1000):
                client.delete(key)
            client.close()
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                   f"{platform.python_version()}",
        "run": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "children": len(kids), "folds": args.folds, "start": start, "after": after,
        "start_cpu_s": _median(start, "cpu_s"),
        "start_private_dirty_mb": _median(start, "private_dirty_mb"),
        "start_pss_mb": _median(start, "pss_mb"),
    }
    if after:
        result.update({
            "after_private_dirty_mb": _median(after, "private_dirty_mb"),
            "after_pss_mb": _median(after, "pss_mb"),
            "fold_cpu_ms": 1000 * (sum(a["cpu_s"] for a in after)
                                   - sum(s["cpu_s"] for s in start)) / args.folds,
        })
    return result


def report(result: dict[str, Any]) -> str:
    folds = result["folds"]
    lines = [
        "## A fold worker's pool children: CPU at start, memory of their own",
        "",
        f"Machine: {result['machine']}; run {result['run']}. Command: `.venv/bin/python "
        "bench/bench_worker_children.py` (see its docstring). Medians over the "
        f"{result['children']} children.",
        "",
        "| children | CPU s at start | private dirty MB at start | PSS MB at start | "
        f"private dirty MB after {folds} folds | PSS MB after | children's CPU ms a fold |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {result['children']} | {result['start_cpu_s']:.2f} | "
        f"{result['start_private_dirty_mb']:.1f} | {result['start_pss_mb']:.1f} | "
        + (f"{result['after_private_dirty_mb']:.1f} | {result['after_pss_mb']:.1f} | "
           f"{result['fold_cpu_ms']:.1f} |" if folds else "– | – | – |"),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # the worker is stopped on the way out
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--folds", type=int, default=200,
                        help="folds of 291-message windows after the start (0: none)")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds the worker idles after it is ready, before reading")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--quick", action="store_true", help="2 children, 6 folds")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.folds, args.settle = 2, 6, 1.0
    if args.concurrency < 1 or args.folds < 0 or args.settle < 0:
        parser.error("--concurrency must be >= 1, --folds and --settle >= 0")
    result = run(args)
    text = report(result)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
