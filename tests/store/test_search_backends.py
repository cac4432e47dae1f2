"""The derived search text (``sessionfold.core.searchtext``) on the two real backends.

Nothing of the store is used: each backend gets a scratch index of its own -- SQLite an FTS5
table (external content, ``unicode61``), PostgreSQL a table whose ``tsvector`` column is
``to_tsvector('simple', index_text)`` with a GIN index, in a throwaway database -- holding every
message of the seven shared transcripts plus a few planted messages. Queries run as the store's
search will run them: the query's tiers in order (``SearchQuery.tiers``), each ranked by
``bm25`` / ``ts_rank_cd``.

Measurements (derivation time per transcript, index size per backend, query latency p50/p99)
are printed, never asserted: run with ``-s`` to see them.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessionfold.cli.files import load_conversation_file
from sessionfold.core import searchtext
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from sessionfold.core.searchtext import SearchChunk, SearchQuery, message_chunks, parse_query

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"
PLANTED = "planted"
ACCOUNT = "ACCT-90417"
#: Queries that FTS5 or ``to_tsquery`` would read as operators, column filters or prefixes if
#: given them as written; one planted message holds them all verbatim.
SYNTAX_QUERIES = ['ACCT-31337 AND "NEAR(" * col:quux', "index_text : foozle", "- NOT xyzzy",
                  "plugh OR", "((( frobnitz", "'''wibble'''", "\\'grault", "garply:waldo:fred",
                  "NEAR(thud corge, 2)", "^startle", "prefixo*"]


class Databases(Protocol):
    """The ``postgres`` fixture of tests/store/conftest.py: makes throwaway databases."""

    def create(self) -> str: ...


@dataclass(frozen=True)
class Row:
    transcript: str
    seq: int
    offset: int
    text: str
    index_text: str


@dataclass
class Corpus:
    rows: list[Row]
    derive_s: dict[str, float]
    chars: dict[str, int]
    planted: dict[str, int]  # what was planted -> its seq in the "planted" session
    lowered: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lowered = [r.text.lower() for r in self.rows]

    def holding(self, identifier: str) -> set[int]:
        """Rows whose text names ``identifier`` between non-word characters (any case)."""
        needle = identifier.lower()
        pattern = re.compile(r"(?<!\w)" + re.escape(needle) + r"(?!\w)")
        return {i for i, text in enumerate(self.lowered)
                if needle in text and pattern.search(text)}


def _planted_messages() -> list[tuple[str, Message]]:
    """A 49 KB file with the account id in its middle, decoys, and the issue's examples."""
    source = load_conversation_file(TRANSCRIPTS / "psf__requests-1142.json").messages[-1]
    code = source.blocks()[0]
    assert isinstance(code, ToolResultBlock)
    head = code.output_text()[:49_000]
    middle = head.index("\n", 29_000) + 1
    big_file = (head[:middle] + f"LEDGER_ACCOUNT = '{ACCOUNT}'  # reconcile monthly\n"
                + head[middle:])
    return [
        ("task", Message(role="user", content="Reconcile the ledger export for last month.")),
        ("file-call", Message(role="assistant", content=[ToolUseBlock(
            id="p1", name="bash", input={"command": "cat settings/ledger.py"})])),
        ("file", Message(role="user", content=[ToolResultBlock(tool_use_id="p1",
                                                               content=big_file)])),
        ("decoy", Message(role="assistant", content="Closed ACCT-90418 yesterday; parcel 90417 "
                          "left today.")),
        ("syntax", Message(role="assistant", content="Odd strings seen in the logs:\n"
                           + "\n".join(SYNTAX_QUERIES))),
        ("django", Message(role="assistant", content=[TextBlock(
            text="In django/core/management/base.py, BaseCommand raises "
                 "CommandError(self.missing_args_message) when no label is given.")])),
    ]


