"""Benchmark: the session store's latencies (issue 3), on SQLite and PostgreSQL.

For each backend, and for two ledger sizes (``--small-rows``, default 10,000, and ``--rows``,
default 1,000,000, spread over ``--sessions`` sessions, default 10,000), in a fresh database:

- **window read, alone**: ``read_window`` of a 301-item window (a real agent run: the task and
  150 turns from the shared transcripts), timed as the SQL round trip plus decoding into
  messages, on ``--hot`` such sessions picked at random;
- **append**: one whole turn (assistant tool call + its tool result, real transcript text) to a
  random session, keyed;
- **fold commit**: ``commit_fold`` of a fold replacing the first ten turns after the task by a
  summary (the claim and the plan are made before the clock starts; the commit is the
  compare-and-set, the window swap, span, record and session update in one transaction);
- **window read, under load**: the same reads while ``--writers`` (8) writer processes append
  turns (to the other sessions, and one in ten to the read sessions) and fold.

Goals (issue 3): read p99 under 5 ms alone (reported under load too); fold commit independent
of the ledger size (p50 at the large size within 20 % of the p50 at the small size).

Setup is not timed. The filler sessions are bulk-inserted with the store's own schema and
invariants (every seq covered once by the window, sizes in the session rows); the read sessions
go through ``SessionStore.append``. PostgreSQL runs in a database made for the run
(``sf_bench_<random>``, dropped afterwards) on the server named by ``--postgres-url`` (default
``$SF_TEST_POSTGRES_URL``, else the local server's ``postgres`` database).

Usage (from the repository root)::

    .venv/bin/python bench/bench_store.py --quick             # both backends, small sizes
    .venv/bin/python bench/bench_store.py --backend sqlite --rows 200000 --sessions 2000
    .venv/bin/python bench/bench_store.py                     # the issue's 1M rows (slow)
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sessionfold.cli.files import load_conversation_file
from sessionfold.core.compact import FoldResult
from sessionfold.core.frame import fingerprint, summary_message
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import default_counter
from sessionfold.core.window import CompactionRecord, FoldEdit, FoldedSpan, WindowItem
from sessionfold.runtime.collector import freeze_startup_objects
from sessionfold.store import SessionStore
from sessionfold.store.codec import encode_message
from sessionfold.store.engine import create_store_engine
from sessionfold.store.schema import ledger, sessions, window_items

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
OUT = REPO / "bench" / "out" / "store.md"
DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
#: Not the 868 K-character run: its one giant output is clipped anyway, and it is not typical.
SOURCES = ("django__django-16560", "sphinx-doc__sphinx-9229", "sympy__sympy-13091",
           "pylint-dev__pylint-6528", "pytest-dev__pytest-7490", "django__django-15554")
HOT_TURNS = 150
FOLD_TURNS = 10
HOT_POLICY = FoldPolicy(budget_tokens=400_000)
FILLER_POLICY = FoldPolicy(budget_tokens=1_000_000)


# --- real text -----------------------------------------------------------------------------------

def _corpus() -> tuple[str, Message, list[tuple[Message, Message]]]:
    """The system prompt, a task message and every (assistant, tool result) turn of the runs."""
    turns: list[tuple[Message, Message]] = []
    system, task = "", None
    for name in SOURCES:
        conv = load_conversation_file(TRANSCRIPTS / f"{name}.json")
        system = system or conv.system
        task = task or conv.messages[0]
        msgs = conv.messages
        for i in range(1, len(msgs) - 1):
            if msgs[i].role == "assistant" and msgs[i].tool_use_ids() and \
                    msgs[i + 1].has_tool_results():
                turns.append((msgs[i], msgs[i + 1]))
    assert task is not None
    return system, task, turns


def _renamed(turn: tuple[Message, Message], tag: str) -> list[dict[str, Any]]:
    """A turn as JSON with fresh tool_use ids (ids are unique within a session)."""
    call, result = (encode_message(m) for m in turn)
    ids = {}
    for block in call["content"]:
        if block.get("type") == "tool_use":
            ids[block["id"]] = block["id"] = f"{block['id'][:40]}-{tag}"
    for block in result["content"]:
        if block.get("type") == "tool_result":
            block["tool_use_id"] = ids.get(block["tool_use_id"], block["tool_use_id"])
    return [call, result]


# --- databases ---------------------------------------------------------------------------------

@contextmanager
def _database(backend: str, admin_url: str, keep: bool) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="sf-bench-store-") as tmp:
            yield f"sqlite:///{Path(tmp) / 'store.db'}"
        return
    admin = create_store_engine(admin_url, pool_size=1).execution_options(
        isolation_level="AUTOCOMMIT")
    name = f"sf_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        if not keep:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _load_fillers(store: SessionStore, count: int, rows_each: int, system: str,
                  task: Message, turns: Sequence[tuple[Message, Message]],
                  rng: random.Random) -> list[str]:
    """Bulk-insert ``count`` sessions of ``rows_each`` ledger rows (task + whole turns)."""
    counter = default_counter()
    system_tokens = counter.system(system)
    task_json = encode_message(task)
    task_tokens = counter.message(task)
    turn_tokens = [(counter.message(a), counter.message(b)) for a, b in turns]
    now = datetime.now(UTC)
    sids: list[str] = []
    batch_sessions: list[dict[str, Any]] = []
    batch_rows: list[dict[str, Any]] = []

    def flush() -> None:
        with store.engine.begin() as conn:
            if batch_sessions:
                conn.execute(sessions.insert(), batch_sessions)
            if batch_rows:
                conn.execute(ledger.insert(), [
                    {"session_id": r["session_id"], "seq": r["start_seq"],
                     "message": r["message"], "tokens": r["tokens"], "appended_at": now,
                     "discarded_at": None} for r in batch_rows])
                conn.execute(window_items.insert(), batch_rows)
        batch_sessions.clear()
        batch_rows.clear()

    for n in range(count):
        sid = f"filler-{n:06d}"
        sids.append(sid)
        rows = [(task_json, task_tokens)]
        while len(rows) + 2 <= rows_each:
            k = rng.randrange(len(turns))
            call, result = _renamed(turns[k], f"{n}-{len(rows)}")
            rows += [(call, turn_tokens[k][0]), (result, turn_tokens[k][1])]
        window_tokens = sum(t for _, t in rows)
        for seq, (message, tokens) in enumerate(rows):
            batch_rows.append({"session_id": sid, "start_seq": seq, "end_seq": seq,
                               "kind": "message", "message": message, "edits": [],
                               "version": 1, "tokens": tokens})
        batch_sessions.append({
            "id": sid, "policy": FILLER_POLICY.to_json(), "system": system,
            "system_tokens": system_tokens, "revision": 1, "fold_revision": 0, "fold_epoch": 0,
            "claimed_by": None, "claim_expires_at": None, "paused": False,
            "next_seq": len(rows), "tail_tool_use_ids": [], "window_tokens": window_tokens,
            "measured_tokens": None, "measured_seq": None, "measured_revision": None,
            "pending_tokens": 0, "calibration": {}, "current_tokens":
                system_tokens + window_tokens,
            "trigger_tokens": FILLER_POLICY.trigger_tokens, "last_visit_outcome": None,
            "last_visit_tokens": None, "last_visit_at": None, "created_at": now,
            "updated_at": now, "incarnation": rng.getrandbits(62),
        })
        if len(batch_rows) >= 20_000:
            flush()
    flush()
    return sids


def _load_hot(store: SessionStore, count: int, system: str, task: Message,
              turns: Sequence[tuple[Message, Message]]) -> list[str]:
    sids = []
    for n in range(count):
        sid = f"hot-{n:03d}"
        store.create_session(sid, HOT_POLICY, system=system)
        messages: list[Any] = [encode_message(task)]
        for t in range(HOT_TURNS):
            messages += _renamed(turns[(n * 37 + t) % len(turns)], f"h{n}-{t}")
        store.append(sid, messages)
        sids.append(sid)
    return sids


# --- operations ----------------------------------------------------------------------------------

def _hand_fold(items: Sequence[WindowItem], turns: int = FOLD_TURNS) -> FoldResult | None:
    """The first ``turns`` turns after the task (or after a leading summary) as one summary."""
    start = 1
    stop = start + 2 * turns + (1 if items[start].kind == "summary" else 0)
    while stop < len(items) and items[stop].message.has_tool_results():
        stop += 1
    if stop >= len(items) - 4:
        return None
    replaced = tuple(items[start:stop])
    first, last = replaced[0].start_seq, replaced[-1].end_seq
    message = summary_message(
        "The agent inspected the repository and ran the failing tests; see the ledger.",
        start_seq=first, end_seq=last, message_count=last - first + 1, model="bench")
    summary = WindowItem(start_seq=first, end_seq=last, kind="summary", message=message)
    span = FoldedSpan(start_seq=first, end_seq=last, message_count=last - first + 1,
                      fingerprint=fingerprint([i.message for i in replaced]), model="bench")
    record = CompactionRecord(trigger="threshold", outcome="folded", budget_tokens=1_000_000,
                              target_tokens=600_000, measured_tokens=900_000,
                              tokens_after=800_000, folded=((first, last),))
    window = [items[0], summary, *items[stop:]]
    return FoldResult(window, FoldEdit(replaced=replaced, inserted=(summary,)), record, [span])


def _fold(store: SessionStore, sid: str, job: str,
          timed: Callable[[Callable[[], Any]], float] | None = None) -> float | None:
    claim = store.claim(sid, job, lease_s=600)
    if not claim.claimed:
        return None
    result = _hand_fold(store.read_window(sid).items)
    if result is None:
        store.record_visit(sid, CompactionRecord(
            trigger="threshold", outcome="nothing-to-fold", budget_tokens=1, target_tokens=0,
            measured_tokens=0, tokens_after=0), job_id=job, epoch=claim.epoch,
            incarnation=claim.incarnation)
        return None
    commit = lambda: store.commit_fold(sid, result, epoch=claim.epoch,  # noqa: E731
                                       incarnation=claim.incarnation, job_id=job)
    if timed is None:
        commit()
        return None
    return timed(commit)


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


@dataclass
class Stats:
    samples: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        s = sorted(self.samples)
        if not s:
            return {"n": 0}
        return {"n": len(s), "p50": statistics.median(s),
                "p99": s[min(len(s) - 1, round(0.99 * (len(s) - 1)))], "mean": statistics.fmean(s),
                "max": s[-1]}


# --- writers (separate processes: the reader's numbers must not measure the GIL) -------------

def _writer(url: str, fillers: list[str], hot: list[str], seed: int, stop: Any,
            counts: Any) -> None:
    rng = random.Random(seed)
    _, _, turns = _corpus()
    store = SessionStore.from_url(url)
    store.get_session(fillers[0])  # connected, schema checked: ready
    counts.put("ready")
    appends = folds = 0
    try:
        while not stop.is_set():
            if rng.random() < 0.15:
                sid = rng.choice(fillers)
                _fold(store, sid, f"w{seed}-{folds}-{uuid.uuid4().hex[:6]}")
                folds += 1
            else:
                sid = rng.choice(hot) if rng.random() < 0.1 else rng.choice(fillers)
                tag = f"w{seed}-{appends}"
                store.append(sid, _renamed(turns[rng.randrange(len(turns))], tag), key=tag)
                appends += 1
    finally:
        counts.put((appends, folds))
        store.close()


# --- one run -------------------------------------------------------------------------------------

def run_size(backend: str, rows: int, n_sessions: int, args: argparse.Namespace,
             corpus: tuple[str, Message, list[tuple[Message, Message]]],
             under_load: bool) -> dict[str, Any]:
    system, task, turns = corpus
    rng = random.Random(rows)
    rows_each = max(5, rows // n_sessions)
    out: dict[str, Any] = {"backend": backend, "ledger rows": 0, "sessions": n_sessions}
    with _database(backend, args.postgres_url, args.keep) as url:
        store = SessionStore.from_url(url)
        store.migrate()
        t0 = time.perf_counter()
        hot = _load_hot(store, args.hot, system, task, turns)
        fillers = _load_fillers(store, n_sessions - args.hot, rows_each, system, task, turns,
                                rng)
        with store.engine.connect() as conn:
            if backend == "postgres":
                conn.exec_driver_sql("ANALYZE")
            out["ledger rows"] = conn.execute(
                sa.select(sa.func.count()).select_from(ledger)).scalar_one()
        out["setup s"] = time.perf_counter() - t0
        out["window items"] = len(store.read_window(hot[0]).items)

        cold = SessionStore(store.engine, item_cache=0)  # decodes every item of every read
        reads, warm, appends, commits = Stats(), Stats(), Stats(), Stats()
        for sid in hot:  # warm the pool and the cache the way a running app server has them
            store.read_window(sid)
            cold.read_window(sid)
        for _ in range(args.samples):
            sid = rng.choice(hot)
            reads.samples.append(_timed(lambda sid=sid: cold.read_window(sid)))
            warm.samples.append(_timed(lambda sid=sid: store.read_window(sid)))
        # The same decoded reads with the collector as sessionfold's processes set it
        # (start-up frozen, young threshold raised), then put back for what follows.
        settled = Stats()
        threshold = gc.get_threshold()
        freeze_startup_objects()
        try:
            for _ in range(args.samples):
                sid = rng.choice(hot)
                settled.samples.append(_timed(lambda sid=sid: cold.read_window(sid)))
        finally:
            gc.unfreeze()
            gc.set_threshold(*threshold)
        out["read alone, settled gc"] = settled.summary()
        for i in range(args.samples):
            sid = rng.choice(fillers)
            turn = _renamed(turns[rng.randrange(len(turns))], f"b{i}")
            appends.samples.append(_timed(lambda sid=sid, turn=turn, i=i:
                                          store.append(sid, turn, key=f"bench-{i}")))
        order = rng.sample(fillers, len(fillers))
        for i in range(4 * args.samples):  # each filler folds a few times, ten turns at a time
            if len(commits.samples) >= args.samples:
                break
            took = _fold(store, order[i % len(order)], f"bench-fold-{i}", timed=_timed)
            if took is not None:
                commits.samples.append(took)
        out["read alone"] = reads.summary()
        out["read alone, cached"] = warm.summary()
        out["append"] = appends.summary()
        out["fold commit"] = commits.summary()

        if under_load:
            ctx = mp.get_context("spawn")
            stop, counts = ctx.Event(), ctx.Queue()
            procs = [ctx.Process(target=_writer, args=(url, fillers, hot, seed, stop, counts))
                     for seed in range(args.writers)]
            for p in procs:
                p.start()
            for _ in procs:
                assert counts.get(timeout=300) == "ready"
            time.sleep(args.warmup)  # let the writers get going
            loaded, loaded_warm = Stats(), Stats()
            start = time.perf_counter()
            sizes = []
            for _ in range(args.samples):
                sid = rng.choice(hot)
                loaded.samples.append(_timed(lambda sid=sid: sizes.append(
                    len(cold.read_window(sid).items))))
                loaded_warm.samples.append(_timed(lambda sid=sid: store.read_window(sid)))
            elapsed = time.perf_counter() - start
            stop.set()
            done = [counts.get(timeout=120) for _ in procs]
            for p in procs:
                p.join(timeout=60)
            out["read under load"] = loaded.summary()
            out["read under load, cached"] = loaded_warm.summary()
            out["writers"] = args.writers
            out["writer appends/s"] = sum(a for a, _ in done) / (elapsed + args.warmup)
            out["writer folds/s"] = sum(f for _, f in done) / (elapsed + args.warmup)
            out["window items under load"] = statistics.fmean(sizes) if sizes else 0
        cold.close()
        store.close()
    return out


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    def cell(d: dict[str, float] | None, key: str) -> str:
        return f"{d[key]:.2f}" if d and key in d else "–"

    def pair(r: dict[str, Any], name: str) -> str:
        d = r.get(name)
        return f"{cell(d, 'p50')} / **{cell(d, 'p99')}**"

    lines = [
        "## Session store latencies (issue 3)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs shared with other work (load "
        f"average {args.load_before:.1f} before, {os.getloadavg()[0]:.1f} after), Python "
        f"{platform.python_version()}, SQLAlchemy {sa.__version__}. Milliseconds, p50 / p99, "
        f"{args.samples} samples per cell. A read is the SQL round trip plus decoding into "
        "messages: *decoded* with the item cache off (every item decoded, every read), "
        "*cached* with the store's default item cache (only items new since this process last "
        "read the session are fetched and decoded); *settled gc* is the decoded read with the "
        "garbage collector as `sessionfold serve`, the workers and the scheduler set it "
        "(`runtime.collector.freeze_startup_objects`: start-up objects frozen, young-generation "
        "threshold 10,000), measured in the same process right after the default one.",
        "",
        "| backend | ledger rows | sessions | window items | read, decoded | read, decoded, "
        "settled gc | read, cached | append (one turn) | fold commit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['backend']} | {r['ledger rows']:,} | {r['sessions']:,} | {r['window items']} "
            f"| {pair(r, 'read alone')} | {pair(r, 'read alone, settled gc')} "
            f"| {pair(r, 'read alone, cached')} "
            f"| {pair(r, 'append')} | {pair(r, 'fold commit')} |")
    loaded = [r for r in results if "read under load" in r]
    if loaded:
        lines += [
            "",
            f"Reads while {loaded[0]['writers']} writer processes append and fold:",
            "",
            "| backend | ledger rows | read, decoded | read, cached | window items (mean) | "
            "writer appends/s | writer fold attempts/s |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in loaded:
            lines.append(
                f"| {r['backend']} | {r['ledger rows']:,} | {pair(r, 'read under load')} "
                f"| {pair(r, 'read under load, cached')} | {r['window items under load']:.0f} "
                f"| {r['writer appends/s']:.0f} | {r['writer folds/s']:.1f} |")
    lines += ["", "Goals:", ""]
    for backend in dict.fromkeys(r["backend"] for r in results):
        rs = [r for r in results if r["backend"] == backend]
        big = max(rs, key=lambda r: r["ledger rows"])
        small = min(rs, key=lambda r: r["ledger rows"])
        cold = big["read alone"].get("p99", float("nan"))
        warm = big["read alone, cached"].get("p99", float("nan"))
        settled = big.get("read alone, settled gc", {}).get("p99", float("nan"))
        lines.append(
            f"- {backend}, read p99 alone at {big['ledger rows']:,} rows (goal < 5 ms): "
            f"{warm:.2f} ms cached ({'met' if warm < 5 else 'NOT met'}), {cold:.2f} ms decoding "
            f"every item ({'met' if cold < 5 else 'NOT met'}); decoding every item with the "
            f"collector settled (issue 14's goal < 10 ms): {settled:.2f} ms "
            f"({'met' if settled < 10 else 'NOT met'}).")
        if big is not small:
            a, b = small["fold commit"].get("p50", 0), big["fold commit"].get("p50", 0)
            ratio = b / a if a else float("nan")
            lines.append(
                f"- {backend}, fold commit p50 (goal: the same within 20 %): {a:.2f} ms at "
                f"{small['ledger rows']:,} rows, {b:.2f} ms at {big['ledger rows']:,} rows, "
                f"×{ratio:.2f} ({'met' if abs(ratio - 1) <= 0.2 else 'NOT met'}).")
    lines += ["", "Setup (not timed): " + ", ".join(
        f"{r['backend']} {r['ledger rows']:,} rows {r['setup s']:.0f} s" for r in results) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rows", type=int, default=1_000_000, help="ledger rows (large size)")
    parser.add_argument("--small-rows", type=int, default=10_000,
                        help="ledger rows of the small size (fold commit comparison)")
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--hot", type=int, default=20, help="sessions with 301-item windows")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="seconds the writers run before reads are timed under load")
    parser.add_argument("--postgres-url", default=os.environ.get("SF_TEST_POSTGRES_URL",
                                                                 DEFAULT_ADMIN_URL))
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL databases")
    parser.add_argument("--quick", action="store_true",
                        help="20,000 rows over 200 sessions (small size 2,000 over 20), "
                             "200 samples: a smoke run of a minute or two")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.sessions, args.small_rows = 20_000, 200, 2_000
        args.samples, args.hot, args.warmup = 200, 5, 2.0
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    args.load_before = os.getloadavg()[0]
    corpus = _corpus()
    results = []
    for backend in backends:
        small_sessions = max(args.hot + 5, args.sessions * args.small_rows // args.rows)
        results.append(run_size(backend, args.small_rows, small_sessions, args, corpus,
                                under_load=False))
        results.append(run_size(backend, args.rows, args.sessions, args, corpus,
                                under_load=True))
        print(json.dumps(results[-2:], indent=1, default=str), file=sys.stderr)
    text = report(results, args)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
