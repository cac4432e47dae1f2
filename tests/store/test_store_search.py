"""The store's ledger search (recall): indexed by append, searched per session, kept in step.

Every test runs on SQLite (FTS5) and PostgreSQL (tsvector + GIN) through the real
:class:`SessionStore`. The transcript tests share one store per backend holding the seven
shipped transcripts (and a planted session), appended message by message as an agent would.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError
from sessionfold.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.searchtext import CHUNK_CHARS, message_chunks
from sessionfold.store import SessionStore
from sessionfold.store.migrate import alembic_config, upgrade
from sessionfold.store.schema import ledger_chunks
from store_helpers import plan, transcript, transcript_names, turn, user

ACCOUNT = "ACCT-90417"
POLICY = FoldPolicy(budget_tokens=32_000)


# --- helpers -------------------------------------------------------------------------------------

def chunk_rows(store: SessionStore, sid: str) -> list[tuple[int, int, str, str]]:
    """(seq, offset, text, index_text) of every index row of ``sid``, in order."""
    c = ledger_chunks.c
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(  # type: ignore[misc]
            sa.select(c.seq, c.offset, c.text, c.index_text).where(c.session_id == sid)
            .order_by(c.seq, c.offset))]


def expected_rows(store: SessionStore, sid: str) -> list[tuple[int, int, str, str]]:
    """The index rows the session's ledger should have: every agent row not discarded."""
    return [(ch.seq, ch.offset, ch.text.replace("\x00", "\ufffd"), ch.index_text)
            for e in store.read_ledger(sid) if e.message is not None and e.origin == "agent"
            for ch in message_chunks(e.message, e.seq)]


def fts_matches(store: SessionStore, word: str) -> int:
    """SQLite: how many FTS5 index entries match ``word`` whatever the content table says
    (an entry left behind by a delete would count); PostgreSQL: rows whose tsvector does."""
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM ledger_chunks_fts WHERE ledger_chunks_fts MATCH :w"),
                {"w": f'"{word}"'}).scalar_one())
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM ledger_chunks WHERE tsv @@ to_tsquery('simple', :w)"),
            {"w": f"'{word}'"}).scalar_one())


def check_index(store: SessionStore) -> None:
    """SQLite: FTS5's own integrity check, comparing the index with its content table."""
    if store.engine.dialect.name == "sqlite":
        with store.engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO ledger_chunks_fts (ledger_chunks_fts, rank) "
                "VALUES ('integrity-check', 1)")


def forget_index(store: SessionStore, sid: str) -> None:
    """Make ``sid`` look written before the index existed: no chunk rows, flagged pending."""
    with store.engine.begin() as conn:
        conn.execute(ledger_chunks.delete().where(ledger_chunks.c.session_id == sid))
        conn.execute(sa.text("UPDATE sessions SET search_pending = :t WHERE id = :sid"),
                     {"t": True, "sid": sid})


def seqs(hits: list[Any]) -> list[int]:
    return [h.seq for h in hits]


def planted_messages() -> list[Message]:
    """The issue's case: an account id in the middle of an early 49 KB file, and decoys."""
    _, messages = transcript("psf__requests-1142")
    code = messages[-1].blocks()[0]
    assert isinstance(code, ToolResultBlock)
    head = code.output_text()[:49_000]
    middle = head.index("\n", 29_000) + 1
    big_file = (head[:middle] + f"LEDGER_ACCOUNT = '{ACCOUNT}'  # reconcile monthly\n"
                + head[middle:])
    return [
        Message(role="user", content="Reconcile the ledger export for last month."),
        Message(role="assistant", content=[ToolUseBlock(
            id="p1", name="bash", input={"command": "cat settings/ledger.py"})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="p1", content=big_file)]),
        Message(role="assistant", content="Closed ACCT-90418 yesterday; parcel 90417 left today."),
        Message(role="user", content="In django/core/management/base.py, BaseCommand raises "
                                     "CommandError(self.missing_args_message)."),
    ]


# --- the shipped transcripts in one store per backend -------------------------------------------

@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres",
                                                              marks=pytest.mark.postgres)])
