"""The capacity model: what 10 k, 100 k and 1 M standing agents need, from measured costs.

Every figure of ``docs/capacity.md`` is a measured per-operation cost times a rate the
scenario states. The measurements come from the benchmarks' own JSON output, gathered into
``bench/results/capacity-inputs.json`` by ``--collect`` (so the model regenerates without
re-running anything, and the inputs are in the repository beside the figures)::

    # after the benchmarks ran (their JSON under bench/out/):
    .venv/bin/python bench/capacity.py --collect        # bench/out/*.json -> capacity-inputs.json
    .venv/bin/python bench/capacity.py                  # capacity-inputs.json -> docs/capacity.md

What it reads, and from which benchmark:

- fold CPU per fold (``bench/profile_fold.py --json bench/out/profile-fold.json``): CPU
  seconds of the fold procedure alone, one fold of a ~300-item window, instant summarizer;
- worker CPU per fold (``bench/bench_pipeline.py --throughput-only --throughput-messages 291
  --throughput-economics dollars --json bench/out/pipeline-throughput.json``): what a real
  worker (Celery consumer and pool child) spends per fold of the same windows, priced as a
  default policy's visits are; when measured, the worker cores are planned from it (the fold
  procedure alone is about two thirds of it);
- usage events per second per scheduler process, and with 2 and 4 processes, as a fleet in
  steady state sends them (``bench/bench_scheduler.py --processes 1,2,4 --sessions 20000
  --events 100000 --policy-cache-s 0 --call-interval-s 30 --json bench/out/scheduler.json``:
  about one event per session per read, a store write due for one report in ten, no gate
  kept by the policy cache alone);
- Redis bytes per session and per stream entry (``bench/bench_pipeline.py --json
  bench/out/pipeline.json``);
- folds per model call, summarizer calls per fold and summarizer tokens per call (B1,
  ``bench/bench_replay.py``, ``bench/out/b1/runs.json``: sessionfold-background at the chosen
  budget over the shipped transcripts);
- ledger rows per call and bytes per ledger row (the shipped transcripts themselves);
- the database's bytes per ledger row, everything an append writes (``bench/bench_pg_scale.py
  --footprint-only --out bench/out/pg-footprint.json``; without it storage is assumed at
  ``ROW_OVERHEAD`` × the ledger JSON).

``--collect`` keeps the figures of any benchmark whose JSON is not under bench/out/ from the
inputs file as it was (and says so), so one re-run benchmark refreshes its own figures alone.

What it assumes is printed beside what it measured, so either can be changed (``--agents``,
``--call-interval-s``, ``--budget``, and the constants below).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
INPUTS = REPO / "bench" / "results" / "capacity-inputs.json"
DOC = REPO / "docs" / "capacity.md"
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"

# --- assumptions (not measured here; stated in the document) ----------------------------------
#: Plan each part for this share of its measured capacity (headroom for bursts and restarts).
UTILISATION = 0.6
#: The summarizer's prices, $ per million tokens (claude-haiku class; prices are settings).
SUMMARIZER_IN_PER_MTOK = 1.0
SUMMARIZER_OUT_PER_MTOK = 5.0
#: Memory one Redis shard is planned with (a common managed-instance size).
REDIS_SHARD_BYTES = 25 * 2**30
#: Index and row overhead on top of a ledger row's JSON, PostgreSQL (a page's fill, the
#: primary key, the window item that points at it and the search chunks that index it).
ROW_OVERHEAD = 2.0


@dataclass(frozen=True)
class Inputs:
    """The measured costs, each with where it was measured."""

    fold_cpu_s: float
    fold_cpu_source: str
    scheduler_events_per_s: dict[str, float]
    scheduler_source: str
    redis_bytes_per_session: float
    redis_bytes_per_event: float
    redis_source: str
    folds_per_call: float
    summarizer_calls_per_fold: float
    summarizer_in_per_call: float
    summarizer_out_per_call: float
    b1_source: str
    ledger_rows_per_call: float
    bytes_per_ledger_row: float
    transcripts_source: str
    #: The database's size per ledger row, measured at fleet size (None: not measured, the
    #: storage is then ROW_OVERHEAD × the ledger JSON).
    db_bytes_per_ledger_row: float | None = None
    db_source: str = ""
    #: A whole worker's CPU per fold (Celery included), when measured: the cores are planned
    #: from it rather than from the fold procedure's CPU alone.
    worker_cpu_s: float | None = None
    worker_cpu_source: str = ""

    @property
    def cpu_per_fold_s(self) -> float:
        """The CPU one fold costs a worker: measured whole when it was, else the procedure's."""
        return self.worker_cpu_s if self.worker_cpu_s is not None else self.fold_cpu_s


