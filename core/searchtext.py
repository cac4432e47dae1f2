"""Identifier-aware search text: the words the ledger's full-text index holds, and safe queries.

Why this exists: the databases' stock tokenizers miss identifiers, which are what an agent asks
its ledger for. SQLite FTS5 reads ``ACCT-90417`` as a column filter and rejects a path unless it
is quoted; PostgreSQL's ``simple`` configuration keeps ``django/core/management/base.py`` as one
token (so ``base.py`` misses it) yet splits ``self.missing_args_message`` at the underscores (so
``missing_args_message`` misses it), and ``english`` stems. So the words to index are derived
here, in Python, when a message is appended -- every identifier whole *and* its parts -- and
both backends index that derived text with a plain tokenizer. Queries are derived by the same
code, so both sides agree by construction, and rendered with every word quoted, so no query can
be a syntax error.

Document side
-------------
:func:`searchable_text` is what a message says: its text blocks, each ``tool_use`` as its name
and its input's keys and scalar values (``command: view``, one per line, strings unescaped),
each ``tool_result``'s text, and thinking text (a fold's ``drop-thinking`` layer takes it out of
the window first, so it is exactly what recall must be able to find; its signature is opaque and
skipped). Images, documents and redacted thinking hold no searchable text. Blocks are joined by
a blank line; a message whose only text is one tool output has that output as its searchable
text, so chunk offsets are offsets into the output (recall pages a huge original by them).

:func:`message_chunks` cuts that text into :class:`SearchChunk` s of at most
:data:`CHUNK_CHARS` characters (PostgreSQL refuses a tsvector over 1 MB and caps positions at
16,383; a chunk also serves as the excerpt a query answers with). A cut falls on the last
newline of the chunk's second half, else on its last whitespace, else on its last character
that cannot be part of an identifier, so no identifier is cut in half -- except a single run of
identifier characters longer than a chunk, which is cut hard at the chunk size. Chunks cover the
text exactly (their texts concatenate to it); a chunk with no words is left out.

Index words
-----------
A *token* is a maximal run of word characters (``\\w``) and the connectors ``. / \\ - : @ + ~ #``
that starts and ends with a word character (``ACCT-90417``, ``base.py:123``,
``self.missing_args_message``, ``https://python.org/x``). Each token yields, lower-cased:

- the whole token;
- split at ``: @ + ~ #``, then at ``/ \\`` (path segments), then ``.``, then ``-``, then ``_``:
  every piece, recursively, and at the path and dotted levels every suffix
  (``management/base.py``, ``base.py``; ``missing_args_message``) -- at most
  :data:`MAX_SUFFIXES` per level, each at most :data:`MAX_WORD_CHARS` long;
- within a piece with no connector left, its CamelCase and letter/digit parts
  (``FilteredRelation`` -> ``filtered``, ``relation``; ``sha256`` -> ``sha``, ``256``).

A piece longer than :data:`MAX_WORD_CHARS` is not indexed whole (its parts are): PostgreSQL
skips words over 2 KB, and nobody types such a word into a query.

**The encoding of one index word** (:func:`index_word`). Both backends must read each derived
word as ONE token with their plain tokenizers -- FTS5 ``unicode61`` and PostgreSQL's default
parser behind ``to_tsvector('simple', ...)`` -- and both split at every connector, ``_``
included. So a word is written with letters and digits only: each connector becomes the
reserved sequence ``qx`` plus a code letter::

    _ qxu   . qxd   / qxs   \\ qxb   - qxh   : qxc   @ qxa   + qxp   ~ qxt   # qxo

and a literal ``qx`` in the text is written ``qxqx``, which keeps the encoding one-to-one
(``a.b`` and the word ``aqxdb`` differ). PostgreSQL's parser reads a word led by digits and an
exponent as a number (``1e5abc`` is ``1e5`` and ``abc``), so a word that starts with an ASCII
digit and is not all digits gets the prefix ``qxn``. Examples: ``base.py`` -> ``baseqxdpy``,
``ACCT-90417`` -> ``acctqxh90417``, ``missing_args_message`` -> ``missingqxuargsqxumessage``,
``2024-01-15`` -> ``qxn2024qxh01qxh15``. Words with letters outside ASCII are passed as they are:
the backend's tokenizer reads them the same way in the document and in the query, so matches
stay consistent even where a backend splits them.

Query side
----------
:func:`parse_query` reads free text with the same tokenizer. Each token becomes a
:class:`QueryTerm`: it matches a chunk holding its whole word, or holding all of its leaf parts
(so ``core/management``, which is not indexed whole, still finds
``django/core/management/base.py``). :meth:`SearchQuery.fts5` and :meth:`SearchQuery.tsquery`
render the terms for each backend with every word quoted (FTS5 ``"word"``, tsquery ``'word'``):
``AND``, ``NEAR(``, ``*``, ``"``, ``:`` and column-filter-looking input are literal text. A query
with nothing to search for, or too large, raises :class:`~sessionfold.core.errors.InvalidInputError`
with a message the caller can show as it is. The query language is words, nothing else.

Ranking semantics: :meth:`SearchQuery.tiers` lists up to four match modes, strictest first,
and the store's search runs them in order, ranking each by FTS5 ``bm25`` / PostgreSQL
``ts_rank_cd`` (ties: newest seq first) and appending the chunks not already found, until it has
its limit:

1. ``exact``: every term by its whole word (a term never indexed whole by its parts);
2. ``all``: every term, by its whole word or all of its parts;
3. ``any-exact`` and 4. ``any``: the same for at least one term -- the *fallback* tiers
   (:attr:`SearchTier.fallback`), run only when tiers 1-2 found nothing and only for a query
   of several terms; the answer should say it fell back.

Whole words come first because bm25 favours short documents: without the ``exact`` tiers a
short message holding ``ACCT-90418`` and ``90417`` out-ranks the long file that holds
``ACCT-90417`` itself (both hold the words ``acct`` and ``90417``). An ``exact`` tier is left
out when no term has parts (it would equal the tier after it).

Backends (what the store's tables look like)::

    -- SQLite: the default tokenizer; never porter (it stems)
    CREATE VIRTUAL TABLE ledger_search USING fts5(index_text, tokenize = 'unicode61');
    SELECT ... WHERE ledger_search MATCH :fts5 ORDER BY bm25(ledger_search);
    -- PostgreSQL: always name 'simple' (the default configuration may be 'english')
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', index_text)) STORED,
    CREATE INDEX ... USING gin (tsv);
    SELECT ... WHERE tsv @@ to_tsquery('simple', :tsq)
               ORDER BY ts_rank_cd(tsv, to_tsquery('simple', :tsq)) DESC;

Derivation is deterministic: the same message gives the same chunks, so the index rows of a
message can be re-derived to delete them (FTS5's ``delete`` command needs the indexed values).
:data:`SEARCH_TEXT_VERSION` changes whenever the derivation does; an index built by another
version must be rebuilt.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from .errors import InvalidInputError
from .messages import (
    Message,
    OpaqueBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = [
    "CHUNK_CHARS",
    "MAX_QUERY_CHARS",
    "MAX_QUERY_TERMS",
    "MAX_SUFFIXES",
    "MAX_WORD_CHARS",
    "SEARCH_TEXT_VERSION",
    "Match",
    "QueryTerm",
    "SearchChunk",
    "SearchQuery",
    "SearchTier",
    "index_text",
    "index_word",
    "message_chunks",
    "parse_query",
    "searchable_text",
    "split_chunks",
    "token_words",
    "tokens",
]

#: Bumped whenever the words derived from a text change: an index built by another version
#: must be rebuilt (old rows would not match new queries).
SEARCH_TEXT_VERSION = 1
#: Most characters of source text in one chunk.
CHUNK_CHARS = 8192
#: Longest piece indexed as one word (in source characters).
MAX_WORD_CHARS = 200
#: Most suffixes indexed per path or dotted piece (the ones nearest its end).
MAX_SUFFIXES = 16
#: Longest query, and most distinct terms in one.
MAX_QUERY_CHARS = 2000
MAX_QUERY_TERMS = 32

Match = Literal["exact", "all", "any-exact", "any"]

_CONNECTORS = "./\\-:@+~#"
_TOKEN = re.compile(r"\w(?:[\w./\\\-:@+~#]*\w)?")
# Connectors by level, outermost first: a URL or "path:line" splits at ":" before its path does.
_LEVELS = (
    re.compile(r"[:@+~#]"),
    re.compile(r"[/\\]"),
    re.compile(r"\."),
    re.compile(r"-"),
    re.compile(r"_"),
)
_SUFFIX_LEVELS = frozenset({1, 2})
_CODES = {"_": "u", ".": "d", "/": "s", "\\": "b", "-": "h", ":": "c", "@": "a", "+": "p",
          "~": "t", "#": "o"}
_ESCAPE = re.compile(r"qx|[_./\\\-:@+~#]")
# CamelCase and letter/digit parts of an ASCII piece (a piece with other letters is one part:
# a case boundary inside it cannot be told from ASCII rules).
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# The start of a word (in space-separated words) led by ASCII digits and not all ASCII digits.
_DIGIT_LED = re.compile(r"(?<![^ ])(?=[0-9]+[^0-9 ])")
_PLAIN = re.compile(r"[a-z]+|[0-9]+")
_NON_TOKEN = re.compile(r"[^\w./\\\-:@+~#]")
_WHITESPACE = " \t\n\r\f\v"


# --- words ----------------------------------------------------------------------------------------

def _escape(match: re.Match[str]) -> str:
    found = match.group()
    return "qxqx" if found == "qx" else "qx" + _CODES[found]


def _encode(words: str) -> str:
    """Space-separated source words as index words (one regex pass for all of them)."""
    encoded = _ESCAPE.sub(_escape, words.lower())
    return _DIGIT_LED.sub("qxn", encoded)


def index_word(piece: str) -> str:
    """``piece`` (a token or a part of one) as one index word: lower-cased, each connector as
    ``qx`` + its code letter, a literal ``qx`` as ``qxqx``, ``qxn`` before a word that starts
    with an ASCII digit and is not all ASCII digits (see the module docstring).

    ``piece`` holds no whitespace (no token does).
    """
    if not piece or any(c.isspace() for c in piece):
        raise InvalidInputError("an index word is made from one piece without whitespace, "
                                f"got {piece[:40]!r}")
    return _encode(piece)


def _split(piece: str, level: int) -> list[str]:
    return [p for p in (raw.strip(_CONNECTORS) for raw in _LEVELS[level].split(piece)) if p]


def _suffixes(piece: str, level: int) -> Iterator[str]:
    ends = [m.end() for m in _LEVELS[level].finditer(piece)][-MAX_SUFFIXES:]
    for end in ends:
        suffix = piece[end:].strip(_CONNECTORS)
        if suffix and len(suffix) <= MAX_WORD_CHARS:
            yield suffix


def _expand(piece: str, level: int, words: dict[str, None], leaves: dict[str, None]) -> None:
    """Add ``piece``, its suffixes and its parts (from ``level`` down) to ``words``, and its
    leaf parts to ``leaves`` (dicts as ordered sets)."""
    if len(piece) <= MAX_WORD_CHARS:
        words[piece] = None
    for lvl in range(level, len(_LEVELS)):
        if _LEVELS[lvl].search(piece) is None:
            continue
        if lvl in _SUFFIX_LEVELS:
            words.update(dict.fromkeys(_suffixes(piece, lvl)))
        for part in _split(piece, lvl):
            _expand(part, lvl + 1, words, leaves)
        return
    subs = _CAMEL.findall(piece) if piece.isascii() else [piece]
    for sub in subs if len(subs) > 1 else (piece,):
        if len(sub) <= MAX_WORD_CHARS:
            words[sub] = None
            leaves[sub] = None


def _derive(token: str) -> tuple[list[str], list[str]]:
    words: dict[str, None] = {}
    leaves: dict[str, None] = {}
    _expand(token, 0, words, leaves)
    return list(words), list(leaves)


def token_words(token: str) -> list[str]:
    """Every index word of one token, encoded: the whole token first, then its suffixes and
    parts (each once)."""
    words = _token_index_text(token)
    return words.split(" ") if words else []


@lru_cache(maxsize=32_768)
def _token_index_text(token: str) -> str:
    # Cached: a tool output repeats its tokens (the 868 K-character diff holds ~21 K distinct
    # ones among ~121 K), and a cache hit costs no Python frame.
    if len(token) <= MAX_WORD_CHARS and _PLAIN.fullmatch(token) and "qx" not in token:
        return token  # a lower-case word or a number is its own only word
    words = _derive(token)[0]
    if not words:
        return ""  # one run of letters longer than MAX_WORD_CHARS: not searchable
    return " ".join(dict.fromkeys(_encode(" ".join(words)).split(" ")))


def tokens(text: str) -> list[str]:
    """The tokens of ``text`` in order (see the module docstring)."""
    return _TOKEN.findall(text)


def index_text(text: str) -> str:
    """The words to index for ``text``: each token's words, space-separated, in text order
    (a token repeated in the text is repeated here, so term frequency still counts)."""
    return " ".join(filter(None, map(_token_index_text, _TOKEN.findall(text))))


# --- what a message says -------------------------------------------------------------------------

def _input_lines(value: Any, out: list[str], key: str | None = None) -> None:
    if isinstance(value, dict):
        if key is not None:
            out.append(key)
        for k, v in value.items():
            _input_lines(v, out, str(k))
    elif isinstance(value, list | tuple):
        if key is not None:
            out.append(key)
        for item in value:
            _input_lines(item, out)
    elif isinstance(value, bool) or value is None:
        if key is not None:
            out.append(key)
    else:  # str, int, float: strings as they are (not JSON-escaped), numbers as printed
        out.append(f"{key}: {value}" if key is not None else str(value))


def _block_texts(message: Message) -> Iterator[str]:
    for block in message.blocks():
        if isinstance(block, TextBlock):
            yield block.text
        elif isinstance(block, ToolUseBlock):
            lines = [block.name]
            _input_lines(block.input, lines)
            yield "\n".join(lines)
        elif isinstance(block, ToolResultBlock):
            yield block.output_text()
        elif isinstance(block, ThinkingBlock):
            yield block.thinking
        elif isinstance(block, OpaqueBlock):
            # A server tool's call or result, an MCP call: its values, as a tool input's are.
            lines = [block.type]
            _input_lines(block.model_dump(mode="json", exclude={"type"}), lines)
            yield "\n".join(lines)
        # image, document, redacted_thinking: nothing a query can name


def searchable_text(message: Message) -> str:
    """What ``message`` says, as one text: its blocks' texts joined by a blank line."""
    return "\n\n".join(t for t in _block_texts(message) if t)


