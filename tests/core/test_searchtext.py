"""Identifier-aware search text: derived words, chunks, and queries that cannot be syntax errors.

The backends themselves are exercised in ``tests/store/test_search_backends.py``; here a chunk
"matches" a query when its index words satisfy the query's terms the way FTS5 and tsquery
evaluate them (a term: its whole word, or all of its parts).
"""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sessionfold.cli.files import load_conversation_file
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.messages import (
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from sessionfold.core.searchtext import (
    CHUNK_CHARS,
    MAX_QUERY_CHARS,
    MAX_QUERY_TERMS,
    Match,
    SearchQuery,
    index_text,
    index_word,
    message_chunks,
    parse_query,
    searchable_text,
    split_chunks,
    token_words,
    tokens,
)

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"
_CODES = {"u": "_", "d": ".", "s": "/", "b": "\\", "h": "-", "c": ":", "a": "@", "p": "+",
          "t": "~", "o": "#", "q": "q"}


def decode(word: str) -> str:
    """The inverse of index_word (written from the documented encoding, not from the code)."""
    if word.startswith("qxn"):
        word = word[3:]
    out, i = [], 0
    while i < len(word):
        if word.startswith("qx", i):
            out.append(_CODES[word[i + 2]])
            i += 3
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def satisfies(query: SearchQuery, words: set[str], match: str = "all") -> bool:
    hits = [(t.whole is not None and t.whole in words)
            or (bool(t.parts) and all(p in words for p in t.parts)) for t in query.terms]
    return all(hits) if match == "all" else any(hits)


def words_of(text: str) -> set[str]:
    return set(index_text(text).split())


def finds(query_text: str, document_text: str) -> bool:
    return satisfies(parse_query(query_text), words_of(document_text))


# --- words of one identifier ---------------------------------------------------------------------

def test_a_path_is_indexed_whole_with_its_segments_suffixes_and_file_stem() -> None:
    words = set(token_words("django/core/management/base.py"))
    for piece in ("django/core/management/base.py", "core/management/base.py",
                  "management/base.py", "base.py", "base", "py", "django", "management"):
        assert index_word(piece) in words, piece


def test_a_dotted_name_is_indexed_with_its_suffix_and_snake_parts() -> None:
    words = set(token_words("self.missing_args_message"))
    for piece in ("self.missing_args_message", "missing_args_message", "self", "missing",
                  "args", "message"):
        assert index_word(piece) in words, piece


def test_a_ticket_id_is_indexed_whole_and_by_its_prefix_and_number() -> None:
    assert token_words("ACCT-90417") == ["acctqxh90417", "acct", "90417"]


def test_camel_case_and_digit_runs_are_indexed_as_parts() -> None:
    assert token_words("FilteredRelation") == ["filteredrelation", "filtered", "relation"]
    assert set(token_words("getHTTPResponse2")) >= {"get", "http", "response", "2"}


def test_a_path_with_a_line_number_is_indexed_as_the_path_too() -> None:
    assert finds("django/core/management/base.py", "File django/core/management/base.py:123,")
    assert finds("base.py", "at /testbed/django/core/management/base.py:123")


def test_the_examples_of_the_issue_are_found_by_whole_form_and_parts() -> None:
    doc = ("raise CommandError(self.missing_args_message) in "
           "django/core/management/base.py for ACCT-90417")
    for query in ("base.py", "django/core/management/base.py", "core/management",
                  "missing_args_message", "self.missing_args_message", "ACCT-90417", "90417",
                  "acct", "MissingArgs"):
        assert finds(query, doc), query
    assert not finds("ACCT-90418", doc)
    assert not finds("missing_kwargs_message", doc)


def test_a_word_led_by_digits_gets_the_number_prefix_and_a_number_does_not() -> None:
    # PostgreSQL's parser reads 1e5abc as the number 1e5 and the word abc.
    assert index_word("1e5abc") == "qxn1e5abc"
    assert index_word("2024-01-15") == "qxn2024qxh01qxh15"
    assert index_word("90417") == "90417"


def test_a_literal_qx_is_escaped_so_it_cannot_pose_as_a_connector() -> None:
    assert index_word("aqxdb") != index_word("a.b")
    assert decode(index_word("aqxdb")) == "aqxdb"


def test_a_word_too_long_to_index_is_left_to_its_parts() -> None:
    long_name = "_".join(["segment"] * 40)  # 319 characters
    words = token_words(long_name)
    assert index_word(long_name) not in words and "segment" in words
    term = parse_query(long_name).terms[0]
    assert term.whole is None and term.parts == ("segment",)


def test_index_word_refuses_whitespace() -> None:
    with pytest.raises(ValueError, match="without whitespace"):
        index_word("two words")


_SEGMENT = st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,7}", fullmatch=True)
_CONNECTOR = st.sampled_from(["_", ".", "/", "-", ":", "\\", "@", "+", "~", "#"])


