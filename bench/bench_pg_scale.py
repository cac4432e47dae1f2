"""Benchmark: the session store on PostgreSQL at fleet size (issue 14), loaded with COPY.

A one-off, not CI: the issue guessed ~18 GB at 10 M ledger rows with every ledger row also a
window item; with folded windows (below) a 200 k-row run measured ~1.1 kB a row, ~11 GB at
10 M (the run prints its own projection before loading the large size). In one run,
on a fresh database migrated by the store's own migration (``sf_pgscale_<random>`` on the
server of ``--database-url``, dropped afterwards unless ``--keep``):

1. **small size**: ``--small-rows`` ledger rows are bulk-loaded (psycopg ``COPY``) into filler
   sessions, ``VACUUM (ANALYZE)``, then every operation below is timed;
2. **large size**: the rest of ``--rows`` is loaded into more filler sessions of the same shape,
   ``VACUUM (ANALYZE)``, and the same operations are timed again. The per-session shape never
   changes between the two, so a difference is the tables' size (index depth, buffer cache),
   which the issue wants to be flat.

Filler sessions are what a fleet holds after weeks: a ledger of ``--rows / --sessions`` rows
(the task, then whole assistant/tool-result turns of real agent runs from
tests/data/transcripts, with fresh tool ids per session), and a *folded* window — the task, one
summary item standing for everything but the last ``--window-items`` ledger rows, then those rows
as items. Their messages, token counts and window items are the store's own: each transcript is
first appended through ``SessionStore.append`` (validated, counted, oversized outputs clipped) and
its rows are copied from there. The session rows are clones of one made by
``SessionStore.create_session``, with the sizes the loaded rows add up to.

Timed, each through the public ``SessionStore`` API, on sessions picked at random:

- ``append``: one whole turn (assistant tool call + its tool result), keyed, to a filler;
- ``read, decoded``: ``read_window`` of a 301-item window with the item cache off (every item
  decoded), on ``--hot`` sessions made by ``append``; ``read, cached``: the same with the
  default item cache (warm); ``read, decoded, any session``: a filler's window (about
  ``--window-items`` items) with the cache off — reads spread over the whole table, so at the
  large size they also measure what the buffer cache does not hold;
- ``usage report``: ``record_usage`` of one report; ``usage batch``: ``record_usage_batch`` of
  ``--batch`` reports to as many sessions (the scheduler's write; at most as many as the small
  size has sessions, the same at both sizes);
- ``fold commit``: ``commit_fold`` of a fold planned on a filler loaded at that size (claim,
  read and plan made before the clock starts: the offline summarizer, summarize layer only,
  down to 60 % of the window: a rolling summary replaces the old one and the oldest turns).

Latency is wall time per call (ms: p50, p90, p99, mean); the client's CPU per call is reported
beside it. Disk: each table's total size (heap, TOAST, indexes) and bytes per ledger row, and
the projection to 10 M rows. Before each load the free space of the server's data directory is
checked against the projected size plus ``--min-free-gb``: the run stops rather than fill the
disk (check ``df -h`` first all the same).

Usage (from the repository root)::

    .venv/bin/python bench/bench_pg_scale.py --rows 200000 --sessions 200 --small-rows 50000
    .venv/bin/python bench/bench_pg_scale.py                   # the issue's 10 M rows
    .venv/bin/python bench/bench_pg_scale.py --rows 10000000 --sessions 10000 --keep \\
        --out bench/out/pg-scale.json

Only ``sessionfold.store``'s public ``SessionStore`` API and ``sessionfold.core``'s top-level
names are used (the store's modules may be renamed); the SQL that loads rows names the tables of
the store's schema (ledger, window_items, sessions). No span rows are loaded for the fillers'
summaries (no timed operation reads them); tables a later schema adds stay empty for the
fillers, and the JSON output lists every table's rows and bytes so that shows.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import os
import platform
import random
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sessionfold.core import (
    ExtractiveSummarizer,
    FoldPolicy,
    FoldVisit,
    default_counter,
    fold_window,
    summary_message,
)
from sessionfold.store import SessionStore, UsageReport

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
#: The transcripts bench_store.py draws from (not the 868 K-character run: atypical).
SOURCES = ("django__django-16560", "sphinx-doc__sphinx-9229", "sympy__sympy-13091",
           "pylint-dev__pylint-6528", "pytest-dev__pytest-7490", "django__django-15554")
HOT_TURNS = 150
FILLER_POLICY = FoldPolicy(budget_tokens=1_000_000)
HOT_POLICY = FoldPolicy(budget_tokens=400_000)
TEMPLATE_POLICY = FoldPolicy(budget_tokens=200_000)
FOLD_POLICY = FoldPolicy(budget_tokens=1_000_000, layers=("summarize",))
GB = 1024 ** 3


# --- the corpus: real turns, stored by the store itself ----------------------------------------


@dataclass(frozen=True)
class Row:
    """One message as the store keeps it: ledger text, window item text/edits, token counts,
    and both texts escaped for COPY once (the loader writes them millions of times; tool ids,
    renamed per session in the escaped text, hold nothing COPY escapes)."""

    ledger_json: str
    ledger_tokens: int
    item_json: str
    item_edits: str
    item_tokens: int
    copy_ledger: str
    copy_item: str

    @classmethod
    def stored(cls, ledger_json: str, ledger_tokens: int, item_json: str, item_edits: str,
               item_tokens: int) -> Row:
        return cls(ledger_json, ledger_tokens, item_json, item_edits, item_tokens,
                   _copy_text(ledger_json), _copy_text(item_json))


@dataclass(frozen=True)
class Turn:
    call: Row
    result: Row
    tool_ids: tuple[str, ...]


@dataclass
class Corpus:
    system: str
    task: Row
    turns: list[Turn]
    system_tokens: int


def _tool_ids(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b["id"] for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def _has_results(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def build_corpus(store: SessionStore) -> Corpus:
    """Append each transcript through the store, then read back what it stored (and delete it)."""
    system = ""
    task: Row | None = None
    turns: list[Turn] = []
    for name in SOURCES:
        data = json.loads((TRANSCRIPTS / f"{name}.json").read_text())
        system = system or data.get("system", "")
        sid = f"pgscale-template-{name}"
        store.create_session(sid, TEMPLATE_POLICY, system=data.get("system", ""))
        store.append(sid, data["messages"])
        with store.engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT l.seq, CAST(l.message AS TEXT), l.tokens, CAST(w.message AS TEXT), "
                "CAST(w.edits AS TEXT), w.tokens FROM ledger l JOIN window_items w "
                "ON w.session_id = l.session_id AND w.start_seq = l.seq "
                "WHERE l.session_id = :sid ORDER BY l.seq"), {"sid": sid}).all()
        store.delete_session(sid)
        stored = [Row.stored(r[1], r[2], r[3], r[4], r[5]) for r in rows]
        raw = [json.loads(r.ledger_json) for r in stored]
        task = task or stored[0]
        for i in range(1, len(raw) - 1):
            ids = _tool_ids(raw[i])
            if raw[i]["role"] == "assistant" and ids and _has_results(raw[i + 1]):
                turns.append(Turn(stored[i], stored[i + 1], tuple(ids)))
    assert task is not None and turns, "the transcripts held no tool turns"
    return Corpus(system=system, task=task, turns=turns,
                  system_tokens=default_counter().system(system))


def _renamed(text: str, ids: Sequence[str], tag: str) -> str:
    """``text`` with each tool id made unique to ``tag`` (ids are unique within a session)."""
    for tool_id in ids:
        text = text.replace(f'"{tool_id}"', f'"{tool_id[:40]}-{tag}"')
    return text


def turn_messages(turn: Turn, tag: str) -> list[dict[str, Any]]:
    """A turn as message dicts with fresh tool ids, for ``SessionStore.append``."""
    return [json.loads(_renamed(turn.call.ledger_json, turn.tool_ids, tag)),
            json.loads(_renamed(turn.result.ledger_json, turn.tool_ids, tag))]


# --- databases ----------------------------------------------------------------------------------


@contextmanager
def fresh_database(admin_url: str, keep: bool) -> Iterator[str]:
    admin = sa.create_engine(sa.make_url(admin_url).set(drivername="postgresql+psycopg"),
                             isolation_level="AUTOCOMMIT", pool_size=1)
    name = f"sf_pgscale_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    print(f"database {name} on {admin.url.render_as_string(hide_password=True)}", file=sys.stderr)
    try:
        yield url
    finally:
        if keep:
            print(f"kept database {name}", file=sys.stderr)
        else:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _copy_text(value: str) -> str:
    """A value in COPY's text format (JSON text has no raw tabs or newlines, only backslashes)."""
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n") \
        .replace("\r", "\\r")


