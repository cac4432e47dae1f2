"""Benchmark: fold throughput per worker, and the lag from an over-budget report to its fold.

Two measurements on real processes (``sessionfold worker`` and ``sessionfold scheduler``
started by this script, on the Redis of ``SF_TEST_REDIS_URL`` / ``REDIS_URL`` under a fresh key
prefix, and a SQLite store in a temporary directory; ``--postgres ADMIN_URL`` makes a fresh
database on that PostgreSQL server for the run and drops it afterwards):

1. **Folds per second per worker** with an instant summarizer (the offline extractive one):
   ``--throughput-sessions`` sessions, each over its trigger, are enqueued at once to one worker
   process (``--throughput-concurrency``, default 1); timed from the first enqueue to the last
   commit (the store's record times). The worker's CPU (every process of its process group:
   the consumer and its pool children, user + system) over the same stretch gives the CPU of
   one fold as the worker spends it, Celery's own work included, and the folds per CPU-second
   of one core. ``--throughput-messages`` sets the window (40 messages of django__django-15554,
   or all 291 of django__django-16560: about 300 items), ``--throughput-economics dollars``
   prices every visit as a default policy's are, ``--throughput-pool solo`` runs the folds in
   the consumer process itself (no pool child: what the prefork hop costs is the difference).
   ``--throughput-only`` skips the lag run.
2. **Lag** from the first usage event that puts a session over its trigger to the committed
   fold, with a summarizer of ``--summarizer-latency`` seconds (the scripted provider over HTTP,
   through the real Anthropic SDK): ``--sessions`` active sessions each report usage once every
   ``--period`` seconds, and each crosses its trigger at a random report within ``--reports``
   reports. The worker runs ``--concurrency`` threads (the summarizer call waits on I/O), and
   the global summarizer cap is raised to match. Reported: p50, p90, p99 and max lag, and the
   Redis memory the pipeline holds per session.

Usage (from the repository root)::

    .venv/bin/python bench/bench_pipeline.py              # 1,000 sessions, 1 s summarizer
    .venv/bin/python bench/bench_pipeline.py --quick      # 40 sessions, 0.2 s: a smoke run
    .venv/bin/python bench/bench_pipeline.py --sessions 10000 --concurrency 64
    .venv/bin/python bench/bench_pipeline.py --postgres postgresql+psycopg://postgres@127.0.0.1/postgres

Results go to stdout and ``bench/out/pipeline.md`` (``--out``), and as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from sessionfold.cli.files import load_conversation_file
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings, env_name
from sessionfold.runtime.usage import UsageEvent, UsagePublisher
from sessionfold.store import SessionStore, create_store_engine
from sessionfold.workers.celery_app import make_celery, make_enqueue

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out" / "pipeline.md"
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
TRANSCRIPT = TRANSCRIPTS / "django__django-15554.json"
#: Messages of the transcript each session holds: enough for one summary to be worth it.
MESSAGES = 40
#: The throughput windows: messages → the transcript they are the start of.
THROUGHPUT_WINDOWS = {40: TRANSCRIPT, 291: TRANSCRIPTS / "django__django-16560.json"}
#: Folds of the shorter counted worker run (``--throughput-instructions``).
BASE_FOLDS = 5


@dataclass
class Rig:
    settings: Settings
    store: SessionStore
    workdir: Path


@contextlib.contextmanager
def process(argv: list[str], settings: Settings, log: Path, ready: str,
            wrapper: tuple[str, ...] = (), **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A ``sessionfold`` subcommand in its own process group, until the block ends
    (``wrapper``: a command it runs under, valgrind for one)."""
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith(("SESSIONFOLD_", "ANTHROPIC_")) and k not in (
                     "REDIS_URL", "DATABASE_URL")}
    for field, value in settings.model_dump().items():
        if value is not None:
            child_env[env_name(field)] = (value.get_secret_value()
                                          if isinstance(value, SecretStr) else str(value))
    child_env.update(env)
    with open(log, "ab") as out:
        proc = subprocess.Popen([*wrapper, sys.executable, "-m", "sessionfold.cli", *argv],
                                env=child_env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + (1800 if wrapper else 180)
        while ready not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _sessions(store: SessionStore, prefix: str, n: int, messages: list[Message], system: str,
              budget_over: float, economics: str = "window") -> tuple[list[str], FoldPolicy]:
    """``n`` sessions with the same messages; the budget puts them at ``budget_over`` × budget."""
    probe = f"{prefix}probe"
    store.create_session(probe, FoldPolicy(budget_tokens=1_000_000), system)
    store.append(probe, messages)
    estimate = store.get_session(probe).current_tokens
    store.delete_session(probe)
    # economics="window": the fold is due at the policy's trigger, the crossing the lag is
    # measured from (a priced policy opens at its target, where these sessions already are).
    # The throughput run may price its visits ("dollars") as a default policy's are.
    policy = FoldPolicy(budget_tokens=max(1000, int(estimate / budget_over)),
                        economics=economics)  # type: ignore[arg-type]
    ids = []
    for i in range(n):
        sid = f"{prefix}{i:05d}"
        store.create_session(sid, policy, system)
        store.append(sid, messages)
        ids.append(sid)
    return ids, policy


def _fold_times(store: SessionStore, ids: list[str]) -> dict[str, float]:
    out = {}
    for sid in ids:
        folded = [r for r in store.records(sid) if r.outcome == "folded"]
        if folded:
            out[sid] = folded[0].created_at.timestamp()
    return out


def _wait_folded(store: SessionStore, ids: list[str], timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        done = _fold_times(store, ids)
        if len(done) == len(ids) or time.monotonic() > deadline:
            return done
        time.sleep(0.5)


def proc_stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the process's name: state, ppid, pgrp, session,
    ..., utime (11), stime, cutime, cstime (clock ticks). OSError once the process is gone."""
    stat = Path("/proc", str(pid), "stat").read_text()
    return stat[stat.rindex(")") + 2:].split()


def _session_cpu_s(session: int) -> dict[int, float]:
    """CPU seconds of each live process of Linux session ``session`` (user + system), what its
    reaped children spent counted under the pid ``-pid``."""
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = proc_stat(entry)
        except OSError:  # gone since the listing
            continue
        if int(fields[3]) == session:
            pid = int(entry)
            ticks[pid] = int(fields[11]) + int(fields[12])
            ticks[-pid] = int(fields[13]) + int(fields[14])
    hz = os.sysconf("SC_CLK_TCK")
    return {pid: t / hz for pid, t in ticks.items()}


def _batch(app: Any, store: SessionStore, ids: list[str]) -> dict[str, float]:
    """Enqueue a fold of each session and wait for every job to end; their fold times."""
    enqueue = make_enqueue(app)
    jobs = [enqueue(sid, None, "manual", None) for sid in ids]
    for job in jobs:  # every job ends, whatever its outcome
        app.AsyncResult(job).get(timeout=1800, propagate=False)
    return _fold_times(store, ids)


def _counted_worker(rig: Rig, settings: Settings, ids: list[str], tag: str) -> tuple[int, int]:
    """Run a worker under callgrind until it has folded ``ids``, stop it; its instructions
    (consumer and pool child together, start-up to shutdown) and the folds it made."""
    outdir = rig.workdir / f"callgrind-{tag}"
    outdir.mkdir(exist_ok=True)
    wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={outdir}/cg.%p.out")
    with process(["worker", "--concurrency=1"], settings,
                 rig.workdir / f"instructions-worker-{tag}.log", "ready.", wrapper=wrapper,
                 PYTHONHASHSEED="0"):
        app = make_celery(settings)
        done = _batch(app, rig.store, ids)
        app.close()
    total = 0
    for path in outdir.glob("cg.*.out"):  # written when each process exits
        found = re.search(r"^totals:\s+(\d+)", path.read_text(errors="replace"), re.MULTILINE)
        if found is None:
            raise RuntimeError(f"{path} holds no instruction total")
        total += int(found.group(1))
    return total, len(done)


def throughput_instructions(rig: Rig, args: argparse.Namespace) -> dict[str, Any]:
    """Instructions one worker (consumer and pool child) executes per fold, counted by
    valgrind: a worker that folds ``--throughput-sessions`` sessions against one that folds
    ``BASE_FOLDS`` (same start-up and shutdown: the difference is the folds'). Slow (the worker
    runs ~50x slower under valgrind), and it does not move with the machine's load."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--throughput-instructions needs valgrind (Debian package valgrind)")
    conv = load_conversation_file(THROUGHPUT_WINDOWS[args.throughput_messages])
    messages = conv.messages[:args.throughput_messages]
    # Time limits for a worker running ~50x slower (the lock and the visibility timeout must
    # still cover them: the settings check that).
    settings = rig.settings.model_copy(update={
        "summarizer": "offline", "task_time_limit_s": 1200, "task_soft_time_limit_s": 1100,
        "lock_ttl_s": 2400, "visibility_timeout_s": 7200})
    base, long = BASE_FOLDS, max(args.throughput_sessions, BASE_FOLDS + 1)
    ids, _ = _sessions(rig.store, "ti-", base + long, messages, conv.system, 2.0,
                       args.throughput_economics)
    short_total, short_done = _counted_worker(rig, settings, ids[:base], "short")
    long_total, long_done = _counted_worker(rig, settings, ids[base:], "long")
    folds = long_done - short_done
    return {"sessions": long, "against": base, "folded": long_done + short_done,
            "messages": len(messages), "economics": args.throughput_economics,
            "instructions per fold": (long_total - short_total) / folds if folds > 0 else None}


def throughput(rig: Rig, args: argparse.Namespace) -> dict[str, Any]:
    """Folds per second of one worker process with the instant (offline) summarizer, and the
    worker's CPU per fold."""
    conv = load_conversation_file(THROUGHPUT_WINDOWS[args.throughput_messages])
    messages = conv.messages[:args.throughput_messages]
    settings = rig.settings.model_copy(update={"summarizer": "offline"})
    # Twice the budget: every session has a fold to make.
    ids, _ = _sessions(rig.store, "tp-", args.throughput_sessions, messages, conv.system, 2.0,
                       args.throughput_economics)
    with process(["worker", f"--pool={args.throughput_pool}",
                  f"--concurrency={args.throughput_concurrency}"], settings,
                 rig.workdir / "throughput-worker.log", "ready.") as worker:
        app = make_celery(settings)
        enqueue = make_enqueue(app)
        cpu_before = _session_cpu_s(worker.pid)
        start = time.time()
        jobs = [enqueue(sid, None, "manual", None) for sid in ids]
        for job in jobs:  # every job ends, whatever its outcome
            app.AsyncResult(job).get(timeout=600, propagate=False)
        cpu_after = _session_cpu_s(worker.pid)
        spent = {pid: cpu_after[pid] - cpu_before.get(pid, 0.0) for pid in cpu_after}
        cpu = sum(spent.values())
        # The consumer is the worker's first process (it leads the session); the rest is the
        # pool (its children, live or reaped). Solo: all of it is the consumer's.
        consumer = spent.get(worker.pid, 0.0)
        done = _fold_times(rig.store, ids)
        app.close()
    last = max(done.values()) if done else start
    seconds = max(last - start, 1e-9)
    folded = len(done)
    return {"sessions": len(ids), "folded": folded, "seconds": seconds,
            "folds/s": folded / seconds, "messages": len(messages),
            "economics": args.throughput_economics, "worker cpu s": cpu,
            "cpu ms/fold": 1000 * cpu / folded if folded else None,
            "consumer cpu ms/fold": 1000 * consumer / folded if folded else None,
            "pool cpu ms/fold": 1000 * (cpu - consumer) / folded if folded else None,
            "folds per cpu-s": folded / cpu if cpu > 0 else None,
            "concurrency": args.throughput_concurrency, "pool": args.throughput_pool}


def lag(rig: Rig, args: argparse.Namespace, messages: list[Message],
        system: str) -> dict[str, Any]:
    """Lag from the first over-trigger usage event to the committed fold."""
    provider = FakeProvider(latency_s=args.summarizer_latency)
    ids, policy = _sessions(rig.store, "lag-", args.sessions, messages, system, 0.75)
    infos = {sid: rig.store.get_session(sid) for sid in ids}
    rng = random.Random(7)
    crossing = {sid: rng.randint(1, args.reports) for sid in ids}
    phase = {sid: rng.uniform(0, args.period) for sid in ids}
    first_over: dict[str, float] = {}
    with provider.serve() as server:
        settings = rig.settings.model_copy(update={
            "summarizer": "anthropic", "anthropic_api_key": SecretStr("sk-bench"),
            "anthropic_base_url": server.base_url,
            "summarizer_max_concurrency": args.concurrency * args.workers})
        with contextlib.ExitStack() as running:
            running.enter_context(process(["scheduler"], settings, rig.workdir / "scheduler.log",
                                          "sessionfold scheduler: reading"))
            for n in range(args.workers):
                running.enter_context(process(
                    ["worker", "--pool=threads", f"--concurrency={args.concurrency}",
                     f"--hostname=bench-{n}@%h"], settings,
                    rig.workdir / f"lag-worker-{n}.log", "ready."))
            publisher = UsagePublisher.from_settings(settings, str(settings.redis_url))
            start = time.time()
            schedule = sorted((start + phase[sid] + k * args.period, k, sid)
                              for sid in ids for k in range(args.reports + 1))
            for due, k, sid in schedule:
                wait = due - time.time()
                if wait > 0:
                    time.sleep(wait)
                info = infos[sid]
                over = k >= crossing[sid]
                tokens = policy.trigger_tokens + 200 if over else policy.trigger_tokens - 200
                now = time.time()
                publisher.publish(UsageEvent(
                    session_id=sid, seq=info.ledger_len - 1, revision=info.revision,
                    input_tokens=tokens, output_tokens=200, model="bench", time=now))
                if over:
                    first_over.setdefault(sid, now)
            publisher.close()
            done = _wait_folded(rig.store, ids, timeout_s=120 + args.sessions / 5)
    lags = sorted(done[sid] - first_over[sid] for sid in done if sid in first_over)
    memory = _redis_memory(settings, ids)
    q = statistics.quantiles(lags, n=100, method="inclusive") if len(lags) >= 2 else lags * 99
    return {"sessions": len(ids), "folded": len(done), "period s": args.period,
            "reports": args.reports, "summarizer s": args.summarizer_latency,
            "concurrency": args.concurrency, "workers": args.workers, "pool": "threads",
            "lag p50": statistics.median(lags) if lags else None,
            "lag p90": q[89] if lags else None, "lag p99": q[98] if lags else None,
            "lag max": lags[-1] if lags else None,
            "summarizer calls": provider.stats.calls, "lags s": lags, **memory}


def lag_chart(lag: dict[str, Any], path: Path) -> None:
    """The distribution of report-to-fold lags: a histogram and its CDF, p50/p99 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lags: list[float] = lag["lags s"]
    fig, (hist, cdf) = plt.subplots(1, 2, figsize=(11, 4))
    hist.hist(lags, bins=40, color="#3b7dd8")
    hist.set_xlabel("over-budget report → committed fold (s)")
    hist.set_ylabel("sessions")
    ys = [(i + 1) / len(lags) for i in range(len(lags))]
    cdf.plot(lags, ys, color="#3b7dd8")
    cdf.set_xlabel("lag (s)")
    cdf.set_ylabel("fraction of sessions")
    for name, colour in (("lag p50", "#2a9d3f"), ("lag p99", "#d1495b")):
        if lag.get(name) is not None:
            for ax in (hist, cdf):
                ax.axvline(lag[name], color=colour, linestyle="--",
                           label=f"{name.split()[1]} {lag[name]:.2f} s")
    cdf.legend(loc="lower right")
    fig.suptitle(f"{lag['sessions']:,} sessions reporting every {lag['period s']} s, "
                 f"summarizer {lag['summarizer s']} s, {lag['workers']} worker(s) × "
                 f"{lag['concurrency']} threads")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _redis_memory(settings: Settings, ids: list[str]) -> dict[str, Any]:
    """Bytes the pipeline keeps in Redis per session (its measured size) and per usage event."""
    keys = Keys.from_settings(settings)
    client = redis_client(str(settings.redis_url))
    try:
        per_session = [client.memory_usage(keys.measured(sid)) or 0 for sid in ids]
        # One stream per partition: the bytes and entries of all of them.
        streams = keys.usage_streams()
        stream = sum(client.memory_usage(name, samples=0) or 0 for name in streams)
        length = sum(client.xlen(name) or 0 for name in streams) or 1
    finally:
        client.close()
    return {"redis bytes/session": statistics.mean(per_session) if per_session else 0,
            "stream bytes/event": stream / length}


def run(args: argparse.Namespace) -> dict[str, Any]:
    redis_url = args.redis_url or os.environ.get("SF_TEST_REDIS_URL") or os.environ.get(
        "REDIS_URL") or "redis://127.0.0.1:6379/15"
    prefix = f"bench-pipeline:{uuid.uuid4().hex[:8]}:"
    tmp = tempfile.TemporaryDirectory(prefix="sf-bench-pipeline-")
    workdir = Path(tmp.name)
    if args.workdir is not None:  # keep the processes' logs and the store for a look
        workdir = args.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    database = _Database(args.postgres) if args.postgres else None
    db_url = database.url if database else f"sqlite:///{workdir / 'store.db'}"
    # The time limits and the lock only need to cover the slowest fold here.
    settings = Settings(redis_url=redis_url, database_url=db_url, key_prefix=prefix,
                        data_dir=workdir / "data", metrics_port=0, summarizer="offline",
                        anthropic_api_key=None, scheduler_block_ms=50,
                        scheduler_sweep_interval_s=5, task_time_limit_s=120,
                        task_soft_time_limit_s=100, lock_ttl_s=300)
    conv = load_conversation_file(TRANSCRIPT)
    messages = conv.messages[:MESSAGES]
    store = SessionStore.from_url(db_url)
    store.migrate()
    rig = Rig(settings, store, workdir)
    try:
        result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                             f"{platform.python_version()}",
                  "run": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "store": "postgresql (fresh database)" if database else "sqlite (tmp)",
                  "throughput": throughput(rig, args)}
        if args.throughput_instructions:
            result["throughput instructions"] = throughput_instructions(rig, args)
        if not args.throughput_only:
            result["lag"] = lag(rig, args, messages, conv.system)
    finally:
        store.close()
        if database:
            database.drop()
        client = redis_client(redis_url)
        for key in client.scan_iter(match=Keys(prefix).all_pattern(), count=1000):
            client.delete(key)
        client.close()
        tmp.cleanup()
    return result


class _Database:
    """A database of the run's own on a PostgreSQL server, dropped at the end."""

    def __init__(self, admin_url: str) -> None:
        self.admin = create_store_engine(admin_url, pool_size=1).execution_options(
            isolation_level="AUTOCOMMIT")
        self.name = f"sf_bench_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self.name}"')
        self.url = self.admin.url.set(database=self.name).render_as_string(hide_password=False)

    def drop(self) -> None:
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self.admin.dispose()


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def report(result: dict[str, Any]) -> str:
    tp = result["throughput"]
    cpu = ("" if tp.get("cpu ms/fold") is None else
           f"{tp['cpu ms/fold']:.1f} | {tp['consumer cpu ms/fold']:.1f} | "
           f"{tp['pool cpu ms/fold']:.1f} | {tp['folds per cpu-s']:.1f} |")
    lines = [
        "## Pipeline: folds per worker, and report-to-fold lag (issue 4)",
        "",
        f"Machine: {result['machine']}; store: {result['store']}. Command: "
        "`.venv/bin/python bench/bench_pipeline.py` (see its docstring).",
        "",
        "Folds per second of one worker process, instant (offline extractive) summarizer, "
        f"{tp['pool']} pool, concurrency {tp['concurrency']}, {tp['messages']}-message windows"
        f"{', every visit priced' if tp['economics'] == 'dollars' else ''}; the worker's CPU "
        "(consumer and pool, user + system) over the same stretch:",
        "",
        "| sessions enqueued | folded | seconds | folds/s | worker CPU ms/fold | of which "
        "the consumer | the pool | folds per CPU-second |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {tp['sessions']:,} | {tp['folded']:,} | {tp['seconds']:.2f} | "
        f"**{tp['folds/s']:.1f}** | {cpu or '– | – | – | – |'}",
        "",
    ]
    if "lag" in result:
        lines += _lag_report(result["lag"])
    return "\n".join(lines)


def _lag_report(lg: dict[str, Any]) -> list[str]:
    return [
        f"Lag from the first over-trigger usage event to the committed fold: "
        f"{lg['sessions']:,} active sessions each reporting every {lg['period s']:g} s, "
        f"summarizer latency {lg['summarizer s']:g} s (scripted provider over HTTP), "
        f"{lg['workers']} worker process(es) with {lg['concurrency']} {lg['pool']} each:",
        "",
        "| sessions | folded | p50 | p90 | p99 | max | summarizer calls |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {lg['sessions']:,} | {lg['folded']:,} | **{_s(lg['lag p50'])}** | "
        f"{_s(lg['lag p90'])} | {_s(lg['lag p99'])} | {_s(lg['lag max'])} | "
        f"{lg['summarizer calls']:,} |",
        "",
        "The lag includes the scheduler's read of the usage stream, the enqueue, the job's wait "
        "in the queue, the claim, every summarizer call of the fold (a fold may chain more than "
        "one) and the commit.",
        "",
        f"Redis memory: {lg['redis bytes/session']:.0f} bytes per session (its measured size), "
        f"{lg['stream bytes/event']:.0f} bytes per usage event kept on the stream.",
        "",
    ]


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # Python's default SIGTERM ends the process without unwinding: the workers and scheduler
    # (own process groups) would outlive a `timeout`-ed run. Unwind so `process()` stops them.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--period", type=float, default=2.0,
                        help="seconds between two usage reports of a session")
    parser.add_argument("--reports", type=int, default=30,
                        help="reports per session (each crosses its trigger at a random one)")
    parser.add_argument("--summarizer-latency", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=32,
                        help="threads per worker process in the lag run")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes in the lag run (threads share one core each)")
    parser.add_argument("--throughput-sessions", type=int, default=200)
    parser.add_argument("--throughput-concurrency", type=int, default=1)
    parser.add_argument("--throughput-pool", choices=("prefork", "solo", "threads"),
                        default="prefork",
                        help="the throughput worker's Celery pool (solo: the folds run in the "
                             "consumer process itself, no pool child)")
    parser.add_argument("--throughput-messages", type=int, choices=sorted(THROUGHPUT_WINDOWS),
                        default=MESSAGES,
                        help="messages of each throughput session (291: a ~300-item window)")
    parser.add_argument("--throughput-economics", choices=("window", "dollars"),
                        default="window",
                        help="dollars: every throughput visit priced (a default policy's)")
    parser.add_argument("--throughput-instructions", action="store_true",
                        help="also count the worker's instructions per fold under valgrind "
                             "(slow; needs valgrind)")
    parser.add_argument("--throughput-only", action="store_true",
                        help="measure the folds per worker only, not the lag")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--postgres", default=None, metavar="ADMIN_URL",
                        help="run on a fresh database made (and dropped) on this server")
    parser.add_argument("--quick", action="store_true",
                        help="40 sessions, 0.2 s summarizer, 20 throughput folds: a smoke run")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep logs and the SQLite store here (default: a temporary dir)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument("--chart", type=Path, default=None,
                        help="also draw the lag distribution (histogram + CDF) as a PNG here")
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.period, args.reports = 40, 0.5, 6
        args.summarizer_latency, args.concurrency = 0.2, 8
        args.throughput_sessions = 20
    result = run(args)
    text = report(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    if args.chart and "lag" in result:
        lag_chart(result["lag"], args.chart)
    complete = all(part["folded"] == part["sessions"]
                   for part in (result["throughput"], result.get("lag")) if part is not None)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