@st.composite
def identifiers(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """(segments, connectors between them)."""
    segments = draw(st.lists(_SEGMENT, min_size=1, max_size=6))
    connectors = draw(st.lists(_CONNECTOR, min_size=len(segments) - 1,
                               max_size=len(segments) - 1))
    return segments, connectors


def join(segments: list[str], connectors: list[str]) -> str:
    out = segments[0]
    for connector, segment in zip(connectors, segments[1:], strict=True):
        out += connector + segment
    return out


@given(st.text(alphabet=string.ascii_letters + string.digits + "_./\\-:@+~#", min_size=1,
               max_size=40))
def test_the_encoding_is_letters_and_digits_only_and_one_to_one(piece: str) -> None:
    word = index_word(piece)
    assert re.fullmatch(r"[a-z0-9]+", word)
    assert decode(word) == piece.lower()


@given(identifiers())
def test_the_whole_token_is_its_first_index_word(parts: tuple[list[str], list[str]]) -> None:
    token = join(*parts)
    assert token_words(token)[0] == index_word(token)


# --- what a message says -------------------------------------------------------------------------

def test_the_searchable_text_holds_text_tool_calls_outputs_and_thinking_but_no_opaque_data(
) -> None:
    message = Message(role="assistant", content=[
        ThinkingBlock(thinking="maybe settings.ROOT_URLCONF", signature="c2lnbmF0dXJl"),
        RedactedThinkingBlock(data="ZW5jcnlwdGVk"),
        TextBlock(text="Let me look."),
        ToolUseBlock(id="t1", name="str_replace_editor",
                     input={"command": "view", "path": "/testbed/a.py",
                            "view_range": [10, 2040], "opts": {"force": True}}),
    ])
    text = searchable_text(message)
    assert "settings.ROOT_URLCONF" in text and "Let me look." in text
    assert "str_replace_editor" in text and "command: view" in text
    assert "path: /testbed/a.py" in text and "2040" in text and "force" in text
    assert "c2lnbmF0dXJl" not in text and "ZW5jcnlwdGVk" not in text


def test_images_are_not_searchable_and_a_lone_tool_output_is_the_text_itself() -> None:
    output = "line one\nERROR in ACCT-90417\n"
    message = Message(role="user", content=[
        ToolResultBlock(tool_use_id="t1", content=[
            TextBlock(text=output),
            ImageBlock(source={"type": "base64", "media_type": "image/png", "data": "iVBOR"})])])
    assert searchable_text(message) == output
    chunk, = message_chunks(message, seq=7)
    assert (chunk.seq, chunk.offset, chunk.text) == (7, 0, output)
    assert "acctqxh90417" in chunk.index_text.split()


def test_a_message_without_words_has_no_chunks() -> None:
    message = Message(role="user", content=[
        ImageBlock(source={"type": "base64", "media_type": "image/png", "data": "iVBOR"})])
    assert message_chunks(message, seq=0) == []


# --- chunks --------------------------------------------------------------------------------------

_FILLER = st.sampled_from([" ", "\n", "  ", ", ", "(", ") ", "; ", "\t", " = ", "\"", "'"])


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, list[tuple[list[str], list[str]]]]:
    """A text of identifiers and filler, and the identifiers in it."""
    items = draw(st.lists(identifiers(), min_size=1, max_size=30))
    text = draw(_FILLER)
    for item in items:
        text += join(*item) + draw(_FILLER)
    return text, items