def _copy(store: SessionStore, statement: str, lines: Iterator[str]) -> None:
    """Stream ``lines`` (COPY text format) into ``statement`` in one transaction."""
    with store.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cursor, cursor.copy(statement) as copy:
            buffer = io.StringIO()
            for line in lines:
                buffer.write(line)
                if buffer.tell() > 4 << 20:
                    copy.write(buffer.getvalue())
                    buffer = io.StringIO()
            copy.write(buffer.getvalue())
        raw.commit()  # the driver's own transaction: SQLAlchemy did not begin one here


def _maintain(store: SessionStore) -> float:
    """VACUUM (ANALYZE) the loaded tables: statistics, visibility map and hint bits set, as a
    database that has been running a while has them. Returns its seconds."""
    start = time.perf_counter()
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in ("ledger", "window_items", "sessions", "folds"):
            conn.exec_driver_sql(f"VACUUM (ANALYZE) {table}")
    return time.perf_counter() - start


def table_sizes(store: SessionStore) -> dict[str, int]:
    """Bytes per table (heap, TOAST and indexes) and for the whole database."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')")).all()
        sizes = {name: int(size) for name, size in rows}
        sizes["(database)"] = int(conn.execute(sa.text(
            "SELECT pg_database_size(current_database())")).scalar_one())
    return sizes


def row_counts(store: SessionStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        tables = [r[0] for r in conn.execute(sa.text(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")).all()]
        return {t: int(conn.execute(sa.text(f'SELECT count(*) FROM "{t}"')).scalar_one())
                for t in sorted(tables)}


def data_directory_free(store: SessionStore) -> int | None:
    """Free bytes where the server keeps its data, when that folder is on this machine."""
    try:
        with store.engine.connect() as conn:
            folder = str(conn.execute(sa.text("SHOW data_directory")).scalar_one())
        return shutil.disk_usage(folder).free
    except Exception:  # not a superuser, or the server is elsewhere
        return None


def check_room(store: SessionStore, rows: int, bytes_per_row: float, min_free_gb: float) -> None:
    """Stop before a load that would leave less than ``min_free_gb`` free on the server's disk."""
    free = data_directory_free(store)
    if free is None:
        free = shutil.disk_usage("/").free
        where = "/ (the server's data directory is not readable here)"
    else:
        where = "the server's data directory"
    need = rows * bytes_per_row
    if free - need < min_free_gb * GB:
        raise SystemExit(
            f"refusing to load {rows:,} rows (~{need / GB:.1f} GB at {bytes_per_row:.0f} B a "
            f"ledger row): {where} has {free / GB:.1f} GB free and --min-free-gb is "
            f"{min_free_gb:g}")


