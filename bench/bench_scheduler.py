"""Benchmark: usage events ingested per second by schedulers (goal: >= 50,000/s a process).

Setup (not timed): ``--sessions`` sessions in a fresh store (SQLite in a temporary directory
unless ``--database-url`` names another), each with enough turns and a budget large enough that
no fold is due, and ``--events`` usage events for them already on the stream (pipelined XADD:
publishing speed is not what is measured), round-robin over the sessions, each naming a new
seq (so every event is a new measurement, as one per model call is).

Timed: one :class:`~sessionfold.workers.scheduler.Scheduler` calling ``run_once`` until the
stream is drained: XREADGROUP in batches, per-session compare-and-set in Redis (Lua, pipelined),
``apply_usage_batch`` in the store (``record_usage_batch`` on older trees), the trigger check,
XACK. Reported: events/s overall, and the time split between the Redis read, the Redis
compare-and-set, the store write and the rest.

The number depends on how many events share a session within a batch (the store writes at
most one row per session per batch) and on how many reports the store is spared
(``--refresh-s``: a session under its trigger is written at most once per that interval).
``COUNT`` is per partition stream, so with 16 partitions a read takes up to 16 × the batch
size: ``--sessions 1000`` then gives about 13 events per session per read, a backlog being
drained. A fleet in steady state is the other case: each session reports every few seconds,
so a read holds about one event per session (``--sessions 20000 --events 100000``), and what
the store is spared decides the rate (``--refresh-s 0``: every report written).

Usage (from the repository root; Redis from ``SF_TEST_REDIS_URL`` or ``REDIS_URL``, default
``redis://127.0.0.1:6379/15``; only keys under a fresh prefix are touched and removed)::

    .venv/bin/python bench/bench_scheduler.py            # 200,000 events, 1,000 sessions
    .venv/bin/python bench/bench_scheduler.py --quick    # 20,000 events, a few seconds
    .venv/bin/python bench/bench_scheduler.py --sessions 100 --events 100000
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.collector import freeze_startup_objects
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent
from sessionfold.store.store import SessionStore
from sessionfold.workers.scheduler import Scheduler

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out" / "scheduler.md"


def _timed(totals: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - start
    return wrapper


def _prefill(client: Any, keys: Keys, sessions: list[tuple[str, int, int]], events: int,
             *, first_round: int = 0) -> None:
    pipe = client.pipeline(transaction=False)
    now = time.time()
    for i in range(events):
        sid, last_seq, revision = sessions[i % len(sessions)]
        round_ = first_round + i // len(sessions)
        ev = UsageEvent(session_id=sid, seq=min(round_, last_seq), revision=revision,
                        input_tokens=1000 + round_, output_tokens=50, model="bench",
                        time=now)
        pipe.xadd(keys.usage_stream_of(sid), ev.to_fields(),  # type: ignore[arg-type]
                  maxlen=max(events * 2, 1000), approximate=True)
        if len(pipe) >= 5000:
            pipe.execute()
    pipe.execute()


def _setup(args: argparse.Namespace, workdir: Path) -> tuple[str, list[tuple[str, int, int]]]:
    """A migrated store with the sessions (SQLite in ``workdir`` unless a URL was given)."""
    db_url = args.database_url or f"sqlite:///{workdir / 'store.db'}"
    store = SessionStore.from_url(db_url)
    store.migrate()
    sessions: list[tuple[str, int, int]] = []
    # Enough messages that every event of a session names a new seq, as real calls do.
    per_session = -(-args.events // args.sessions) + 1  # (+1: a warm-up round)
    turns = [{"role": "user", "content": "check the queue depth"},
             {"role": "assistant", "content": "the queue depth is 12, nothing to do"}
             ] * max(4, per_session // 2 + 1)
    for i in range(args.sessions):
        sid = f"bench-{i:05d}"
        store.create_session(sid, FoldPolicy(budget_tokens=1_000_000), system="bench agent")
        appended = store.append(sid, turns)
        sessions.append((sid, appended.last_seq, appended.revision))
    store.close()
    return db_url, sessions


def _settings(args: argparse.Namespace, redis_url: str, db_url: str, prefix: str,
              workdir: Path) -> Settings:
    return Settings(redis_url=redis_url, database_url=db_url, key_prefix=prefix,
                    data_dir=workdir, scheduler_batch_size=args.batch_size,
                    scheduler_block_ms=50, scheduler_sweep_interval_s=3600,
                    scheduler_policy_cache_s=args.policy_cache_s,
                    scheduler_store_refresh_s=args.refresh_s,
                    usage_stream_maxlen=max(args.events, 1000),
                    scheduler_store_flush_ms=args.flush_ms, partitions=args.partitions,
                    scheduler_lease_ms=600_000)


def _scheduler(settings: Settings, store: SessionStore, client: Any, name: str,
               enqueued: list[str], args: argparse.Namespace,
               sessions: list[tuple[str, int, int]]) -> Scheduler:
    if args.no_store:
        store.record_usage_batch = lambda reports: len(reports)  # type: ignore[method-assign]
        if hasattr(store, "apply_usage_batch"):  # (absent before the write handed back gates)
            from sessionfold.store.results import UsageBatch
            known = store.session_gates([sid for sid, _, _ in sessions])
            store.apply_usage_batch = lambda reports: UsageBatch(  # type: ignore[method-assign]
                len(reports), {r.session_id: known[r.session_id] for r in reports})
    scheduler = Scheduler(settings, store, client,
                          lambda sid, epoch, trigger, token: enqueued.append(sid) or "job",
                          consumer_name=name, metrics_=Metrics(CollectorRegistry()))
    if args.warm_cache:  # the policy cache as a long-running scheduler has it
        now = time.monotonic()
        for sid, gate in store.session_gates([sid for sid, _, _ in sessions]).items():
            scheduler._gates[sid] = (now, gate)
    return scheduler


def _due_fraction(args: argparse.Namespace) -> float:
    """The share of sessions whose store refresh falls due during the timed run, so that one
    report in ``refresh_s / call_interval_s`` is written, as in a fleet at that call rate."""
    if not args.call_interval_s:
        return 0.0
    return min(1.0, args.events * args.call_interval_s / (args.refresh_s * args.sessions))


def _settle(scheduler: Scheduler, args: argparse.Namespace) -> int:
    """Steady state (``--call-interval-s``): after the warm-up round each session this scheduler
    owns was written once and its gate read; move the writes of a share of them (evenly spread,
    :func:`_due_fraction`) back past the refresh interval, as time would have. Returns how many
    were made due."""
    fraction = _due_fraction(args)
    if not fraction:
        return 0
    written = sorted(scheduler._written_at)
    due = round(len(written) * fraction)
    step = len(written) / due if due else 0
    for k in range(due):
        sid = written[int(k * step)]
        held = scheduler._written_at[sid]  # (incarnation, when written, …)
        scheduler._written_at[sid] = (held[0], held[1] - args.refresh_s, *held[2:])
    return due


def _drain(scheduler: Scheduler, events: int, counter: Any = None) -> None:
    """Run batches until ``events`` were read (by the processes together, with ``counter``),
    then write out what waits."""
    seen = 0
    while (counter.value if counter is not None else seen) < events:
        got = scheduler.run_once().events
        seen += got
        if counter is not None and got:
            with counter.get_lock():
                counter.value += got
    scheduler.flush()


def _redis_cpu_s(client: Any) -> float | None:
    """CPU seconds (user + system) the Redis server has used, when it runs on this machine."""
    try:
        pid = int(client.info("server")["process_id"])
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, KeyError, ValueError):
        return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One scheduler in this process, timed step by step (the figure B3 has always reported)."""
    redis_url = _redis_url(args)
    prefix = f"bench-scheduler:{uuid.uuid4().hex[:8]}:"
    tmp = tempfile.TemporaryDirectory(prefix="sf-bench-sched-")
    db_url, sessions = _setup(args, Path(tmp.name))
    settings = _settings(args, redis_url, db_url, prefix, Path(tmp.name))
    keys = Keys.from_settings(settings)
    client = redis_client(redis_url)
    store = SessionStore.from_url(db_url)
    enqueued: list[str] = []
    scheduler = _scheduler(settings, store, client, "bench", enqueued, args, sessions)
    scheduler.sweep()  # the periodic sweep is not part of ingestion: run it before timing
    made_due = 0
    if args.call_interval_s:  # a warm-up round, one report a session, not timed
        _prefill(client, keys, sessions, len(sessions))
        _drain(scheduler, len(sessions))
        made_due = _settle(scheduler, args)
    _prefill(client, keys, sessions, args.events, first_round=1)
    freeze_startup_objects()  # as `sessionfold scheduler` does before its loop
    totals: dict[str, float] = {}
    consumer = scheduler.consumer
    consumer._read_new = _timed(totals, "redis read", consumer._read_new)  # type: ignore[method-assign]
    scheduler._compare_and_set = _timed(  # type: ignore[method-assign]
        totals, "redis compare-and-set", scheduler._compare_and_set)
    write = "apply_usage_batch" if hasattr(store, "apply_usage_batch") else "record_usage_batch"
    setattr(store, write, _timed(totals, "store write (usage batch)", getattr(store, write)))
    store.get_session = _timed(  # type: ignore[method-assign]
        totals, "store read (policy cache misses)", store.get_session)
    store.session_gates = _timed(  # type: ignore[method-assign]
        totals, "store read (policy cache misses)", store.session_gates)
    consumer.ack = _timed(totals, "redis ack", consumer.ack)  # type: ignore[method-assign]
    if hasattr(scheduler, "_note_calls"):  # (absent before deferred reports skipped step 2)
        scheduler._note_calls = _timed(  # type: ignore[method-assign]
            totals, "redis last calls (deferred reports)", scheduler._note_calls)

    ingested = batches = accepted = deferred = 0
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    if profiler is not None:
        profiler.enable()
    redis_cpu = _redis_cpu_s(client)
    cpu = time.process_time()
    start = time.perf_counter()
    while ingested < args.events:
        stats = scheduler.run_once()
        if stats.events == 0:
            break
        ingested += stats.events
        accepted += stats.written
        deferred += stats.deferred
        batches += 1
    accepted += scheduler.flush()  # what still waits to be written is part of the work
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    redis_after = _redis_cpu_s(client)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(str(args.profile))
    left = _unacked(client, keys, settings)
    _cleanup(client, keys)
    store.close()
    tmp.cleanup()
    other = elapsed - sum(totals.values())
    return {
        "events": ingested, "sessions": args.sessions, "batch size": args.batch_size,
        "flush ms": args.flush_ms, "partitions": args.partitions,
        "refresh s": args.refresh_s, "policy cache s": args.policy_cache_s,
        "call interval s": args.call_interval_s, "made due": made_due,
        "deferred": deferred,
        "batches": batches, "store rows written": accepted, "unacked left": left,
        "jobs enqueued": len(enqueued), "seconds": elapsed,
        "events/s": ingested / elapsed if elapsed else 0.0,
        "scheduler cpu s": cpu,
        "events per scheduler cpu s": ingested / cpu if cpu else 0.0,
        "redis cpu s": (None if redis_cpu is None or redis_after is None
                        else redis_after - redis_cpu),
        "split": {**totals, "python (decode, decide, bookkeeping)": other},
        "store": ("no-op (--no-store)" if args.no_store else
                  "sqlite (tmp)" if args.database_url is None else "given URL"),
        "parser": _parser_name(client),
    }