def loaded(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('search') / 'store.db'}"
    else:
        url = request.getfixturevalue("postgres").create()
    store = SessionStore.from_url(url)
    store.migrate()
    for name in transcript_names():
        system, messages = transcript(name)
        store.create_session(name, POLICY, system=system)
        for message in messages:
            store.append(name, [message])
    store.create_session("planted", POLICY)
    for message in planted_messages():
        store.append("planted", [message])
    yield store
    store.close()


_PATH = re.compile(r"(?<![\w/.])[A-Za-z_][\w-]*(?:/[\w.-]+)+\.[a-z]{2,4}(?![\w/])")
_DOTTED = re.compile(r"(?<![\w.])[a-z_]\w{2,}(?:\.[a-z_]\w*)+(?![\w.(])")


def _identifiers(rows: list[tuple[int, int, str, str]]) -> list[tuple[str, str]]:
    """(identifier, a part of it): the two most frequent paths and dotted names of a session,
    with the file name of a path and what follows the first dot of a name."""
    out = []
    for pattern in (_PATH, _DOTTED):
        counts = Counter(m for r in rows for m in pattern.findall(r[2]))
        for found, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:2]:
            part = found.rsplit("/", 1)[1] if "/" in found else found.split(".", 1)[1]
            out.append((found, part))
    return out


def _holding(rows: list[tuple[int, int, str, str]], needle: str) -> set[tuple[int, int]]:
    pattern = re.compile(r"(?<!\w)" + re.escape(needle.lower()) + r"(?!\w)")
    return {(r[0], r[1]) for r in rows if pattern.search(r[2].lower())}


def test_append_indexes_every_message_of_the_transcripts_exactly_as_derived(
        loaded: SessionStore) -> None:
    for name in transcript_names():
        assert chunk_rows(loaded, name) == expected_rows(loaded, name), name
    assert loaded.unindexed_sessions() == 0
    check_index(loaded)


def test_identifiers_of_the_transcripts_are_found_by_whole_form_and_by_parts(
        loaded: SessionStore) -> None:
    checked = 0
    for name in transcript_names():
        rows = chunk_rows(loaded, name)
        for identifier, part in _identifiers(rows):
            for query in (identifier, part):
                expected = _holding(rows, query)
                assert expected, (name, query)
                hits = loaded.search(name, query, limit=1000)
                found = {(h.seq, h.offset) for h in hits}
                assert expected <= found, (name, query, len(expected - found))
                # Chunks holding the query whole come first, then those holding its parts.
                tiers = [h.tier for h in hits]
                assert tiers == sorted(tiers, key=["exact", "all"].index), (name, query)
                assert all(query.lower() in h.excerpt.lower() for h in hits
                           if h.tier == "exact"), (name, query)
                checked += 1
    assert checked >= 40


def test_a_planted_account_number_in_a_49_kb_file_ranks_first(loaded: SessionStore) -> None:
    hits = loaded.search("planted", ACCOUNT)
    assert (hits[0].seq, hits[0].tier) == (2, "exact")
    assert ACCOUNT in hits[0].excerpt and hits[0].offset > 0
    assert len(hits[0].excerpt) <= CHUNK_CHARS
    # The decoy holds both parts (acct, 90417) but not the id: found, ranked after.
    assert 3 in seqs(hits[1:]) and hits[seqs(hits).index(3)].tier == "all"
    assert [h.rank for h in hits if h.tier == "exact"] == sorted(
        (h.rank for h in hits if h.tier == "exact"), reverse=True)


def test_the_issue_examples_are_found_by_their_parts(loaded: SessionStore) -> None:
    for query in ("base.py", "django/core/management/base.py", "core/management",
                  "missing_args_message", "self.missing_args_message", "MissingArgs"):
        assert 4 in seqs(loaded.search("planted", query, limit=50)), query


def test_a_query_with_an_unknown_word_falls_back_to_any_word_and_says_so(
        loaded: SessionStore) -> None:
    hits = loaded.search("planted", f"zebraquokka {ACCOUNT}")
    assert (hits[0].seq, hits[0].tier) == (2, "any-exact") and hits[0].fallback
    assert loaded.search("planted", "zebraquokka wombatfish") == []


