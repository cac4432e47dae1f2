"""Benchmark: usage events ingested per second by one scheduler (goal: >= 20,000/s).

Setup (not timed): ``--sessions`` sessions in a fresh store (SQLite in a temporary directory
unless ``--database-url`` names another), each with enough turns and a budget large enough that
no fold is due, and ``--events`` usage events for them already on the stream (pipelined XADD:
publishing speed is not what is measured), round-robin over the sessions, each naming a new
seq (so every event is a new measurement, as one per model call is).

Timed: one :class:`~sessionfold.workers.scheduler.Scheduler` calling ``run_once`` until the
stream is drained: XREADGROUP in batches, per-session compare-and-set in Redis (Lua, pipelined),
``record_usage_batch`` in the store, the trigger check, XACK. Reported: events/s overall, and
the time split between the Redis read, the Redis compare-and-set, the store write and the rest.

The number depends on how many events share a session within a batch (the store writes one
row per session per batch): ``--sessions 1000`` with ``--batch-size 1000`` is the hard case
(about one event per session per batch), fewer sessions the easy one.

Usage (from the repository root; Redis from ``SF_TEST_REDIS_URL`` or ``REDIS_URL``, default
``redis://127.0.0.1:6379/15``; only keys under a fresh prefix are touched and removed)::

    .venv/bin/python bench/bench_scheduler.py            # 200,000 events, 1,000 sessions
    .venv/bin/python bench/bench_scheduler.py --quick    # 20,000 events, a few seconds
    .venv/bin/python bench/bench_scheduler.py --sessions 100 --events 100000
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from sessionfold.core.policy import FoldPolicy
from sessionfold.store.store import SessionStore
from sessionfold.workers.keys import Keys
from sessionfold.workers.metrics import Metrics
from sessionfold.workers.redis_conn import redis_client
from sessionfold.workers.scheduler import Scheduler
from sessionfold.workers.settings import Settings
from sessionfold.workers.usagebus import UsageEvent

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


def _prefill(client: Any, keys: Keys, sessions: list[tuple[str, int, int]], events: int) -> None:
    pipe = client.pipeline(transaction=False)
    now = time.time()
    stream = keys.usage_stream()
    for i in range(events):
        sid, last_seq, revision = sessions[i % len(sessions)]
        round_ = i // len(sessions)
        ev = UsageEvent(session_id=sid, seq=min(round_, last_seq), revision=revision,
                        input_tokens=1000 + round_, output_tokens=50, model="bench",
                        time=now)
        pipe.xadd(stream, ev.to_fields(), maxlen=max(events * 2, 1000),  # type: ignore[arg-type]
                  approximate=True)
        if len(pipe) >= 5000:
            pipe.execute()
    pipe.execute()


def run(args: argparse.Namespace) -> dict[str, Any]:
    redis_url = args.redis_url or os.environ.get("SF_TEST_REDIS_URL") or os.environ.get(
        "REDIS_URL") or "redis://127.0.0.1:6379/15"
    prefix = f"bench-scheduler:{uuid.uuid4().hex[:8]}:"
    tmp = tempfile.TemporaryDirectory(prefix="sf-bench-sched-")
    db_url = args.database_url or f"sqlite:///{Path(tmp.name) / 'store.db'}"
    settings = Settings(redis_url=redis_url, database_url=db_url, key_prefix=prefix,
                        data_dir=Path(tmp.name), scheduler_batch_size=args.batch_size,
                        scheduler_block_ms=50, scheduler_sweep_interval_s=3600,
                        scheduler_policy_cache_s=60, usage_stream_maxlen=max(args.events, 1000),
                        scheduler_store_flush_ms=args.flush_ms)
    keys = Keys.from_settings(settings)
    client = redis_client(redis_url)
    store = SessionStore.from_url(db_url)
    store.migrate()
    sessions: list[tuple[str, int, int]] = []
    # Enough messages that every event of a session names a new seq, as real calls do.
    per_session = -(-args.events // args.sessions)
    turns = [{"role": "user", "content": "check the queue depth"},
             {"role": "assistant", "content": "the queue depth is 12, nothing to do"}
             ] * max(4, per_session // 2 + 1)
    for i in range(args.sessions):
        sid = f"bench-{i:05d}"
        store.create_session(sid, FoldPolicy(budget_tokens=1_000_000), system="bench agent")
        appended = store.append(sid, turns)
        sessions.append((sid, appended.last_seq, appended.revision))
    _prefill(client, keys, sessions, args.events)

    if args.no_store:
        store.record_usage_batch = lambda reports: len(reports)  # type: ignore[method-assign]
    enqueued: list[str] = []
    scheduler = Scheduler(settings, store, client,
                          lambda sid, epoch, trigger, token: enqueued.append(sid) or "job",
                          consumer_name="bench", metrics_=Metrics(CollectorRegistry()))
    scheduler.sweep()  # the periodic sweep is not part of ingestion: run it before timing
    if args.warm_cache:  # the policy cache as a long-running scheduler has it
        for sid, _, _ in sessions:
            scheduler._cached_info(sid)
    totals: dict[str, float] = {}
    consumer = scheduler.consumer
    consumer._read_new = _timed(totals, "redis read", consumer._read_new)  # type: ignore[method-assign]
    scheduler._compare_and_set = _timed(  # type: ignore[method-assign]
        totals, "redis compare-and-set", scheduler._compare_and_set)
    store.record_usage_batch = _timed(  # type: ignore[method-assign]
        totals, "store write (record_usage_batch)", store.record_usage_batch)
    store.get_session = _timed(  # type: ignore[method-assign]
        totals, "store read (policy cache misses)", store.get_session)
    consumer.ack = _timed(totals, "redis ack", consumer.ack)  # type: ignore[method-assign]

    ingested = batches = accepted = 0
    start = time.perf_counter()
    while ingested < args.events:
        stats = scheduler.run_once()
        if stats.events == 0:
            break
        ingested += stats.events
        accepted += stats.written
        batches += 1
    scheduler.flush()  # what still waits to be written is part of the work
    elapsed = time.perf_counter() - start
    left = int(client.xpending(keys.usage_stream(), settings.scheduler_group)["pending"])

    for key in client.scan_iter(match=keys.all_pattern(), count=1000):
        client.delete(key)
    client.close()
    store.close()
    tmp.cleanup()
    other = elapsed - sum(totals.values())
    return {
        "events": ingested, "sessions": args.sessions, "batch size": args.batch_size,
        "flush ms": args.flush_ms,
        "batches": batches, "store rows written": accepted, "unacked left": left,
        "jobs enqueued": len(enqueued), "seconds": elapsed,
        "events/s": ingested / elapsed if elapsed else 0.0,
        "split": {**totals, "python (decode, decide, bookkeeping)": other},
        "store": ("no-op (--no-store)" if args.no_store else
                  "sqlite (tmp)" if args.database_url is None else "given URL"),
        "parser": _parser_name(client),
    }


def _parser_name(client: Any) -> str:
    try:
        import hiredis  # noqa: F401
        return "hiredis"
    except ImportError:
        return "redis-py's pure-Python parser"


def report(result: dict[str, Any]) -> str:
    lines = [
        "## Scheduler ingestion (issue 4)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; store: {result['store']}; reply parser: "
        f"{result['parser']}.",
        "",
        "| events | sessions | batch | flush ms | batches | store rows | seconds | events/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {result['events']:,} | {result['sessions']:,} | {result['batch size']:,} | "
        f"{result['flush ms']} | "
        f"{result['batches']:,} | {result['store rows written']:,} | {result['seconds']:.2f} | "
        f"**{result['events/s']:,.0f}** |",
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--batch-size", type=int, default=1_000)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--database-url", default=None,
                        help="store URL (default: a fresh SQLite file in a temporary directory)")
    parser.add_argument("--flush-ms", type=int, default=Settings().scheduler_store_flush_ms,
                        help="scheduler_store_flush_ms (0: write the store every batch)")
    parser.add_argument("--quick", action="store_true", help="20,000 events: a smoke run")
    parser.add_argument("--warm-cache", action="store_true",
                        help="read every session's policy before timing (a running scheduler)")
    parser.add_argument("--no-store", action="store_true",
                        help="replace the store write with a no-op: the scheduler's own ceiling")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.events = min(args.events, 20_000)
    result = run(args)
    text = report(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0 if result["unacked left"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