def _redis_url(args: argparse.Namespace) -> str:
    return str(args.redis_url or os.environ.get("SF_TEST_REDIS_URL") or os.environ.get(
        "REDIS_URL") or "redis://127.0.0.1:6379/15")


def _unacked(client: Any, keys: Keys, settings: Settings) -> int:
    return sum(int(client.xpending(stream, settings.scheduler_group)["pending"])
               for stream in keys.usage_streams() if client.exists(stream))


def _cleanup(client: Any, keys: Keys) -> None:
    for key in client.scan_iter(match=keys.all_pattern(), count=1000):
        client.delete(key)
    client.close()


def _child(args: argparse.Namespace, settings: Settings, index: int, processes: int,
           sessions: list[tuple[str, int, int]], barrier: Any, counter: Any, warm: Any,
           results: Any) -> None:
    """One scheduler process: join, take its share of the partitions, ingest until the
    processes together have read every event, write out what waits."""
    client = redis_client(str(settings.redis_url))
    store = SessionStore.from_url(str(settings.database_url))
    enqueued: list[str] = []
    scheduler = _scheduler(settings, store, client, f"bench-{index}", enqueued, args, sessions)
    for _ in range(3):  # everyone joins, surplus is handed over, then taken: a settled split
        barrier.wait()
        scheduler.rebalance()
    if args.call_interval_s:  # the warm-up round (see run()); the parent then adds the events
        _drain(scheduler, len(sessions), warm)
        _settle(scheduler, args)
        barrier.wait()
        barrier.wait()
    freeze_startup_objects()
    barrier.wait()
    cpu, start, events = time.process_time(), time.perf_counter(), 0
    while counter.value < args.events:
        stats = scheduler.run_once()
        if stats.events:
            with counter.get_lock():
                counter.value += stats.events
            events += stats.events
    scheduler.flush()
    results.put({"index": index, "events": events, "cpu s": time.process_time() - cpu,
                 "start": start, "end": time.perf_counter(),
                 "partitions": len(scheduler.leases.owned)})
    store.close()
    client.close()