def test_a_session_finds_only_its_own_rows(loaded: SessionStore) -> None:
    # FilteredRelation is all over the django-15554 run and nowhere in the planted session.
    assert loaded.search("django__django-15554", "FilteredRelation")
    assert loaded.search("planted", "FilteredRelation") == []
    assert loaded.search("django__django-15554", ACCOUNT) == []
    with pytest.raises(SessionNotFoundError):
        loaded.search("no-such-session", "FilteredRelation")


def test_the_868_k_character_tool_output_is_indexed_and_searchable(loaded: SessionStore) -> None:
    sid = "psf__requests-1142"
    big = loaded.read_ledger(sid)[-1]
    assert big.message is not None
    rows = [r for r in chunk_rows(loaded, sid) if r[0] == big.seq]
    assert len(rows) > 100 and all(len(r[2]) <= CHUNK_CHARS for r in rows)
    assert "".join(r[2] for r in rows).count("\n") > 10_000
    tail = rows[-1][2]
    word = max(re.findall(r"[A-Za-z_]\w{7,}", tail), key=len)
    hits = loaded.search(sid, word, limit=1000)
    assert (big.seq, rows[-1][1]) in {(h.seq, h.offset) for h in hits}


# --- writing and keeping the index in step ------------------------------------------------------

def test_a_recall_exchange_is_stored_as_recall_and_never_indexed(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("find the quokkafile please")])
    exchange = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "r1",
                                           "name": "sessionfold_recall",
                                           "input": {"query": "quokkafile"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "r1",
                                      "content": "#0 find the quokkafile please wombatword"}]},
    ]
    done = store.append("a", exchange, key="recall-1", recall=True)
    entries = store.read_ledger("a")
    assert [e.origin for e in entries] == ["agent", "recall", "recall"]
    assert [i.kind for i in store.read_window("a").items] == ["message", "recall", "recall"]
    assert seqs(store.search("a", "quokkafile")) == [0]
    assert store.search("a", "wombatword") == []
    assert chunk_rows(store, "a") == expected_rows(store, "a")
    # A keyed retry of a recall append is a retry like any other; as an agent append it is not.
    assert store.append("a", exchange, key="recall-1", recall=True).duplicate
    assert store.append("a", exchange, key="recall-1", recall=True).first_seq == done.first_seq
    with pytest.raises(InvalidInputError, match="same origin"):
        store.append("a", exchange, key="recall-1")
    assert store.export("a")["ledger"][1]["origin"] == "recall"
    assert "recall:assistant" in store.inspect("a")