def _chunks_of(transcript: str, messages: list[Message]) -> tuple[list[Row], float]:
    started = time.perf_counter()
    chunks: list[SearchChunk] = [c for seq, m in enumerate(messages)
                                 for c in message_chunks(m, seq)]
    elapsed = time.perf_counter() - started
    return [Row(transcript, c.seq, c.offset, c.text, c.index_text) for c in chunks], elapsed


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    rows: list[Row] = []
    derive_s: dict[str, float] = {}
    chars: dict[str, int] = {}
    for path in sorted(TRANSCRIPTS.glob("*.json")):
        messages = load_conversation_file(path).messages
        # Cold cache per transcript, so each time includes its own first derivations.
        searchtext._token_index_text.cache_clear()
        found, derive_s[path.stem] = _chunks_of(path.stem, messages)
        chars[path.stem] = sum(len(searchtext.searchable_text(m)) for m in messages)
        rows.extend(found)
    planted = _planted_messages()
    found, _ = _chunks_of(PLANTED, [m for _, m in planted])
    rows.extend(found)
    assert len(derive_s) == 7, f"expected the seven shared transcripts in {TRANSCRIPTS}"
    return Corpus(rows=rows, derive_s=derive_s, chars=chars,
                  planted={name: seq for seq, (name, _) in enumerate(planted)})


# --- the two scratch indexes ---------------------------------------------------------------------

@dataclass(frozen=True)
class Hit:
    row: int  # index into Corpus.rows
    tier: str
    score: float


class Index:
    """One backend's scratch index and the tiered search the store will run on it."""

    name: str

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.latencies: list[float] = []
        self.conn = engine.connect()

    def run(self, tier: searchtext.SearchTier, limit: int | None) -> list[tuple[int, float]]:
        """(row, score) of one tier, best first; ``limit`` None for every match."""
        raise NotImplementedError

    def sizes(self) -> dict[str, int]:
        raise NotImplementedError

    def search(self, query: SearchQuery, limit: int | None = 20, *,
               timed: bool = True) -> list[Hit]:
        """The store's search: the query's tiers in order, each ranked, new chunks appended;
        the fallback tiers only when the strict ones found nothing."""
        started = time.perf_counter()
        hits: list[Hit] = []
        seen: set[int] = set()
        strict_found = False
        for tier in query.tiers():
            if tier.fallback and strict_found:
                break
            for row, score in self.run(tier, limit):
                if row not in seen:
                    seen.add(row)
                    hits.append(Hit(row, tier.match, score))
            strict_found = strict_found or (bool(hits) and not tier.fallback)
            if limit is not None and len(hits) >= limit:
                break
        if timed:
            self.latencies.append(time.perf_counter() - started)
        return hits[:limit] if limit is not None else hits

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


class SqliteIndex(Index):
    name = "sqlite"

    def __init__(self, path: Path, corpus: Corpus) -> None:
        super().__init__(sa.create_engine(f"sqlite:///{path}"))
        with self.conn.begin():
            self.conn.exec_driver_sql(
                'CREATE TABLE chunks (id INTEGER PRIMARY KEY, transcript TEXT, seq INTEGER, '
                '"offset" INTEGER, text TEXT, index_text TEXT)')
            self.conn.exec_driver_sql(
                "CREATE VIRTUAL TABLE chunks_fts USING fts5(index_text, content='chunks', "
                "content_rowid='id', tokenize='unicode61')")
            self.conn.execute(sa.text(
                'INSERT INTO chunks (id, transcript, seq, "offset", text, index_text) '
                "VALUES (:id, :transcript, :seq, :offset, :text, :index_text)"),
                [{"id": i, **r.__dict__} for i, r in enumerate(corpus.rows)])
            self.conn.exec_driver_sql(
                "INSERT INTO chunks_fts (rowid, index_text) SELECT id, index_text FROM chunks")

    def run(self, tier: searchtext.SearchTier, limit: int | None) -> list[tuple[int, float]]:
        rows = self.conn.execute(sa.text(
            "SELECT f.rowid, bm25(chunks_fts) AS score FROM chunks_fts f "
            "JOIN chunks c ON c.id = f.rowid WHERE chunks_fts MATCH :q "
            "ORDER BY score, c.seq DESC LIMIT :n"), {"q": tier.fts5, "n": limit or -1})
        return [(int(r[0]), -float(r[1])) for r in rows]

    def sizes(self) -> dict[str, int]:
        found: dict[str, int] = {str(name): int(size) for name, size in self.conn.exec_driver_sql(
            "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")}
        fts = sum(size for name, size in found.items() if name.startswith("chunks_fts"))
        return {"fts5 index": fts, "content table": found.get("chunks", 0)}