# --- filler sessions -----------------------------------------------------------------------------


@dataclass
class Fillers:
    """Filler sessions loaded so far, by load phase."""

    rows_each: int
    window_items: int
    ids: list[list[str]] = field(default_factory=list)
    loaded_rows: int = 0

    def all(self) -> list[str]:
        return [sid for phase in self.ids for sid in phase]


def _summary(start: int, end: int, cache: dict[tuple[int, int], tuple[str, int]]
             ) -> tuple[str, int]:
    """The stored JSON and token count of a summary item standing for ledger ``start..end``."""
    if (start, end) not in cache:
        message = summary_message(
            "The agent explored the repository, reproduced the failure and tried fixes; the "
            "originals are in the ledger.", start_seq=start, end_seq=end,
            message_count=end - start + 1, model="bench")
        cache[(start, end)] = (json.dumps(message.to_json(), ensure_ascii=False,
                                          separators=(",", ":")),
                               default_counter().message(message))
    return cache[(start, end)]


def load_fillers(store: SessionStore, corpus: Corpus, fillers: Fillers, count: int,
                 rng: random.Random) -> float:
    """Add ``count`` filler sessions (rows by COPY); returns the seconds it took."""
    start = time.perf_counter()
    first = len(fillers.all())
    ids = [f"filler-{n:07d}" for n in range(first, first + count)]
    _clone_sessions(store, ids, corpus.system, rng)
    now = datetime.now(UTC).isoformat()
    shapes: dict[str, tuple[int, int, str]] = {}  # sid -> next_seq, window tokens, tail ids
    summaries: dict[tuple[int, int], tuple[str, int]] = {}
    # One seed per session, not its rows: at 10 M rows the plans would not fit in memory, and
    # both COPY streams rebuild the same rows from the seed.
    seeds = {sid: rng.getrandbits(64) for sid in ids}

    def plans() -> Iterator[tuple[str, list[tuple[Row, tuple[str, ...]]]]]:
        for sid, seed in seeds.items():
            yield sid, _plan(corpus, fillers.rows_each, random.Random(seed))

    def ledger_lines() -> Iterator[str]:
        for sid, picked in plans():
            for seq, (row, tool_ids) in enumerate(picked):
                text = _renamed(row.copy_ledger, tool_ids, _turn_tag(seq))
                yield f"{sid}\t{seq}\t{text}\t{row.ledger_tokens}\t{now}\t\\N\n"

    def window_lines() -> Iterator[str]:
        for sid, picked in plans():
            rows = len(picked)
            tail = min(fillers.window_items, rows - 1)
            tail -= tail % 2  # whole turns
            fold_end = rows - tail - 1  # summary covers 1..fold_end
            task = picked[0][0]
            yield (f"{sid}\t0\t0\tmessage\t1\t{task.item_tokens}\t"
                   f"{_copy_text(task.item_edits)}\t{task.copy_item}\n")
            tokens = task.item_tokens
            if fold_end >= 1:
                text, n_tokens = _summary(1, fold_end, summaries)
                tokens += n_tokens
                yield f"{sid}\t1\t{fold_end}\tsummary\t1\t{n_tokens}\t[]\t{_copy_text(text)}\n"
            for seq in range(fold_end + 1, rows):
                row, tool_ids = picked[seq]
                text = _renamed(row.copy_item, tool_ids, _turn_tag(seq))
                tokens += row.item_tokens
                yield (f"{sid}\t{seq}\t{seq}\tmessage\t1\t{row.item_tokens}\t"
                       f"{_copy_text(row.item_edits)}\t{text}\n")
            shapes[sid] = (rows, tokens, "[]")

    _copy(store, "COPY ledger (session_id, seq, message, tokens, appended_at, discarded_at) "
                 "FROM STDIN", ledger_lines())
    _copy(store, "COPY window_items (session_id, start_seq, end_seq, kind, version, tokens, "
                 "edits, message) FROM STDIN", window_lines())
    _update_sessions(store, corpus, shapes)
    fillers.ids.append(ids)
    fillers.loaded_rows += sum(next_seq for next_seq, _, _ in shapes.values())
    return time.perf_counter() - start