def test_recall_must_be_a_bool(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    with pytest.raises(InvalidInputError, match="recall must be True or False"):
        store.append("a", [user("x")], recall="yes")  # type: ignore[arg-type]
    assert store.read_ledger("a") == []


def test_a_discarding_fold_takes_its_rows_out_of_the_index(store: SessionStore) -> None:
    policy = FoldPolicy(budget_tokens=2000, keep_recent_turns=2, retain="discard")
    store.create_session("a", policy)
    store.append("a", [user("the task")])
    store.append("a", [m for i in range(20) for m in turn(str(i))])
    assert seqs(store.search("a", "file-3.txt")) == [7]
    claim = store.claim("a", "job-1")
    span = store.commit_fold("a", plan(store, "a"), epoch=claim.epoch,
                             incarnation=claim.incarnation, job_id="job-1").spans[0]
    assert span.start_seq <= 7 <= span.end_seq < 39
    assert store.search("a", "file-3.txt") == []
    assert fts_matches(store, "file") > 0  # the kept turns are still there ...
    assert seqs(store.search("a", "file-19.txt")) == [39]
    assert {r[0] for r in chunk_rows(store, "a")}.isdisjoint(
        range(span.start_seq, span.end_seq + 1))
    assert chunk_rows(store, "a") == expected_rows(store, "a")
    check_index(store)


def test_a_retaining_fold_leaves_the_index_as_it_was(store: SessionStore) -> None:
    store.create_session("a", FoldPolicy(budget_tokens=2000, keep_recent_turns=2))
    store.append("a", [user("the task")])
    store.append("a", [m for i in range(20) for m in turn(str(i))])
    before = chunk_rows(store, "a")
    claim = store.claim("a", "job-1")
    store.commit_fold("a", plan(store, "a"), epoch=claim.epoch, incarnation=claim.incarnation,
                      job_id="job-1")
    assert chunk_rows(store, "a") == before
    assert seqs(store.search("a", "file-3.txt")) == [7]


def test_a_deleted_session_leaves_no_index_rows(store: SessionStore) -> None:
    for sid in ("a", "b"):
        store.create_session(sid, POLICY)
        store.append(sid, [user(f"the quokka{sid} task"), *turn(sid)])
    assert fts_matches(store, "quokkaa") == 1
    assert store.delete_session("a")
    assert chunk_rows(store, "a") == []
    assert fts_matches(store, "quokkaa") == 0
    assert seqs(store.search("b", "quokkab")) == [0]
    check_index(store)
    store.create_session("a", POLICY)  # the id again: a new, empty session
    assert store.search("a", "quokkaa") == []


def test_a_nul_in_tool_output_is_indexed_and_shown_as_a_replacement_character(
        store: SessionStore) -> None:
    store.create_session("a", POLICY)
    output = "before\x00NUL_MARKER after"
    store.append("a", [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash",
                                           "input": {"command": "cat blob"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": output}]},
    ])
    [hit] = store.search("a", "NUL_MARKER")
    assert (hit.seq, hit.offset, hit.excerpt) == (1, 0, "before\ufffdNUL_MARKER after")


def test_a_message_without_words_has_no_index_rows(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("... !!! ???")])
    assert chunk_rows(store, "a") == []
    assert store.reindex(sid="a") == 0


# --- queries -------------------------------------------------------------------------------------

@pytest.mark.parametrize("query", ["", "   ", "!!! ???", "x" * 2001,
                                   " ".join(f"w{i}" for i in range(40))])
def test_a_query_with_nothing_to_search_is_refused_with_a_clear_message(
        store: SessionStore, query: str) -> None:
    store.create_session("a", POLICY)
    with pytest.raises(InvalidInputError, match="search query"):
        store.search("a", query)


@pytest.mark.parametrize("limit", [0, -1, 1001, True, 2.5, "5", None])
def test_a_search_limit_is_an_integer_from_1_to_1000(store: SessionStore, limit: Any) -> None:
    store.create_session("a", POLICY)
    with pytest.raises(InvalidInputError, match="search limit"):
        store.search("a", "word", limit=limit)


def test_a_query_that_is_not_text_is_refused(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    with pytest.raises(InvalidInputError, match="a search query is text"):
        store.search("a", b"word")  # type: ignore[arg-type]


def test_the_limit_caps_the_hits_best_first(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [m for i in range(12) for m in turn(f"t{i}")])
    hits = store.search("a", "tool output", limit=5)
    assert len(hits) == 5 and len(store.search("a", "tool output", limit=1000)) == 12
    assert [h.rank for h in hits] == sorted((h.rank for h in hits), reverse=True)


_HOSTILE = st.sampled_from([
    '"', "'", "(", ")", "AND", "OR", "NOT", "NEAR(", "NEAR/2", "*", ":", "-", "^", "col:",
    "index_text:", "ledger_chunks_fts:", "{index_text}", "\x00", "\\", "&", "|", "!", "<->",
    "<2>", "{", "}", "+", ACCOUNT, "'); DROP TABLE ledger_chunks;--", "\ud800", "é", "²", "ǅ",
    "ﬁ", "١٢٣", "1e5abc", "0x1F", "a.b.c", "x/y", "__init__", "qxd", "%", "$$", "E'\\x00'",
    "\u200b", "\ufeff", "rank:", "bm25(", "tsv @@", "::tsquery", "quokka"])


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(_HOSTILE, st.text(max_size=10)), max_size=12).map("".join))
def test_hostile_queries_are_words_or_a_clear_refusal_never_a_database_error(
        store: SessionStore, text: str) -> None:
    if not store.list_sessions():
        store.create_session("a", POLICY)
        store.append("a", [user(f"quokka {ACCOUNT} AND NEAR( a.b.c x/y __init__ é ﬁ")])
    try:
        hits = store.search("a", text, limit=5)
    except InvalidInputError as exc:
        assert "search query" in str(exc)
        return
    assert all(h.seq == 0 for h in hits)