def collect(budget: int, previous: dict[str, Any] | None = None) -> Inputs:
    """Read the benchmarks' JSON under bench/out/ (and the shipped transcripts).

    A benchmark whose JSON is missing keeps its figures (and their sources) from ``previous``,
    the inputs file as it was, so one re-run benchmark refreshes its own figures alone; with
    nothing to keep the missing JSON is an error naming the command that makes it.
    """
    previous = previous or {}
    found: dict[str, Any] = {}

    def group(name: str, path: Path, how: str, fields: tuple[str, ...],
              read: Callable[[Any], dict[str, Any]], *, optional: bool = False) -> None:
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        if path.exists():
            found.update(read(json.loads(path.read_text(encoding="utf-8"))))
        elif all(previous.get(f) is not None for f in fields):
            print(f"capacity: {shown} is missing; keeping the {name} figures "
                  "of the inputs file", file=sys.stderr)
            found.update({f: previous[f] for f in fields})
        elif not optional:
            raise SystemExit(f"capacity: {shown} is missing; run `{how}` first")

    group("fold CPU", OUT / "profile-fold.json",
          "bench/profile_fold.py --json bench/out/profile-fold.json",
          ("fold_cpu_s", "fold_cpu_source"), _fold_cpu)
    group("worker CPU", OUT / "pipeline-throughput.json",
          "bench/bench_pipeline.py --throughput-only --throughput-messages 291 "
          "--throughput-economics dollars --json bench/out/pipeline-throughput.json",
          ("worker_cpu_s", "worker_cpu_source"), _worker_cpu, optional=True)
    group("scheduler", OUT / "scheduler.json", SCHEDULER_COMMAND,
          ("scheduler_events_per_s", "scheduler_source"),
          lambda data: {"scheduler_events_per_s": _scheduler_rates(data),
                        "scheduler_source": _scheduler_source(data)})
    group("Redis", OUT / "pipeline.json",
          "bench/bench_pipeline.py --json bench/out/pipeline.json",
          ("redis_bytes_per_session", "redis_bytes_per_event", "redis_source"), _redis)
    group("B1", OUT / "b1" / "runs.json", "bench/bench_replay.py --out bench/out/b1",
          ("folds_per_call", "summarizer_calls_per_fold", "summarizer_in_per_call",
           "summarizer_out_per_call", "b1_source"), lambda data: _b1(data, budget))
    group("PostgreSQL", OUT / "pg-footprint.json",
          "bench/bench_pg_scale.py --footprint-only --out bench/out/pg-footprint.json",
          ("db_bytes_per_ledger_row", "db_source"), _pg_footprint)
    rows, size, assistant = 0, 0, 0
    for path in sorted(TRANSCRIPTS.glob("*.json")):
        messages = json.loads(path.read_text(encoding="utf-8"))["messages"]
        rows += len(messages)
        size += sum(len(json.dumps(m, ensure_ascii=False).encode()) for m in messages)
        assistant += sum(1 for m in messages if m["role"] == "assistant")
    return Inputs(
        **found,
        ledger_rows_per_call=rows / max(1, assistant),
        bytes_per_ledger_row=size / max(1, rows),
        transcripts_source=f"the {len(list(TRANSCRIPTS.glob('*.json')))} shipped transcripts: "
                           f"{rows} messages, {assistant} model calls",
    )