class PostgresIndex(Index):
    name = "postgres"

    def __init__(self, url: str, corpus: Corpus) -> None:
        super().__init__(sa.create_engine(url))
        with self.conn.begin():
            self.conn.exec_driver_sql(
                'CREATE TABLE chunks (id integer PRIMARY KEY, transcript text, seq integer, '
                '"offset" integer, text text, index_text text, '
                "tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', index_text)) STORED)")
            self.conn.exec_driver_sql("CREATE INDEX chunks_tsv ON chunks USING gin (tsv)")
            self.conn.execute(sa.text(
                'INSERT INTO chunks (id, transcript, seq, "offset", text, index_text) '
                "VALUES (:id, :transcript, :seq, :offset, :text, :index_text)"),
                [{"id": i, **r.__dict__} for i, r in enumerate(corpus.rows)])
        self.conn.exec_driver_sql("ANALYZE chunks")
        self.conn.commit()

    def run(self, tier: searchtext.SearchTier, limit: int | None) -> list[tuple[int, float]]:
        rows = self.conn.execute(sa.text(
            "SELECT id, ts_rank_cd(tsv, q) AS score FROM chunks, to_tsquery('simple', :q) q "
            "WHERE tsv @@ q ORDER BY score DESC, seq DESC LIMIT :n"),
            {"q": tier.tsquery, "n": limit})
        self.conn.commit()
        return [(int(r[0]), float(r[1])) for r in rows]

    def sizes(self) -> dict[str, int]:
        heap, gin = self.conn.exec_driver_sql(
            "SELECT pg_table_size('chunks'), pg_relation_size('chunks_tsv')").one()
        self.conn.commit()
        return {"table (text, index_text, tsvector)": int(heap), "gin index": int(gin)}


@pytest.fixture(scope="module")
def sqlite_index(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    index = SqliteIndex(tmp_path_factory.mktemp("search") / "search.db", corpus)
    yield index
    _report(index, corpus)
    index.close()


@pytest.fixture(scope="module")
def postgres_index(corpus: Corpus, postgres: Databases) -> Iterator[Index]:
    index = PostgresIndex(postgres.create(), corpus)
    yield index
    _report(index, corpus)
    index.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def index(request: pytest.FixtureRequest) -> Index:
    found: Index = request.getfixturevalue(f"{request.param}_index")
    return found


def _report(index: Index, corpus: Corpus) -> None:
    lines = [f"\n--- search on {index.name}: {len(corpus.rows)} chunks ---"]
    if index.name == "sqlite":
        for name, seconds in corpus.derive_s.items():
            lines.append(f"derive {name}: {corpus.chars[name]:,} chars in {seconds * 1000:.0f} ms")
    for what, size in index.sizes().items():
        lines.append(f"{what}: {size / 1e6:.2f} MB")
    if index.latencies:
        ms = sorted(x * 1000 for x in index.latencies)
        p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
        lines.append(f"{len(ms)} searches: p50 {statistics.median(ms):.2f} ms, "
                     f"p99 {p99:.2f} ms, max {ms[-1]:.2f} ms")
    print("\n".join(lines))


# --- identifiers of the transcripts ---------------------------------------------------------------

_PATH = re.compile(r"(?<![\w/.])[A-Za-z_][\w-]*(?:/[\w.-]+)+\.[a-z]{2,4}(?![\w/])")
_DOTTED = re.compile(r"(?<![\w.])[a-z_]\w{2,}(?:\.[a-z_]\w*)+(?![\w.(])")


def _sample_identifiers(corpus: Corpus) -> list[tuple[str, str]]:
    """(identifier, a part of it): the three most frequent paths and dotted names of each
    transcript, with the file name of a path and everything after the first dot of a name."""
    out: list[tuple[str, str]] = []
    for transcript in corpus.derive_s:
        texts = [r.text for r in corpus.rows if r.transcript == transcript]
        for pattern in (_PATH, _DOTTED):
            counts = Counter(m for t in texts for m in pattern.findall(t))
            for found, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]:
                part = found.rsplit("/", 1)[1] if "/" in found else found.split(".", 1)[1]
                out.append((found, part))
    return out