# --- reindexing ----------------------------------------------------------------------------------

def _ledger(store: SessionStore, sid: str, steps: int = 15) -> None:
    store.create_session(sid, POLICY)
    store.append(sid, [user(f"the {sid} task")])
    store.append(sid, [m for i in range(steps) for m in turn(f"{sid}{i}")])


class _Commits:
    """Counts committed transactions on an engine."""

    def __init__(self, store: SessionStore) -> None:
        self.count = 0
        sa.event.listen(store.engine, "commit", self._on_commit)

    def _on_commit(self, _conn: Any) -> None:
        self.count += 1


def test_reindex_indexes_a_ledger_written_without_the_index_in_batches(
        store: SessionStore) -> None:
    _ledger(store, "a")
    _ledger(store, "b")
    want = chunk_rows(store, "a")
    forget_index(store, "a")
    assert store.search("a", "file-a3.txt") == []
    assert store.unindexed_sessions() == 1
    commits = _Commits(store)
    assert store.reindex(batch=4) == 31  # every row has words; "b" was not pending
    assert commits.count >= 31 // 4  # one short transaction per batch at least, not one
    assert chunk_rows(store, "a") == want
    assert seqs(store.search("a", "file-a3.txt")) == [7]
    assert store.unindexed_sessions() == 0
    assert store.reindex() == 0 and store.reindex(sid="a") == 0 and store.reindex(sid="b") == 0
    assert chunk_rows(store, "a") == want
    check_index(store)


def test_reindex_of_one_session_ignores_its_flag_and_resumes_after_a_partial_run(
        store: SessionStore) -> None:
    _ledger(store, "a")
    want = chunk_rows(store, "a")
    with store.engine.begin() as conn:  # a run stopped half-way: the first rows are indexed
        conn.execute(ledger_chunks.delete().where(ledger_chunks.c.seq >= 12))
    assert store.unindexed_sessions() == 0  # not flagged: only an explicit reindex sees it
    assert store.reindex(sid="a", batch=5) == 19
    assert chunk_rows(store, "a") == want


def test_reindex_skips_discarded_and_recall_rows(store: SessionStore) -> None:
    store.create_session("a", FoldPolicy(budget_tokens=2000, keep_recent_turns=2,
                                         retain="discard"))
    store.append("a", [user("the task")])
    store.append("a", [m for i in range(20) for m in turn(str(i))])
    store.append("a", [user("recalled quokka text")], recall=True)
    claim = store.claim("a", "job-1")
    store.commit_fold("a", plan(store, "a"), epoch=claim.epoch, incarnation=claim.incarnation,
                      job_id="job-1")
    want = chunk_rows(store, "a")
    forget_index(store, "a")
    store.reindex()
    assert chunk_rows(store, "a") == want == expected_rows(store, "a")
    assert store.search("a", "file-3.txt") == [] and store.search("a", "quokka") == []


@pytest.mark.parametrize("batch", [0, -3, 10_001, True, "5"])
def test_a_reindex_batch_is_an_integer_from_1_to_10000(store: SessionStore, batch: Any) -> None:
    with pytest.raises(InvalidInputError, match="reindex batch"):
        store.reindex(batch=batch)


def test_reindex_of_an_unknown_session_says_so(store: SessionStore) -> None:
    with pytest.raises(SessionNotFoundError):
        store.reindex(sid="nope")