def run_processes(args: argparse.Namespace, processes: int, workdir: Path, db_url: str,
                  sessions: list[tuple[str, int, int]]) -> dict[str, Any]:
    """``processes`` scheduler processes sharing the partitions; wall time and CPU of each."""
    redis_url = _redis_url(args)
    prefix = f"bench-scheduler:{uuid.uuid4().hex[:8]}:"
    settings = _settings(args, redis_url, db_url, prefix, workdir)
    keys = Keys.from_settings(settings)
    client = redis_client(redis_url)
    warming = bool(args.call_interval_s)
    _prefill(client, keys, sessions, len(sessions) if warming else args.events)
    ctx = multiprocessing.get_context("fork")
    # With a warm-up the parent takes part in two barriers: it adds the timed events between.
    barrier = ctx.Barrier(processes + 1) if warming else ctx.Barrier(processes)
    counter, warm, results = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Queue()
    children = [ctx.Process(target=_child, args=(args, settings, i, processes, sessions,
                                                 barrier, counter, warm, results))
                for i in range(processes)]
    for child in children:
        child.start()
    if warming:
        for _ in range(3):
            barrier.wait()  # (the children's joining rounds)
        barrier.wait()  # the warm-up drained and settled
        _prefill(client, keys, sessions, args.events, first_round=1)
        barrier.wait()
        barrier.wait()  # (timing starts)
    redis_cpu = _redis_cpu_s(client)
    reports = [results.get(timeout=1800) for _ in children]
    for child in children:
        child.join()
    redis_after = _redis_cpu_s(client)
    left = _unacked(client, keys, settings)
    _cleanup(client, keys)
    elapsed = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    cpu = sum(r["cpu s"] for r in reports)
    events = sum(r["events"] for r in reports)
    return {
        "processes": processes, "events": events, "seconds": elapsed,
        "events/s": events / elapsed if elapsed else 0.0,
        "scheduler cpu s": cpu, "events per scheduler cpu s": events / cpu if cpu else 0.0,
        "redis cpu s": (None if redis_cpu is None or redis_after is None
                        else redis_after - redis_cpu),
        "unacked left": left,
        "per process": sorted(reports, key=lambda r: r["index"]),
    }