def _fold_cpu(profile: Any) -> dict[str, Any]:
    # The largest window, priced as a worker prices a default policy's visit when measured so.
    largest = max(profile, key=lambda r: (r["items"], r.get("economics") == "dollars"))
    how = {"settled": " (collector settled, as worker children run)",
           "default": " (Python's default collector)"}.get(largest.get("collector", ""), "")
    when = f", {largest['run']}" if largest.get("run") else ""
    return {"fold_cpu_s": round(largest["cpu_median_ms"] / 1000, 6),
            "fold_cpu_source": f"bench/profile_fold.py{how}: median CPU of one "
                               f"{'priced ' if largest.get('economics') == 'dollars' else ''}"
                               f"fold of a {largest['items']}-message window with the offline "
                               f"summarizer ({largest['folds']} folds{when})"}


def _worker_cpu(pipeline: Any) -> dict[str, Any]:
    tp = pipeline["throughput"]
    if tp.get("cpu ms/fold") is None:
        raise SystemExit("capacity: the pipeline throughput JSON holds no worker CPU per fold "
                         "(measure it with a bench_pipeline.py of this release)")
    priced = ", every visit priced" if tp.get("economics") == "dollars" else ""
    return {"worker_cpu_s": round(tp["cpu ms/fold"] / 1000, 6),
            "worker_cpu_source": f"bench/bench_pipeline.py --throughput-only: the CPU of one "
                                 f"worker process group (Celery consumer and pool child, user + "
                                 f"system) over {tp['folded']} folds of {tp['messages']}-message "
                                 f"windows{priced}, offline summarizer, "
                                 f"{pipeline.get('run', 'date not recorded')}"}


def _redis(pipeline: Any) -> dict[str, Any]:
    if "lag" not in pipeline:
        raise SystemExit("capacity: bench/out/pipeline.json holds no lag run (a "
                         "--throughput-only run goes to bench/out/pipeline-throughput.json)")
    lag = pipeline["lag"]
    return {"redis_bytes_per_session": float(lag["redis bytes/session"]),
            "redis_bytes_per_event": float(lag["stream bytes/event"]),
            "redis_source": f"bench/bench_pipeline.py, {lag['sessions']} sessions: MEMORY USAGE "
                            "of each measured-size hash and of the usage streams"}


def _b1(b1: Any, budget: int) -> dict[str, Any]:
    totals = next(t for t in b1["totals"]
                  if t["system"] == "sessionfold-background" and t["budget"] == budget)
    calls = totals["calls"]
    folds = max(1, totals["prefix_breaks"])
    summarizer_calls = max(1, totals["summarizer_calls"])
    return {"folds_per_call": folds / calls,
            "summarizer_calls_per_fold": summarizer_calls / folds,
            "summarizer_in_per_call": totals["summarizer_input"] / summarizer_calls,
            "summarizer_out_per_call": totals["summarizer_output"] / summarizer_calls,
            "b1_source": f"B1 sessionfold-background at {budget:,} tokens: {folds} folds and "
                         f"{summarizer_calls} summarizer calls over {calls} model calls"}


#: The tables that grow with every ledger row for as long as the session lives (windows,
#: session rows and append keys are bounded per session or pruned: ``sessionfold prune``).
LEDGER_TABLES = ("ledger", "ledger_chunks", "tool_use_ids")


def _pg_footprint(data: Any) -> dict[str, Any]:
    f = data["footprint"]
    rows = f["rows"]["ledger"]
    grown = sum(f["bytes"][t] for t in LEDGER_TABLES if t in f["bytes"])
    return {"db_bytes_per_ledger_row": grown / max(1, rows),
            "db_source": f"bench/bench_pg_scale.py --footprint-only: the ledger, its search "
                         f"chunks and tool-use ids (heap, TOAST, indexes) of {rows:,} ledger rows "
                         f"appended through the API ({f['sessions']} sessions, "
                         f"{f['appends']:,} keyed appends), PostgreSQL "
                         f"{data['postgres'].split()[0]}, {data['started'][:10]}; windows, "
                         "session rows and append keys are bounded per session and left out"}