def test_an_append_racing_reindexes_of_its_session_never_indexes_a_chunk_twice(
        store: SessionStore) -> None:
    _ledger(store, "a", steps=30)
    forget_index(store, "a")
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def run(work: Any) -> None:
        try:
            barrier.wait()
            work()
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    def appender(tag: str) -> Any:
        return lambda: [store.append("a", turn(f"{tag}{i}")) for i in range(8)]

    threads = [threading.Thread(target=run, args=(w,)) for w in (
        lambda: store.reindex(sid="a", batch=3), lambda: store.reindex(batch=2),
        appender("x"), appender("y"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store.reindex(sid="a")
    rows = chunk_rows(store, "a")
    assert len({(r[0], r[1]) for r in rows}) == len(rows)
    assert rows == expected_rows(store, "a")
    check_index(store)


def test_a_session_the_store_creates_is_not_pending(store: SessionStore) -> None:
    _ledger(store, "a")
    assert store.unindexed_sessions() == 0
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT search_pending FROM sessions")).scalar_one() in (
            False, 0)


def test_an_older_ledger_is_kept_by_the_migration_and_indexed_by_reindex(
        fresh_url: str) -> None:
    store = SessionStore.from_url(fresh_url)
    try:
        assert upgrade(store.engine, "0004") == "0004"
        now = datetime.now(UTC)
        with store.engine.begin() as conn:  # a session and its ledger written by 0004 code
            conn.execute(sa.text(
                "INSERT INTO sessions (id, policy, system, system_tokens, revision, "
                "fold_revision, fold_epoch, paused, next_seq, tail_tool_use_ids, window_tokens, "
                "pending_tokens, calibration, current_tokens, trigger_tokens, created_at, "
                "updated_at) VALUES ('old', :policy, 'sys', 5, 2, 0, 0, :f, 2, '[]', 20, 20, "
                "'{}', 25, 3400, :now, :now)"),
                {"policy": '{"budget_tokens": 4000}', "f": False, "now": now})
            for seq, text in enumerate(["open django/db/models/base.py", "done with ACCT-1"]):
                message = f'{{"role": "{"user" if seq == 0 else "assistant"}", ' \
                          f'"content": "{text}"}}'
                conn.execute(sa.text(
                    "INSERT INTO ledger (session_id, seq, message, tokens, appended_at) "
                    "VALUES ('old', :seq, :m, 10, :now)"), {"seq": seq, "m": message, "now": now})
                conn.execute(sa.text(
                    "INSERT INTO window_items (session_id, start_seq, end_seq, kind, version, "
                    "tokens, edits, message) VALUES ('old', :seq, :seq, 'message', 1, 10, "
                    "'[]', :m)"), {"seq": seq, "m": message})
        store.migrate()
        assert [e.origin for e in store.read_ledger("old")] == ["agent", "agent"]
        assert len(store.read_window("old").items) == 2  # no table was rebuilt (no cascade)
        assert store.unindexed_sessions() == 1
        assert store.search("old", "base.py") == []
        assert store.reindex() == 2
        assert seqs(store.search("old", "base.py")) == [0]
        assert seqs(store.search("old", "ACCT-1")) == [1]
        assert store.unindexed_sessions() == 0
        with store.engine.connect() as conn:
            indexes = conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'index'"
                if store.engine.dialect.name == "sqlite"
                else "SELECT indexname FROM pg_indexes").scalars().all()
        assert "ix_sessions_over_budget" in indexes
    finally:
        store.close()


def test_the_migration_downgrades_and_upgrades_again(fresh_url: str) -> None:
    store = SessionStore.from_url(fresh_url)
    try:
        store.migrate()
        _ledger(store, "a", steps=2)
        with store.engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0004")
        with store.engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
        assert "ledger_chunks" not in tables and "ledger_chunks_fts" not in tables
        store.migrate()
        assert store.search("a", "file-a1.txt") == []  # its rows are pending again
        assert store.unindexed_sessions() == 1
        store.reindex()
        assert seqs(store.search("a", "file-a1.txt")) == [3]
    finally:
        store.close()


def test_search_rows_are_excerpts_of_the_ledger_text(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    text = "\n".join(f"line {i}: value_{i} in module_{i % 7}.py" for i in range(2000))
    store.append("a", [Message(role="user", content=[TextBlock(text=text)])])
    rows = chunk_rows(store, "a")
    assert len(rows) > 1 and "".join(r[2] for r in rows) == text
    [hit] = store.search("a", "value_1999")
    assert text[hit.offset:hit.offset + len(hit.excerpt)] == hit.excerpt
    assert "value_1999" in hit.excerpt