def _parser_name(client: Any) -> str:
    try:
        import hiredis  # noqa: F401
        return "hiredis"
    except ImportError:
        return "redis-py's pure-Python parser"


def report(result: dict[str, Any]) -> str:
    lines = [
        "## Scheduler ingestion",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; store: {result['store']}; reply parser: "
        f"{result['parser']}; {result['partitions']} partitions; store refresh "
        f"{result['refresh s']:g} s, policy cache {result['policy cache s']:g} s"
        + ("." if not result["call interval s"] else
           f"; steady state at one call per {result['call interval s']:g} s a session "
           f"(after a warm-up round, {result['made due']:,} sessions' refresh made due)."),
        "",
        "| events | sessions | batch | flush ms | batches | store rows | deferred | seconds "
        "| events/s | events per scheduler CPU-s | Redis CPU-s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {result['events']:,} | {result['sessions']:,} | {result['batch size']:,} | "
        f"{result['flush ms']} | "
        f"{result['batches']:,} | {result['store rows written']:,} | {result['deferred']:,} | "
        f"{result['seconds']:.2f} | "
        f"**{result['events/s']:,.0f}** | {result['events per scheduler cpu s']:,.0f} | "
        f"{_num(result['redis cpu s'])} |",
        "",
        "Where the time went:",
        "",
        "| step | seconds | share |",
        "|---|---:|---:|",
    ]
    for name, secs in sorted(result["split"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {secs:.2f} | {secs / result['seconds']:.0%} |")
    lines += ["", f"Unacknowledged entries left: {result['unacked left']}; jobs enqueued: "
              f"{result['jobs enqueued']} (none expected: budgets are large)."]
    return "\n".join(lines) + "\n"


def report_processes(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "## Scheduler processes sharing the partitions",
        "",
        f"{args.events:,} events over {args.sessions:,} sessions, {args.partitions} partitions, "
        f"batches of {args.batch_size:,}; {os.cpu_count()} CPUs shared by the schedulers, the "
        "Redis server and the store. Wall time from the first process starting to read to the "
        "last one done; CPU is the schedulers' own (user + system)."
        + ("" if not args.call_interval_s else
           f" Steady state at one call per {args.call_interval_s:g} s a session (store refresh "
           f"{args.refresh_s:g} s, policy cache {args.policy_cache_s:g} s): each scheduler "
           "drained a warm-up round, then had the refresh of a share of its sessions made "
           "due."),
        "",
        "| processes | seconds | events/s | × one process | events per scheduler CPU-s "
        "| Redis CPU-s | unacked left |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = runs[0]["events/s"] if runs else 0.0
    for run_ in runs:
        lines.append(
            f"| {run_['processes']} | {run_['seconds']:.2f} | **{run_['events/s']:,.0f}** | "
            f"{run_['events/s'] / base:.2f} | {run_['events per scheduler cpu s']:,.0f} | "
            f"{_num(run_['redis cpu s'])} | {run_['unacked left']} |")
    return "\n".join(lines) + "\n"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--batch-size", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=Settings().partitions)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--database-url", default=None,
                        help="store URL (default: a fresh SQLite file in a temporary directory)")
    parser.add_argument("--refresh-s", type=float, default=Settings().scheduler_store_refresh_s,
                        help="scheduler_store_refresh_s (0: write every report to the store)")
    parser.add_argument("--policy-cache-s", type=float, default=3600.0,
                        help="scheduler_policy_cache_s (the default here keeps every session's "
                             "info for the run; the service default is 5)")
    parser.add_argument("--flush-ms", type=int, default=Settings().scheduler_store_flush_ms,
                        help="scheduler_store_flush_ms (0: write the store every batch)")
    parser.add_argument("--call-interval-s", type=float, default=None,
                        help="steady state of a fleet calling every this many seconds: a "
                             "warm-up round (one report a session, not timed), then the writes "
                             "of a share of the sessions moved back past the refresh interval "
                             "so that one report in refresh/interval is written")
    parser.add_argument("--quick", action="store_true", help="20,000 events: a smoke run")
    parser.add_argument("--warm-cache", action="store_true",
                        help="read every session's policy before timing (a running scheduler)")
    parser.add_argument("--no-store", action="store_true",
                        help="replace the store write with a no-op: the scheduler's own ceiling")
    parser.add_argument("--processes", default=None,
                        help="comma-separated process counts (e.g. 1,2,4): scheduler processes "
                             "sharing the partitions, each count on the same events and a copy "
                             "of the same store")
    parser.add_argument("--profile", type=Path, default=None,
                        help="write a cProfile (CPU time) of the timed loop here")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.events = min(args.events, 20_000)
    if args.call_interval_s is not None and (args.call_interval_s <= 0 or args.refresh_s <= 0):
        parser.error("--call-interval-s needs a positive interval and --refresh-s > 0")
    if args.processes:
        counts = [int(n) for n in args.processes.split(",")]
        with tempfile.TemporaryDirectory(prefix="sf-bench-sched-") as tmp:
            workdir = Path(tmp)
            db_url, sessions = _setup(args, workdir)
            pristine = workdir / "pristine.db"
            if args.database_url is None:
                shutil.copy(workdir / "store.db", pristine)
            runs = []
            for n in counts:
                if args.database_url is None:  # every count starts from the same store
                    shutil.copy(pristine, workdir / "store.db")
                runs.append(run_processes(args, n, workdir, db_url, sessions))
        text = report_processes(runs, args)
        data: Any = {"mode": "processes", "args": vars(args) | {"out": str(args.out),
                                                                 "json": str(args.json),
                                                                 "profile": None},
                     "runs": runs}
        ok = all(r["unacked left"] == 0 for r in runs)
    else:
        result = run(args)
        text = report(result)
        data = {"mode": "one", "result": result}
        ok = result["unacked left"] == 0
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