#: A fleet in steady state: about one event per session per read (20,000 sessions over 16
#: partitions), agents calling every 30 s (a warm-up round first; one report in ten finds its
#: session's store refresh due, at the default 300 s), no gate kept by the policy cache alone
#: (0 s: agents calling every 30 s outlive the 5 s default).
SCHEDULER_COMMAND = ("bench/bench_scheduler.py --processes 1,2,4 --sessions 20000 --events "
                     "100000 --policy-cache-s 0 --call-interval-s 30 "
                     "--json bench/out/scheduler.json")


def _scheduler_source(data: Any) -> str:
    args = data.get("args", {}) if isinstance(data, dict) else {}
    if not args:
        return "bench/bench_scheduler.py --processes 1,2,4 (events/s, all processes together)"
    return (f"bench/bench_scheduler.py --processes {args.get('processes')}: "
            f"{args.get('events', 0):,} events over {args.get('sessions', 0):,} sessions "
            f"(about one event per session per read"
            + (f", steady state at one call per {args['call_interval_s']:g} s a session"
               if args.get("call_interval_s") else "")
            + f"), policy cache {args.get('policy_cache_s', 3600):g} s, store refresh "
            f"{args.get('refresh_s', 0):g} s; events/s, all processes together")


def _scheduler_rates(data: Any) -> dict[str, float]:
    runs = data["runs"] if isinstance(data, dict) and "runs" in data else data
    if isinstance(runs, dict):
        runs = [runs]
    rates: dict[str, float] = {}
    for run in runs:
        n = run.get("processes", 1)
        rates[str(n)] = float(run["events/s"])
    if not rates:
        raise SystemExit("capacity: the scheduler JSON holds no run")
    return rates


def _load(path: Path, how: str) -> Any:
    if not path.exists():
        raise SystemExit(f"capacity: {path.relative_to(REPO)} is missing; run `{how}` first")
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Plan:
    agents: int
    events_per_s: float
    folds_per_s: float
    worker_cores: int
    summarizer_calls_per_s: float
    summarizer_dollars_per_h: float
    scheduler_processes: int
    redis_bytes: float
    redis_shards: int
    ledger_rows_per_day: float
    storage_bytes_per_day: float
    write_transactions_per_s: float