@given(documents(), st.integers(min_value=70, max_value=400))
def test_chunks_cover_the_text_exactly_and_never_cut_an_identifier(
        doc: tuple[str, list[tuple[list[str], list[str]]]], size: int) -> None:
    text, _ = doc
    pieces = split_chunks(text, size)
    assert "".join(p for _, p in pieces) == text
    assert all(len(p) <= size for _, p in pieces)
    assert [o for o, _ in pieces] == [sum(len(p) for _, p in pieces[:i])
                                      for i in range(len(pieces))]
    # Tokens are at most ~60 characters here, well under the chunk size: none is cut.
    assert [t for _, p in pieces for t in tokens(p)] == tokens(text)


def test_a_cut_prefers_a_newline_then_a_space_then_any_non_identifier_character() -> None:
    assert split_chunks("aaaa bbbb\ncccc dddd eeee", 16)[0][1] == "aaaa bbbb\n"
    assert split_chunks("aaaa bbbb cccc dddd", 12)[0][1] == "aaaa bbbb "
    assert split_chunks("aaaa,bbbb,cccc,dddd", 12)[0][1] == "aaaa,bbbb,"


def test_a_token_longer_than_a_chunk_is_cut_hard() -> None:
    assert split_chunks("x" * 25, 10) == [(0, "x" * 10), (10, "x" * 10), (20, "x" * 5)]


def test_chunks_of_a_message_carry_seq_and_offsets_into_its_searchable_text() -> None:
    output = "".join(f"line {i}: ok in module_{i}.py\n" for i in range(2000))
    message = Message(role="user", content=[ToolResultBlock(tool_use_id="t", content=output)])
    chunks = message_chunks(message, seq=3, chunk_chars=1000)
    assert len(chunks) > 10
    for chunk in chunks:
        assert chunk.seq == 3 and len(chunk.text) <= 1000
        assert output[chunk.offset:chunk.offset + len(chunk.text)] == chunk.text
        assert chunk.text.endswith("\n")  # cut at a line end
    assert message_chunks(message, seq=3, chunk_chars=1000) == chunks  # deterministic


def test_the_largest_shared_tool_output_derives_into_bounded_chunks() -> None:
    conversation = load_conversation_file(TRANSCRIPTS / "psf__requests-1142.json")
    message = conversation.messages[-1]
    text = searchable_text(message)
    assert len(text) > 860_000
    chunks = message_chunks(message, seq=142)
    assert "".join(c.text for c in chunks) == text  # this output has words in every chunk
    assert all(len(c.text) <= CHUNK_CHARS for c in chunks)
    # PostgreSQL's limits: a lexeme under 2 KB, a tsvector far under 1 MB.
    assert max(len(w.encode()) for c in chunks for w in c.index_text.split()) < 2048
    assert max(len(c.index_text.encode()) for c in chunks) < 200_000


# --- findable by whole form and by every part -----------------------------------------------------

@settings(max_examples=150)
@given(documents(), st.integers(min_value=70, max_value=400))
def test_every_identifier_is_found_by_its_whole_form_and_by_each_part(
        doc: tuple[str, list[tuple[list[str], list[str]]]], size: int) -> None:
    text, items = doc
    chunk_words = [(p, words_of(p)) for _, p in split_chunks(text, size)]
    for segments, connectors in items:
        token = join(segments, connectors)
        holder = next(words for piece, words in chunk_words if token in tokens(piece))
        # every contiguous run of segments (a suffix, a prefix, the whole, one segment) ...
        for i in range(len(segments)):
            for j in range(i + 1, len(segments) + 1):
                part = join(segments[i:j], connectors[i:j - 1])
                assert satisfies(parse_query(part), holder), (part, token)
        # ... and every CamelCase or digit part of a segment
        for segment in segments:
            for sub in re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+", segment):
                assert satisfies(parse_query(sub), holder), (sub, token)


# --- queries -------------------------------------------------------------------------------------

def test_a_query_renders_every_word_quoted_for_both_backends() -> None:
    query = parse_query('ACCT-90417 AND "NEAR(" * col:x')
    assert query.fts5() == ('("acctqxh90417" OR ("acct" AND "90417")) AND "and" AND "near" '
                            'AND ("colqxcx" OR ("col" AND "x"))')
    assert query.tsquery("any") == ("('acctqxh90417' | ('acct' & '90417')) | 'and' | 'near' | "
                                    "('colqxcx' | ('col' & 'x'))")
    assert query.fts5("any-exact") == '"acctqxh90417" OR "and" OR "near" OR "colqxcx"'