# --- chunks ------------------------------------------------------------------------------------

def _cut(text: str, start: int, size: int) -> int:
    """Where the chunk that starts at ``start`` ends (exclusive)."""
    end = start + size
    if end >= len(text):
        return len(text)
    newline = text.rfind("\n", start + size // 2, end)
    if newline >= 0:
        return newline + 1
    space = max(text.rfind(c, start, end) for c in _WHITESPACE)
    if space > start:
        return space + 1
    found = _NON_TOKEN.search(text[start:end][::-1])
    if found is not None and end - found.end() > start:
        return end - found.end() + 1
    return end  # one run of identifier characters longer than a chunk: cut hard


def split_chunks(text: str, chunk_chars: int = CHUNK_CHARS) -> list[tuple[int, str]]:
    """``text`` as ``(offset, piece)`` pairs of at most ``chunk_chars`` characters each, cut
    between tokens where possible; the pieces concatenate to ``text``."""
    if chunk_chars < 1:
        raise InvalidInputError(f"chunk_chars must be at least 1, got {chunk_chars}")
    out: list[tuple[int, str]] = []
    start = 0
    while start < len(text):
        end = _cut(text, start, chunk_chars)
        out.append((start, text[start:end]))
        start = end
    return out


@dataclass(frozen=True, slots=True)
class SearchChunk:
    """One row of the search index: a piece of message ``seq``'s searchable text.

    ``offset`` is where ``text`` starts in :func:`searchable_text` of the message; ``text`` is
    the source (the excerpt an answer shows); ``index_text`` is what the backend tokenizes.
    """

    seq: int
    offset: int
    text: str
    index_text: str


def message_chunks(message: Message, seq: int, *,
                   chunk_chars: int = CHUNK_CHARS) -> list[SearchChunk]:
    """The index rows of ledger message ``seq``, in text order (none for a message with no
    searchable words)."""
    chunks = []
    for offset, piece in split_chunks(searchable_text(message), chunk_chars):
        words = index_text(piece)
        if words:
            chunks.append(SearchChunk(seq=seq, offset=offset, text=piece, index_text=words))
    return chunks


# --- queries -----------------------------------------------------------------------------------

def _fts5_word(word: str) -> str:
    return '"' + word.replace('"', '""') + '"'


def _ts_word(word: str) -> str:
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'"


@dataclass(frozen=True, slots=True)
class QueryTerm:
    """One token of a query: it matches a chunk that holds ``whole``, or all of ``parts``.

    ``whole`` is ``None`` for a token longer than :data:`MAX_WORD_CHARS` (never indexed whole);
    ``parts`` is empty for a token with one part (a plain word). Both are encoded index words.
    """

    whole: str | None
    parts: tuple[str, ...]

    def words(self) -> tuple[str, ...]:
        return ((self.whole,) if self.whole else ()) + self.parts

    def _render(self, quote: Callable[[str], str], and_: str, or_: str, *,
                exact: bool = False) -> str:
        alternatives = []
        if self.whole is not None:
            alternatives.append(quote(self.whole))
        if self.parts and not (exact and alternatives):
            alternatives.append("(" + and_.join(quote(p) for p in self.parts) + ")")
        if len(alternatives) == 1:
            return alternatives[0]
        return "(" + or_.join(alternatives) + ")"


@dataclass(frozen=True, slots=True)
class SearchTier:
    """One search the store runs for a query (see the module docstring's ranking semantics)."""

    match: Match
    #: The FTS5 ``MATCH`` expression and the ``to_tsquery('simple', ...)`` argument.
    fts5: str
    tsquery: str
    #: A fallback tier: skipped (with every later one) when the tiers before the first
    #: fallback tier found something.
    fallback: bool


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """A parsed query: its terms in query order, each once. Render with :meth:`fts5` or
    :meth:`tsquery`, or take the :meth:`tiers` to run; every rendering is a valid, non-empty
    query for its backend (bind it as a parameter)."""

    text: str
    terms: tuple[QueryTerm, ...]

    def fts5(self, match: Match = "all") -> str:
        """An FTS5 ``MATCH`` expression."""
        return self._render(_fts5_word, " AND ", " OR ", _match(match))

    def tsquery(self, match: Match = "all") -> str:
        """A ``to_tsquery('simple', ...)`` argument."""
        return self._render(_ts_word, " & ", " | ", _match(match))

    def tiers(self) -> tuple[SearchTier, ...]:
        """The searches to run, in order (see the module docstring): ``exact`` when some term
        has parts, ``all``; then, for a query of several terms, the fallback tiers
        ``any-exact`` (when some term has parts) and ``any``."""
        has_parts = any(t.whole is not None and t.parts for t in self.terms)
        modes: list[Match] = ["exact", "all"] if has_parts else ["all"]
        if len(self.terms) > 1:
            modes += ["any-exact", "any"] if has_parts else ["any"]
        return tuple(SearchTier(match=m, fts5=self.fts5(m), tsquery=self.tsquery(m),
                                fallback=m.startswith("any")) for m in modes)

    def _render(self, quote: Callable[[str], str], and_: str, or_: str, match: Match) -> str:
        joiner = or_ if match.startswith("any") else and_
        exact = match.endswith("exact")
        return joiner.join(t._render(quote, and_, or_, exact=exact) for t in self.terms)


_MATCHES: dict[str, Match] = {"exact": "exact", "all": "all", "any-exact": "any-exact",
                              "any": "any"}


def _match(match: str) -> Match:
    try:
        return _MATCHES[match]
    except KeyError:
        raise InvalidInputError(
            f"match must be one of {', '.join(_MATCHES)}; got {match!r}") from None


def _term(token: str) -> QueryTerm | None:
    words, leaves = _derive(token)
    whole = index_word(token) if words and words[0] == token else None
    parts = tuple(dict.fromkeys(index_word(p) for p in leaves))
    if parts == (whole,):
        parts = ()
    if whole is None and not parts:
        return None
    return QueryTerm(whole=whole, parts=parts)


def parse_query(text: str) -> SearchQuery:
    """The terms of a free-text query. InvalidInputError (a message to show as it is) for a
    query that is empty, holds no word or identifier, is longer than :data:`MAX_QUERY_CHARS`
    or has more than :data:`MAX_QUERY_TERMS` distinct terms."""
    if not isinstance(text, str):
        raise InvalidInputError(f"a search query is text, got {type(text).__name__}")
    if len(text) > MAX_QUERY_CHARS:
        raise InvalidInputError(
            f"the search query is {len(text):,} characters long; at most {MAX_QUERY_CHARS:,}: "
            "search for the words or identifiers that matter")
    if not text.strip():
        raise InvalidInputError("the search query is empty: give words or identifiers to "
                                "search for (a file name, a function, an id)")
    terms: dict[QueryTerm, None] = {}
    for token in _TOKEN.findall(text):
        term = _term(token)
        if term is not None:
            terms[term] = None
    if not terms:
        raise InvalidInputError(
            f"the search query {text[:60]!r} holds no word or identifier to search for "
            "(punctuation and symbols are not searched)")
    if len(terms) > MAX_QUERY_TERMS:
        raise InvalidInputError(
            f"the search query has {len(terms)} distinct words; at most {MAX_QUERY_TERMS}: "
            "search for the identifiers that matter")
    return SearchQuery(text=text, terms=tuple(terms))