def plan(inputs: Inputs, agents: int, call_interval_s: float) -> Plan:
    events = agents / call_interval_s  # one usage event per model call
    folds = events * inputs.folds_per_call
    cores = math.ceil(folds * inputs.cpu_per_fold_s / UTILISATION)
    s_calls = folds * inputs.summarizer_calls_per_fold
    dollars_h = s_calls * 3600 * (inputs.summarizer_in_per_call * SUMMARIZER_IN_PER_MTOK
                                  + inputs.summarizer_out_per_call * SUMMARIZER_OUT_PER_MTOK) / 1e6
    one = inputs.scheduler_events_per_s.get("1") or min(inputs.scheduler_events_per_s.values())
    schedulers = max(1, math.ceil(events / (one * UTILISATION)))
    # The stream keeps its newest entries (SESSIONFOLD_USAGE_STREAM_MAXLEN, 1 M by default,
    # split over the partitions); each session keeps one measured-size hash.
    stream_entries = min(1_000_000, events * 60)  # a minute of backlog at most, in practice
    redis = agents * inputs.redis_bytes_per_session + stream_entries * inputs.redis_bytes_per_event
    shards = max(1, math.ceil(redis / (REDIS_SHARD_BYTES * UTILISATION)))
    rows_day = events * 86_400 * inputs.ledger_rows_per_call
    storage_day = rows_day * (inputs.db_bytes_per_ledger_row
                              or inputs.bytes_per_ledger_row * ROW_OVERHEAD)
    # Each call's messages are one or two appends (a transaction each), each fold one commit;
    # usage reports reach the store in the scheduler's batches (one statement per batch, each
    # session under its trigger at most once per scheduler_store_refresh_s).
    writes = events * inputs.ledger_rows_per_call + folds
    return Plan(agents=agents, events_per_s=events, folds_per_s=folds, worker_cores=cores,
                summarizer_calls_per_s=s_calls, summarizer_dollars_per_h=dollars_h,
                scheduler_processes=schedulers, redis_bytes=redis, redis_shards=shards,
                ledger_rows_per_day=rows_day, storage_bytes_per_day=storage_day,
                write_transactions_per_s=writes)


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def document(inputs: Inputs, plans: list[Plan], call_interval_s: float, budget: int) -> str:
    rates = ", ".join(f"{k} process(es): {v:,.0f}/s" for k, v in
                      sorted(inputs.scheduler_events_per_s.items(), key=lambda kv: int(kv[0])))
    rows = [
        ("usage events/s", lambda p: f"{p.events_per_s:,.0f}"),
        ("folds/s", lambda p: f"{p.folds_per_s:,.1f}"),
        ("worker cores (whole worker's CPU)" if inputs.worker_cpu_s is not None
         else "worker cores (fold CPU alone)", lambda p: f"{p.worker_cores:,}"),
        ("summarizer calls/s", lambda p: f"{p.summarizer_calls_per_s:,.1f}"),
        ("summarizer $/hour", lambda p: f"${p.summarizer_dollars_per_h:,.2f}"),
        ("scheduler processes", lambda p: f"{p.scheduler_processes:,}"),
        ("Redis memory (sessionfold's keys)", lambda p: _size(p.redis_bytes)),
        ("Redis shards", lambda p: f"{p.redis_shards:,}"),
        ("PostgreSQL ledger rows/day", lambda p: f"{p.ledger_rows_per_day:,.0f}"),
        ("PostgreSQL storage/day", lambda p: _size(p.storage_bytes_per_day)),
        ("PostgreSQL write transactions/s", lambda p: f"{p.write_transactions_per_s:,.0f}"),
    ]
    head = "| | " + " | ".join(f"{p.agents:,} agents" for p in plans) + " |"
    table = [head, "|---|" + "---:|" * len(plans)]
    table += [f"| {name} | " + " | ".join(fn(p) for p in plans) + " |" for name, fn in rows]
    return "\n".join([
        "# Capacity: what a fleet of standing agents needs",
        "",
        "<!-- generated by bench/capacity.py from bench/results/capacity-inputs.json; do not "
        "edit by hand -->",
        "",
        f"Each agent makes one model call every {call_interval_s:g} s with a "
        f"{budget:,}-token budget. Every figure is a measured per-operation cost (below) "
        f"times that rate, planned at {UTILISATION:.0%} of the measured capacity.",
        "",
        *table,
        "",
        "## What was measured",
        "",
        *([f"- **Worker CPU**: {inputs.worker_cpu_s * 1000:.1f} ms of a worker's CPU a fold "
           f"({inputs.worker_cpu_source}): the worker cores above are planned from it."]
          if inputs.worker_cpu_s is not None else []),
        f"- **Fold CPU**: {inputs.fold_cpu_s * 1000:.1f} ms of CPU a fold for the fold "
        f"procedure alone ({inputs.fold_cpu_source}). Summarizer waits are I/O: a worker's "
        "threads overlap them, so cores are counted for CPU only; add a thread per summarizer "
        "call in flight.",
        f"- **Scheduler ingest**: {rates} ({inputs.scheduler_source}). Processes scale by "
        "partitions; on the 2-core benchmark machine more than two processes share two cores.",
        f"- **Redis**: {inputs.redis_bytes_per_session:,.0f} bytes per session, "
        f"{inputs.redis_bytes_per_event:,.0f} bytes per stream entry ({inputs.redis_source}).",
        f"- **Folds and the summarizer**: {inputs.folds_per_call:.4f} folds per model call (one "
        f"fold per {1 / inputs.folds_per_call:,.0f} calls), {inputs.summarizer_calls_per_fold:.2f}"
        f" summarizer calls per fold, {inputs.summarizer_in_per_call:,.0f} tokens in and "
        f"{inputs.summarizer_out_per_call:,.0f} out per summarizer call ({inputs.b1_source}).",
        f"- **Store rows**: {inputs.ledger_rows_per_call:.2f} ledger rows per model call, "
        f"{inputs.bytes_per_ledger_row:,.0f} bytes of JSON per row "
        f"({inputs.transcripts_source}).",
        *([f"- **PostgreSQL storage**: {inputs.db_bytes_per_ledger_row:,.0f} bytes of database "
           f"per ledger row ({inputs.db_source}). Append, read, usage and fold commit "
           "latencies were flat between 0.1 M and 10 M ledger rows (bench/RESULTS.md, "
           "\"PostgreSQL at fleet size\")."]
          if inputs.db_bytes_per_ledger_row else []),
        "",
        "## What was assumed",
        "",
        f"- Plan at {UTILISATION:.0%} of measured capacity.",
        f"- Summarizer prices ${SUMMARIZER_IN_PER_MTOK:g} / ${SUMMARIZER_OUT_PER_MTOK:g} per "
        "million input / output tokens (a Haiku-class model; `SESSIONFOLD_PRICES` sets yours).",
        f"- A Redis shard of {_size(REDIS_SHARD_BYTES)}; a stream backlog of at most a minute "
        "of events.",
        *([] if inputs.db_bytes_per_ledger_row else [
            f"- PostgreSQL storage {ROW_OVERHEAD:g}× the ledger JSON (the window item, the "
            "search chunks, indexes, page fill)."]),
        "- One PostgreSQL write transaction per appended message and per fold commit (usage "
        "reports are batched by the scheduler).",
        "",
        "## When to add the next one",
        "",
        "- **Workers**: when `sessionfold_sessions_over_budget` stays above zero or the fold "
        "queue does not drain; cores above are fold CPU, before any summarizer waits.",
        "- **Schedulers**: when `sessionfold_scheduler_lag_seconds` grows; set "
        "`SESSIONFOLD_PARTITIONS` once, to at least the most schedulers you will run.",
        "- **Redis**: move sessionfold's keys to a Redis Cluster (`redis+cluster://`) and the "
        "broker to its own Redis or RabbitMQ (`SESSIONFOLD_BROKER_URL`) when one node's memory "
        "or command rate is the limit.",
        "- **PostgreSQL**: the write rate above is what it must sustain; the retention rules "
        "(`sessionfold prune`) keep append keys, no-op visit records and dead letters bounded. "
        "Latency does not call for partitioning at 10 M ledger rows (every p50 flat from 0.1 M);"
        " storage and maintenance will first: most of a ledger row's bytes are its search "
        "chunks (`ledger_chunks`), so that table is the first to partition by session (hash) "
        "or move to its own volume once one table's VACUUM and index builds take too long.",
        "",
        "Regenerate: `.venv/bin/python bench/capacity.py --collect` after the benchmarks, then "
        "`.venv/bin/python bench/capacity.py`.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collect", action="store_true",
                        help="gather the benchmarks' JSON (bench/out/) into the inputs file")
    parser.add_argument("--inputs", type=Path, default=INPUTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--agents", default="10000,100000,1000000")
    parser.add_argument("--call-interval-s", type=float, default=30.0)
    parser.add_argument("--budget", type=int, default=32_000,
                        help="the B1 budget whose fold rate is used")
    args = parser.parse_args(argv)
    try:
        agents = [int(a) for a in args.agents.split(",")]
    except ValueError:
        parser.error("--agents must be comma-separated integers")
    if args.call_interval_s <= 0 or any(a <= 0 for a in agents):
        parser.error("--agents and --call-interval-s must be positive")
    if args.collect:
        previous = (json.loads(args.inputs.read_text(encoding="utf-8"))
                    if args.inputs.exists() else None)
        inputs = collect(args.budget, previous)
        args.inputs.parent.mkdir(parents=True, exist_ok=True)
        args.inputs.write_text(json.dumps({"budget": args.budget, **asdict(inputs)}, indent=2)
                               + "\n", encoding="utf-8")
        print(f"capacity: wrote {args.inputs}")
    if not args.inputs.exists():
        parser.error(f"{args.inputs} is missing: run with --collect after the benchmarks")
    raw = json.loads(args.inputs.read_text(encoding="utf-8"))
    budget = raw.pop("budget", args.budget)
    inputs = Inputs(**raw)
    plans = [plan(inputs, n, args.call_interval_s) for n in agents]
    text = document(inputs, plans, args.call_interval_s, budget)
    args.doc.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