def test_a_repeated_term_is_searched_once_and_a_single_term_has_no_fallback() -> None:
    query = parse_query("base.py BASE.PY base.py")
    assert len(query.terms) == 1
    assert [t.match for t in query.tiers()] == ["exact", "all"]


def test_the_exact_tiers_ask_for_whole_words_and_come_first() -> None:
    query = parse_query("ACCT-90417 ledger")
    exact, all_, any_exact, any_ = query.tiers()
    assert (exact.match, exact.fts5, exact.tsquery) == (
        "exact", '"acctqxh90417" AND "ledger"', "'acctqxh90417' & 'ledger'")
    assert all_.fts5 == '("acctqxh90417" OR ("acct" AND "90417")) AND "ledger"'
    assert (any_exact.match, any_exact.tsquery) == ("any-exact", "'acctqxh90417' | 'ledger'")
    assert any_.match == "any"
    assert [t.fallback for t in query.tiers()] == [False, False, True, True]


def test_plain_words_have_no_exact_tiers() -> None:
    assert [t.match for t in parse_query("timeout error").tiers()] == ["all", "any"]


def test_a_term_too_long_to_be_whole_is_asked_for_by_its_parts_in_every_tier() -> None:
    query = parse_query("_".join(["segment"] * 40) + " other")
    assert query.fts5("exact") == '("segment") AND "other"'


@pytest.mark.parametrize("text", ["", "   \n", "***", '"()"', "- : ^", "\x00\x00", "\ud800",
                                  "!@#$%^&*()"])
def test_a_query_with_nothing_to_search_is_a_clear_input_error(text: str) -> None:
    with pytest.raises(InvalidInputError, match="search query"):
        parse_query(text)


def test_an_oversized_query_is_refused_with_its_limits() -> None:
    with pytest.raises(InvalidInputError, match=f"at most {MAX_QUERY_CHARS:,}"):
        parse_query("x" * (MAX_QUERY_CHARS + 1))
    many = " ".join(f"word{i}" for i in range(MAX_QUERY_TERMS + 1))
    with pytest.raises(InvalidInputError, match=f"at most {MAX_QUERY_TERMS}"):
        parse_query(many)
    parse_query(" ".join(f"word{i}" for i in range(MAX_QUERY_TERMS)))


def test_a_match_mode_other_than_all_or_any_is_refused() -> None:
    with pytest.raises(ValueError, match="exact, all, any-exact, any"):
        parse_query("x").fts5("some")  # type: ignore[arg-type]


_FTS5_SYNTAX = re.compile(r'"(?:[^"]|"")+"|AND|OR|\(|\)| ')
_TS_SYNTAX = re.compile(r"'(?:[^'\\]|''|\\\\)+'|&|\||\(|\)| ")
_HOSTILE = st.sampled_from(['"', "'", "(", ")", "AND", "OR", "NOT", "NEAR(", "*", ":", "-",
                            "^", "col:", "\x00", "\\", "&", "|", "!", "<->", "{", "}", "+",
                            "ACCT-90417", "'); DROP TABLE t;--", "\ud800", "é", "²", "ǅ"])


def balanced(rendered: str) -> bool:
    depth = 0
    for char in re.sub(r'"(?:[^"]|"")*"|\'(?:[^\']|\'\')*\'', "", rendered):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


@settings(max_examples=300)
@given(st.lists(st.one_of(_HOSTILE, st.text(max_size=12)), max_size=12).map("".join))
def test_any_query_renders_to_quoted_words_and_operators_only(text: str) -> None:
    try:
        query = parse_query(text)
    except InvalidInputError as refused:
        assert not re.search(r"\w", text) or "at most" in str(refused)
        return
    modes: tuple[Match, ...] = ("exact", "all", "any-exact", "any")
    for match in modes:
        fts5, tsq = query.fts5(match), query.tsquery(match)
        assert fts5 and _FTS5_SYNTAX.sub("", fts5) == "" and balanced(fts5)
        assert tsq and _TS_SYNTAX.sub("", tsq) == "" and balanced(tsq)
        assert "\x00" not in fts5 + tsq
        (fts5 + tsq).encode("utf-8")  # no lone surrogate reaches a driver