def _turn_tag(seq: int) -> str:
    """The tool-id suffix of the turn holding ledger ``seq`` (its call and result share it)."""
    return f"t{(seq - 1) // 2}"


def _plan(corpus: Corpus, rows_each: int, rng: random.Random
          ) -> list[tuple[Row, tuple[str, ...]]]:
    """A filler's ledger: the task, then whole turns drawn at random (with their tool ids)."""
    picked: list[tuple[Row, tuple[str, ...]]] = [(corpus.task, ())]
    for _ in range((rows_each - 1) // 2):
        turn = corpus.turns[rng.randrange(len(corpus.turns))]
        picked += [(turn.call, turn.tool_ids), (turn.result, turn.tool_ids)]
    return picked


def _clone_sessions(store: SessionStore, ids: list[str], system: str,
                    rng: random.Random) -> None:
    """Session rows for ``ids``: clones of one made by ``create_session`` (whatever columns the
    schema has), each with its own random incarnation."""
    template = f"pgscale-clone-{uuid.uuid4().hex[:8]}"
    store.create_session(template, FILLER_POLICY, system=system)
    with store.engine.begin() as conn:
        columns = [r[0] for r in conn.execute(sa.text(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'sessions' "
            "AND table_schema = current_schema() ORDER BY ordinal_position")).all()]
        override = {"id": "new.sid", "incarnation": "new.inc"}
        select = ", ".join(override.get(c, f"t.{c}") for c in columns)
        conn.execute(sa.text(
            f"INSERT INTO sessions ({', '.join(columns)}) SELECT {select} FROM sessions t, "
            "unnest(CAST(:sids AS text[]), CAST(:incs AS bigint[])) AS new(sid, inc) "
            "WHERE t.id = :template"),
            {"sids": ids, "incs": [rng.getrandbits(62) for _ in ids], "template": template})
    store.delete_session(template)


def _update_sessions(store: SessionStore, corpus: Corpus,
                     shapes: dict[str, tuple[int, int, str]]) -> None:
    """Give the cloned rows the sizes their loaded ledger and window add up to."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TEMP TABLE shapes (sid text, next_seq bigint, "
                             "window_tokens bigint, tail text) ON COMMIT DROP")
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cursor, cursor.copy("COPY shapes FROM STDIN") as copy:
            for sid, (next_seq, tokens, tail) in shapes.items():
                copy.write(f"{sid}\t{next_seq}\t{tokens}\t{tail}\n")
        conn.exec_driver_sql(
            "UPDATE sessions s SET next_seq = x.next_seq, revision = 1, fold_revision = 0, "
            "window_tokens = x.window_tokens, pending_tokens = 0, measured_tokens = NULL, "
            "measured_seq = NULL, measured_revision = NULL, "
            f"current_tokens = x.window_tokens + {corpus.system_tokens}, "
            "tail_tool_use_ids = CAST(x.tail AS json) FROM shapes x WHERE s.id = x.sid")


# --- hot sessions (made through the API) --------------------------------------------------------


def make_hot(store: SessionStore, corpus: Corpus, count: int, offset: int) -> list[str]:
    sids = []
    for n in range(offset, offset + count):
        sid = f"hot-{n:04d}"
        store.create_session(sid, HOT_POLICY, system=corpus.system)
        messages: list[dict[str, Any]] = [json.loads(corpus.task.ledger_json)]
        for t in range(HOT_TURNS):
            messages += turn_messages(corpus.turns[(n * 37 + t) % len(corpus.turns)],
                                      f"h{n}-{t}")
        store.append(sid, messages)
        sids.append(sid)
    return sids


# --- the footprint of rows appended through the API --------------------------------------------


def footprint(admin_url: str, sessions: int, keep: bool) -> dict[str, Any]:
    """Bytes of database per ledger row when every row comes through ``SessionStore.append``,
    in a fresh database of its own.

    The fillers are COPYed into the ledger and the window only, so their bytes per row leave out
    what an append also writes: the search chunks and their full-text index, the tool-use id
    rows and the append keys. Here ``sessions`` sessions each replay the corpus turn by turn,
    one keyed append a turn (an agent's call: its tool call and the result), then the tables
    are vacuumed and measured. Folds are not run (a fold's record and span are a few rows per
    fold, not per ledger row)."""
    with fresh_database(admin_url, keep) as url:
        store = SessionStore.from_url(url)
        store.migrate()
        corpus = build_corpus(store)
        start = time.perf_counter()
        appends = 0
        for n in range(sessions):
            sid = f"footprint-{n:04d}"
            store.create_session(sid, HOT_POLICY, system=corpus.system)
            store.append(sid, [json.loads(corpus.task.ledger_json)], key=f"{sid}-task")
            for t, turn in enumerate(corpus.turns):
                store.append(sid, turn_messages(turn, f"f{n}-{t}"), key=f"{sid}-{t}")
                appends += 1
        seconds = time.perf_counter() - start
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM (ANALYZE)")
        sizes, rows = table_sizes(store), row_counts(store)
        with store.engine.connect() as conn:
            version = str(conn.execute(sa.text("SHOW server_version")).scalar_one())
        store.close()
    ledger_rows = max(1, rows["ledger"])
    return {"postgres": version, "sessions": sessions, "appends": appends,
            "append_s": seconds, "rows": rows,
            "bytes": sizes, "bytes per ledger row": _store_bytes({"bytes": sizes}) / ledger_rows}


# --- timing --------------------------------------------------------------------------------------


@dataclass
class Samples:
    wall_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)

    def time(self, fn: Callable[[], Any]) -> Any:
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        self.wall_ms.append((time.perf_counter() - w0) * 1000)
        self.cpu_ms.append((time.process_time() - c0) * 1000)
        return out

    def summary(self) -> dict[str, float]:
        s = sorted(self.wall_ms)
        if not s:
            return {"n": 0}

        def q(p: float) -> float:
            return s[min(len(s) - 1, round(p * (len(s) - 1)))]
        return {"n": len(s), "p50": statistics.median(s), "p90": q(0.90), "p99": q(0.99),
                "mean": statistics.fmean(s), "max": s[-1],
                "client_cpu_mean": statistics.fmean(self.cpu_ms)}


def _discard(ops: dict[str, Samples]) -> dict[str, Samples]:
    """Throw-away samples for warm-up rounds."""
    return {name: Samples() for name in ops}


def _commit_kwargs(store: SessionStore, claim: Any) -> dict[str, Any]:
    """``incarnation=`` where the store's commit_fold takes it (later schemas name the claim's
    incarnation too)."""
    if "incarnation" in inspect.signature(store.commit_fold).parameters:
        return {"incarnation": claim.incarnation}
    return {}


def measure(store: SessionStore, corpus: Corpus, hot: list[str], fillers: list[str],
            fold_pool: list[str], args: argparse.Namespace, rng: random.Random,
            label: str) -> dict[str, Any]:
    """Every timed operation at the current size (see the module doc)."""
    cold = SessionStore(store.engine, item_cache=0)
    ops: dict[str, Samples] = {name: Samples() for name in (
        "append", "read, decoded", "read, cached", "read, decoded, any session",
        "usage report", "usage batch", "fold commit")}
    for sid in hot:  # a running app server has its pool and its cache warm
        store.read_window(sid)
        cold.read_window(sid)
    # The first --warmup rounds are not kept: the small size is measured first, and a cold
    # process (statement caches, pool, imports) must not count against it.
    for i in range(args.warmup + args.samples):
        rec = ops if i >= args.warmup else _discard(ops)
        sid = rng.choice(hot)
        rec["read, decoded"].time(partial(cold.read_window, sid))
        rec["read, cached"].time(partial(store.read_window, sid))
        rec["read, decoded, any session"].time(partial(cold.read_window, rng.choice(fillers)))
        target = rng.choice(fillers)
        tag = f"{label}-a{i}"
        messages = turn_messages(corpus.turns[rng.randrange(len(corpus.turns))], tag)
        rec["append"].time(partial(store.append, target, messages, key=tag))
        info = store.get_session(rng.choice(fillers))
        usage = {"input_tokens": max(1, info.current_tokens)}
        rec["usage report"].time(partial(store.record_usage, info.id, usage,
                                         seq=info.ledger_len - 1, revision=info.revision))
    for j in range(args.warmup // 10 + max(1, args.samples // 10)):
        rec = ops if j >= args.warmup // 10 else _discard(ops)
        infos = [store.get_session(s) for s in rng.sample(fillers, args.batch)]
        reports = [UsageReport(session_id=i.id, usage={"input_tokens": i.current_tokens},
                               seq=i.ledger_len - 1, revision=i.revision) for i in infos]
        rec["usage batch"].time(partial(store.record_usage_batch, reports))
    summarizer = ExtractiveSummarizer()
    for n in range(min(args.fold_samples + args.warmup // 10, len(fold_pool))):
        rec = ops if n >= args.warmup // 10 else _discard(ops)
        sid = fold_pool.pop()
        job = f"{label}-fold-{n}"
        claim = store.claim(sid, job, lease_s=600)
        if not claim.claimed:
            continue
        window = store.read_window(sid)
        info = store.get_session(sid)
        # Summarize only (no masking first), down by about a third, as a background fold from
        # the trigger (0.85) to the target (0.6) does.
        result = fold_window(window.items, FoldVisit(FOLD_POLICY, summarizer, system=window.system,
                             trigger="manual", force=True,
                             target_tokens=info.current_tokens * 6 // 10))
        if not result.changed:
            store.record_visit(sid, result.record, job_id=job, epoch=claim.epoch,
                               **_commit_kwargs(store, claim))
            continue
        rec["fold commit"].time(partial(store.commit_fold, sid, result, epoch=claim.epoch,
                                        job_id=job, **_commit_kwargs(store, claim)))
    return {name: s.summary() for name, s in ops.items()}


# --- one run -------------------------------------------------------------------------------------


def _phase(store: SessionStore, corpus: Corpus, fillers: Fillers, sessions: int,
           hot: list[str], args: argparse.Namespace, rng: random.Random,
           label: str) -> dict[str, Any]:
    load_s = load_fillers(store, corpus, fillers, sessions, rng)
    vacuum_s = _maintain(store)
    counts = row_counts(store)
    sizes = table_sizes(store)
    # Folds take sessions loaded in this phase (each is folded once); reads and appends pick
    # from every filler loaded so far.
    fold_pool = list(fillers.ids[-1])
    rng.shuffle(fold_pool)
    print(f"{label}: {counts['ledger']:,} ledger rows loaded in {load_s:.0f} s "
          f"(vacuum {vacuum_s:.0f} s); timing...", file=sys.stderr)
    ops = measure(store, corpus, hot, fillers.all(), fold_pool, args, rng, label)
    return {"label": label, "rows": counts, "bytes": sizes, "load_s": load_s,
            "vacuum_s": vacuum_s, "ops": ops}


def _store_bytes(phase: dict[str, Any]) -> int:
    return sum(b for t, b in phase["bytes"].items() if not t.startswith("("))


def _bytes_per_row(phases: list[dict[str, Any]]) -> float:
    """Disk per ledger row: what the last load added per row it added (the database's fixed
    overhead and the hot sessions left out), or the average when there was one load."""
    last = phases[-1]
    if len(phases) > 1:
        added = last["rows"]["ledger"] - phases[-2]["rows"]["ledger"]
        if added > 0:
            return (_store_bytes(last) - _store_bytes(phases[-2])) / float(added)
    return _store_bytes(last) / float(max(1, last["rows"]["ledger"]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    rows_each = max(5, args.rows // args.sessions)
    small_sessions = max(args.hot, round(args.sessions * args.small_rows / args.rows))
    out: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_before": os.getloadavg()[0]},
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "rows_each": rows_each,
    }
    # The same batch size at both sizes (the small size may hold fewer sessions than asked).
    args.batch = min(args.batch, small_sessions)
    out["usage batch size"] = args.batch
    with fresh_database(args.database_url, args.keep) as url:
        store = SessionStore.from_url(url)
        store.migrate()
        with store.engine.connect() as conn:
            out["postgres"] = str(conn.execute(sa.text("SHOW server_version")).scalar_one())
            out["shared_buffers"] = str(conn.execute(sa.text("SHOW shared_buffers")).scalar_one())
        corpus = build_corpus(store)
        fillers = Fillers(rows_each=rows_each, window_items=args.window_items)
        hot = make_hot(store, corpus, args.hot, 0)
        # A first guess of the disk a ledger row takes (window item, indexes, TOAST included);
        # the small phase measures it before the large load is checked.
        check_room(store, small_sessions * rows_each, 4000, args.min_free_gb)
        small = _phase(store, corpus, fillers, small_sessions, hot, args, rng, "small")
        phases = [small]
        rest = args.sessions - small_sessions
        if rest > 0:
            per_row = _bytes_per_row(phases)
            print(f"projected: {per_row:,.0f} B a ledger row, {per_row * rest * rows_each / GB:.1f}"
                  f" GB more for the large size", file=sys.stderr)
            check_room(store, rest * rows_each, per_row * 1.2, args.min_free_gb)
            phases.append(_phase(store, corpus, fillers, rest, hot, args, rng, "large"))
        out["phases"] = phases
        out["bytes per ledger row"] = _bytes_per_row(phases)
        out["projected GB at 10M ledger rows"] = _bytes_per_row(phases) * 10_000_000 / GB
        store.close()
    out["flat"] = _flatness(out["phases"])
    return out


def _flatness(phases: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Large-size latency over small-size latency, per operation (1.0 is flat)."""
    if len(phases) < 2:
        return {}
    small, large = phases[0]["ops"], phases[-1]["ops"]
    ratios = {}
    for name in small:
        a, b = small[name], large[name]
        if a.get("n") and b.get("n"):
            ratios[name] = {"p50": b["p50"] / a["p50"], "p99": b["p99"] / a["p99"]}
    return ratios


def report(result: dict[str, Any]) -> str:
    lines = [f"PostgreSQL {result['postgres']} (shared_buffers {result['shared_buffers']}), "
             f"{result['machine']['cpus']} CPUs, load {result['machine']['load_before']:.1f} "
             "before the run. Milliseconds, wall time per call: p50 / p99 (n).", ""]
    header = "| operation |" + "".join(
        f" {p['rows']['ledger']:,} rows, {p['rows']['window_items']:,} items |"
        for p in result["phases"]) + " large / small p50 |"
    lines += [header, "|---|" + "---:|" * (len(result["phases"]) + 1)]
    for name in result["phases"][0]["ops"]:
        cells = []
        for p in result["phases"]:
            s = p["ops"][name]
            cells.append(f" {s['p50']:.2f} / {s['p99']:.2f} ({s['n']}) |" if s.get("n")
                         else " – |")
        ratio = result["flat"].get(name, {}).get("p50")
        lines.append(f"| {name} |" + "".join(cells)
                     + (f" ×{ratio:.2f} |" if ratio is not None else " – |"))
    lines += ["", "Disk (heap + TOAST + indexes):", ""]
    for p in result["phases"]:
        sizes = ", ".join(f"{t} {b / 2**20:,.0f} MB" for t, b in sorted(
            p["bytes"].items(), key=lambda kv: -kv[1]) if b > 1 << 20)
        lines.append(f"- {p['label']}: {sizes}; load {p['load_s']:.0f} s, "
                     f"vacuum {p['vacuum_s']:.0f} s")
    lines.append(f"- {result['bytes per ledger row']:,.0f} bytes of database per ledger row: "
                 f"{result['projected GB at 10M ledger rows']:.1f} GB at 10 M rows.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000,
                        help="ledger rows at the large size")
    parser.add_argument("--sessions", type=int, default=10_000,
                        help="filler sessions at the large size (rows / sessions each)")
    parser.add_argument("--small-rows", type=int, default=100_000,
                        help="ledger rows at the small size (loaded first, same session shape)")
    parser.add_argument("--window-items", type=int, default=300,
                        help="ledger rows each filler keeps as window items (after a summary)")
    parser.add_argument("--hot", type=int, default=20, help="sessions with 301-item windows")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20,
                        help="untimed rounds of every operation before the timed ones")
    parser.add_argument("--fold-samples", type=int, default=100)
    parser.add_argument("--batch", type=int, default=500, help="reports per usage batch")
    parser.add_argument("--database-url", default=os.environ.get(
        "SF_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL),
        help="a database on the server to use; the run makes its own database beside it")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--min-free-gb", type=float, default=20.0,
                        help="never load past leaving this much free on the server's disk")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--footprint-sessions", type=int, default=10,
                        help="sessions appended through the API to measure what a ledger row "
                             "takes with everything an append writes (0: skip)")
    parser.add_argument("--footprint-only", action="store_true",
                        help="measure only that footprint (no fleet-size load)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here too")
    args = parser.parse_args(argv)
    if not 0 < args.small_rows <= args.rows or args.sessions < 1:
        parser.error("need 0 < --small-rows <= --rows and --sessions >= 1")
    if args.footprint_sessions < (1 if args.footprint_only else 0):
        parser.error("--footprint-sessions must be >= 0 (>= 1 with --footprint-only)")
    if args.footprint_only:
        result: dict[str, Any] = {"started": datetime.now(UTC).isoformat(timespec="seconds")}
    else:
        result = run(args)
    if args.footprint_sessions:
        result["footprint"] = footprint(args.database_url, args.footprint_sessions, args.keep)
        result.setdefault("postgres", result["footprint"]["postgres"])
    text = report(result) if "phases" in result else ""
    if "footprint" in result:
        f = result["footprint"]
        text += (f"Through the API ({f['sessions']} sessions, {f['appends']:,} keyed appends, "
                 f"{f['rows']['ledger']:,} ledger rows, {f['rows']['ledger_chunks']:,} search "
                 f"chunks): {f['bytes per ledger row']:,.0f} bytes of database per ledger row "
                 "(" + ", ".join(f"{t} {b / 2**20:,.1f} MB" for t, b in sorted(
                     f["bytes"].items(), key=lambda kv: -kv[1]) if b > 1 << 20) + ").\n")
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
