"""What the search index costs, measured on the shipped transcripts (printed, never asserted).

Run with ``-s`` to see the figures: per backend, the append latency of a typical message and of
the 868 K-character tool output with and without its index rows (an append with
``recall=True`` writes the same rows but no index rows), the time each append's write
transaction is held open (on SQLite the database's write lock), search latency p50/p99 over
identifier queries on the seven transcript sessions, and the index's size on disk.

Only correctness is asserted (the searches find what they look for): the machine is shared.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.searchtext import searchable_text
from sessionfold.store import SessionStore
from sessionfold.store.engine import WRITE_OPTION
from store_helpers import transcript, transcript_names

POLICY = FoldPolicy(budget_tokens=32_000)
BIG = "psf__requests-1142"  # its last message is the 868 K-character tool output
_WORD = re.compile(r"[A-Za-z_][\w.]*[A-Za-z0-9_]")


@dataclass
class WriteTimer:
    """How long each write transaction stays open, from its BEGIN (IMMEDIATE on SQLite: the
    write lock is held from there) to its COMMIT."""

    held: list[float] = field(default_factory=list)
    _started: dict[int, float] = field(default_factory=dict)

    def attach(self, engine: sa.Engine) -> None:
        sa.event.listen(engine, "begin", self._begin)
        sa.event.listen(engine, "commit", self._end)

    def _begin(self, conn: sa.Connection) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            self._started[id(conn)] = time.perf_counter()

    def _end(self, conn: sa.Connection) -> None:
        started = self._started.pop(id(conn), None)
        if started is not None:
            self.held.append(time.perf_counter() - started)

    def take(self) -> list[float]:
        taken, self.held = self.held, []
        return taken


def _ms(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return (f"p50 {statistics.median(ms):.2f} ms, p99 {p99:.2f} ms, max {ms[-1]:.2f} ms "
            f"(n={len(ms)})")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_store(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('figures') / 'store.db'}"
    else:
        url = request.getfixturevalue("postgres").create()
    store = SessionStore.from_url(url)
    store.migrate()
    yield store
    store.close()


def _append_all(store: SessionStore, sid: str, messages: list[Message], timer: WriteTimer,
                *, recall: bool) -> tuple[list[float], list[float]]:
    """Per-message append latency and write-transaction time, the biggest message excluded."""
    latency: list[float] = []
    held: list[float] = []
    for message in messages:
        started = time.perf_counter()
        store.append(sid, [message], recall=recall)
        elapsed = time.perf_counter() - started
        took = timer.take()
        if len(searchable_text(message)) < 100_000:
            latency.append(elapsed)
            held.extend(took)
    return latency, held


def _big_append(store: SessionStore, sid: str, messages: list[Message], timer: WriteTimer,
                *, recall: bool) -> tuple[float, float]:
    store.create_session(sid, POLICY)
    store.append(sid, messages[:-1], recall=recall)
    timer.take()
    started = time.perf_counter()
    store.append(sid, messages[-1:], recall=recall)
    elapsed = time.perf_counter() - started
    return elapsed, sum(timer.take())


def _queries(store: SessionStore, sid: str) -> list[str]:
    """Identifiers of the session (its most frequent dotted names and paths) and their parts."""
    text = "\n".join(searchable_text(e.message) for e in store.read_ledger(sid) if e.message)
    counts = Counter(w for w in _WORD.findall(text) if "." in w or "_" in w)
    found = [w for w, _ in counts.most_common(15)]
    return found + [w.rsplit(".", 1)[-1] for w in found if "." in w]


def _sizes(store: SessionStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            rows = dict(conn.exec_driver_sql(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").all())
            fts = sum(v for k, v in rows.items() if str(k).startswith("ledger_chunks_fts"))
            return {"ledger": rows.get("ledger", 0),
                    "ledger_chunks (text + index_text)": rows.get("ledger_chunks", 0),
                    "its unique index": sum(v for k, v in rows.items()
                                            if str(k).startswith("sqlite_autoindex_ledger_chunks")),
                    "FTS5 index": fts}
        one = conn.exec_driver_sql(
            "SELECT pg_table_size('ledger'), pg_table_size('ledger_chunks'), "
            "pg_relation_size('uq_ledger_chunks_position'), "
            "pg_relation_size('ix_ledger_chunks_tsv')").one()
        return {"ledger": one[0], "ledger_chunks (text, index_text, tsv; TOAST incl.)": one[1],
                "its unique index": one[2], "GIN index": one[3]}


def test_figures_of_the_search_index(empty_store: SessionStore) -> None:
    store = empty_store
    timer = WriteTimer()
    timer.attach(store.engine)
    name = store.engine.dialect.name
    lines = [f"\n--- search index figures on {name} ---"]

    indexed_latency: list[float] = []
    indexed_held: list[float] = []
    for sid in transcript_names():
        system, messages = transcript(sid)
        store.create_session(sid, POLICY, system=system)
        latency, held = _append_all(store, sid, messages, timer, recall=False)
        indexed_latency += latency
        indexed_held += held
    ledger_chars = sum(len(searchable_text(m)) for sid in transcript_names()
                       for m in transcript(sid)[1])
    lines.append(f"sizes with the 7 transcripts indexed ({ledger_chars / 1e6:.2f} M searchable "
                 "characters):")
    lines += [f"  {what}: {size / 1e6:.2f} MB" for what, size in _sizes(store).items()]

    latencies: list[float] = []
    for sid in transcript_names():
        for query in _queries(store, sid):
            started = time.perf_counter()
            hits = store.search(sid, query, limit=20)
            latencies.append(time.perf_counter() - started)
            assert hits, (sid, query)
    lines.append(f"search, limit 20, {len(latencies)} identifier queries over the 7 sessions: "
                 f"{_ms(latencies)}")

    plain_latency: list[float] = []
    plain_held: list[float] = []
    for sid in transcript_names():
        _, messages = transcript(sid)
        store.create_session(f"plain-{sid}", POLICY)
        latency, held = _append_all(store, f"plain-{sid}", messages, timer, recall=True)
        plain_latency += latency
        plain_held += held
    lines.append(f"append one message, indexed:      {_ms(indexed_latency)}")
    lines.append(f"  write transaction held:          {_ms(indexed_held)}")
    lines.append(f"append one message, not indexed:  {_ms(plain_latency)}")
    lines.append(f"  write transaction held:          {_ms(plain_held)}")

    _, messages = transcript(BIG)
    assert len(searchable_text(messages[-1])) > 800_000
    for round_ in range(3):
        total, held = _big_append(store, f"big-{round_}", messages, timer, recall=False)
        plain_total, plain_held_s = _big_append(store, f"big-plain-{round_}", messages, timer,
                                                recall=True)
        lines.append(f"append the 868 K output: indexed {total * 1000:.0f} ms (write tx held "
                     f"{held * 1000:.0f} ms), not indexed {plain_total * 1000:.0f} ms "
                     f"(held {plain_held_s * 1000:.0f} ms)")
    print("\n".join(lines))