def test_identifiers_of_the_transcripts_are_found_by_whole_form_and_by_parts(
        index: Index, corpus: Corpus) -> None:
    samples = _sample_identifiers(corpus)
    assert len(samples) >= 35
    for identifier, part in samples:
        for query in (identifier, part):
            expected = corpus.holding(query)
            assert expected, query
            hits = index.search(parse_query(query), limit=None, timed=False)
            missing = expected - {h.row for h in hits}
            assert not missing, (index.name, query, len(missing), len(expected))


def test_the_first_twenty_hits_of_an_identifier_hold_it_whole(index: Index,
                                                               corpus: Corpus) -> None:
    """The search an agent's recall makes (20 excerpts); timed for the report."""
    for identifier, part in _sample_identifiers(corpus):
        for query in (identifier, part):
            hits = index.search(parse_query(query), limit=20)
            want = min(20, len(corpus.holding(query)))
            top = [corpus.rows[h.row].text.lower() for h in hits[:want]]
            assert all(query.lower() in text for text in top), (index.name, query)


def _planted_hits(index: Index, corpus: Corpus, query: str) -> list[tuple[str, int, str]]:
    return [(corpus.rows[h.row].transcript, corpus.rows[h.row].seq, h.tier)
            for h in index.search(parse_query(query))]


def test_the_issue_examples_are_found_by_their_parts(index: Index, corpus: Corpus) -> None:
    django = (PLANTED, corpus.planted["django"])
    for query in ("base.py", "django/core/management/base.py", "core/management",
                  "missing_args_message", "self.missing_args_message", "MissingArgs"):
        hits = index.search(parse_query(query), limit=None)
        assert django in {(corpus.rows[h.row].transcript, corpus.rows[h.row].seq)
                          for h in hits}, (index.name, query)
    # The transcripts say django/db/models/base.py: base.py finds it too.
    base = index.search(parse_query("base.py"), limit=None)
    assert len({corpus.rows[h.row].transcript for h in base}) > 1


def test_a_planted_account_id_ranks_first_above_messages_holding_only_its_parts(
        index: Index, corpus: Corpus) -> None:
    hits = _planted_hits(index, corpus, ACCOUNT)
    assert hits[0] == (PLANTED, corpus.planted["file"], "exact"), (index.name, hits)
    assert (PLANTED, corpus.planted["decoy"], "all") in hits[1:]
    # The planted chunk is an excerpt of the 49 KB file, located by its offset.
    best = index.search(parse_query(ACCOUNT))[0]
    row = corpus.rows[best.row]
    assert ACCOUNT in row.text and row.offset > 0 and len(row.text) <= searchtext.CHUNK_CHARS


def test_a_query_with_an_unknown_word_falls_back_to_any_term(index: Index,
                                                           corpus: Corpus) -> None:
    hits = _planted_hits(index, corpus, f"zebraquokka {ACCOUNT}")
    assert hits[0] == (PLANTED, corpus.planted["file"], "any-exact"), (index.name, hits[:3])
    assert (PLANTED, corpus.planted["decoy"], "any") in hits[1:]
    assert _planted_hits(index, corpus, "zebraquokka wombatfish") == []


def test_the_stock_tokenizers_miss_what_the_derived_words_find(index: Index) -> None:
    """Why the words are derived: the raw text fails or misses on both backends."""
    raw = "see django/core/management/base.py and self.missing_args_message for ACCT-90417"
    if isinstance(index, SqliteIndex):
        index.conn.exec_driver_sql("CREATE VIRTUAL TABLE IF NOT EXISTS raw USING fts5(body)")
        index.conn.execute(sa.text("INSERT INTO raw (body) VALUES (:b)"), {"b": raw})
        with pytest.raises(sa.exc.OperationalError, match="no such column"):
            index.conn.execute(sa.text("SELECT * FROM raw WHERE raw MATCH :q"),
                               {"q": ACCOUNT}).all()
        index.conn.rollback()
        return
    stock = index.conn.execute(sa.text(
        "SELECT to_tsvector('simple', :raw) @@ plainto_tsquery('simple', :q)"),
        {"raw": raw, "q": "base.py"}).scalar()
    stock_snake = index.conn.execute(sa.text(
        "SELECT to_tsvector('simple', :raw) @@ phraseto_tsquery('simple', :q)"),
        {"raw": raw, "q": "missing_args_message"}).scalar()
    index.conn.commit()
    # 'simple' keeps the path as one token and reads "self.missing" as a host name.
    assert stock is False and stock_snake is False


# --- hostile queries ---------------------------------------------------------------------------

_HOSTILE = st.sampled_from([
    '"', "'", "(", ")", "AND", "OR", "NOT", "NEAR(", "NEAR/2", "*", ":", "-", "^", "col:",
    "index_text:", "{index_text}", "\x00", "\\", "&", "|", "!", "<->", "<2>", "{", "}", "+",
    ACCOUNT, "'); DROP TABLE chunks;--", "\ud800", "é", "²", "ǅ", "ﬁ", "١٢٣", "1e5abc", "0x1F",
    "a.b.c", "x/y", "__init__", "qxd", "%", "$$", "E'\\x00'", "\u200b", "\ufeff"])


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(_HOSTILE, st.text(max_size=10)), max_size=10).map("".join))
def test_hostile_queries_never_raise_a_database_error(index: Index, text: str) -> None:
    try:
        query = parse_query(text)
    except InvalidInputError:
        return
    modes: tuple[searchtext.Match, ...] = ("exact", "all", "any-exact", "any")
    for mode in modes:
        index.run(searchtext.SearchTier(match=mode, fts5=query.fts5(mode),
                                        tsquery=query.tsquery(mode), fallback=False), 5)


@pytest.mark.parametrize("text", SYNTAX_QUERIES)
def test_queries_that_are_fts5_and_tsquery_syntax_are_searched_as_words(
        index: Index, corpus: Corpus, text: str) -> None:
    """Each query is planted verbatim in one message: read as words (not as operators, column
    filters or prefixes), its strict tier finds that message first."""
    hits = _planted_hits(index, corpus, text)
    assert hits, (index.name, text)
    assert hits[0][:2] == (PLANTED, corpus.planted["syntax"]), (index.name, text, hits[:3])
    assert hits[0][2] in ("exact", "all"), (index.name, text, hits[0])


# --- deletion ------------------------------------------------------------------------------------

def test_a_message_re_derived_later_deletes_exactly_its_rows_from_an_fts5_index(
        tmp_path: Path) -> None:
    """FTS5's external-content ``delete`` needs the indexed values: re-deriving them from the
    message (as a discard would) gives them back byte for byte, and the index stays sound."""
    messages = load_conversation_file(TRANSCRIPTS / "django__django-15554.json").messages[:40]
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'd.db'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE c (id INTEGER PRIMARY KEY, seq INTEGER, "
                             "index_text TEXT)")
        conn.exec_driver_sql("CREATE VIRTUAL TABLE f USING fts5(index_text, content='c', "
                             "content_rowid='id')")
        rows: list[dict[str, Any]] = [
            {"seq": seq, "index_text": ch.index_text}
            for seq, m in enumerate(messages) for ch in message_chunks(m, seq)]
        for row in rows:
            rid = conn.execute(sa.text("INSERT INTO c (seq, index_text) VALUES (:seq, "
                                       ":index_text) RETURNING id"), row).scalar_one()
            conn.execute(sa.text("INSERT INTO f (rowid, index_text) VALUES (:id, :t)"),
                         {"id": rid, "t": row["index_text"]})
    target = next(seq for seq, m in enumerate(messages) if "FilteredRelation" in
                  searchtext.searchable_text(m))
    query = parse_query("FilteredRelation").fts5("all")
    with engine.begin() as conn:
        ids = [r[0] for r in conn.exec_driver_sql(f"SELECT id FROM c WHERE seq = {target} "
                                                  "ORDER BY id")]
        again = message_chunks(messages[target], target)
        assert len(ids) == len(again)
        for rid, chunk in zip(ids, again, strict=True):
            conn.execute(sa.text("INSERT INTO f (f, rowid, index_text) "
                                 "VALUES ('delete', :id, :t)"),
                         {"id": rid, "t": chunk.index_text})
        conn.exec_driver_sql(f"DELETE FROM c WHERE seq = {target}")
        conn.exec_driver_sql("INSERT INTO f (f) VALUES ('integrity-check')")
        found = {r[0] for r in conn.execute(sa.text(
            "SELECT c.seq FROM f JOIN c ON c.id = f.rowid WHERE f MATCH :q"), {"q": query})}
    engine.dispose()
    assert target not in found and found
