"""The retention check: a summary must keep the identifiers its span named.

A summary that drops ``ACCT-8842``, ``django/db/models/sql/query.py`` or the URL of the failing
build is worse than no summary: the agent forgets exactly what it needs to continue. Before a
summary replaces a span, :func:`extract_identifiers` collects the identifiers the span's own
messages named and :func:`check_retention` measures how many of them the summary still mentions.

What counts as an identifier (each pattern below says why it is precise enough):

- ticket and record ids: ``ACCT-8842``, ``PROJ-12``, ``CVE-2024-3094``, ``GH-12``, ``gh-12``,
  ``INC0012345``;
- file paths: a slash-separated path ending in a file extension (``django/db/models/sql/query.py``)
  or starting with ``/``, ``./``, ``../`` or ``~/``; a bare file name with a well-known extension
  (``reproduce_issue.py``);
- URLs (``http``, ``https``, ``ftp``);
- issue and pull-request numbers: ``#1234``;
- hex commit ids of 7 to 40 characters holding both a digit and a letter.

Only text a person or the agent wrote is read: user text, assistant text and the string values
of ``tool_use`` inputs. Raw tool output is skipped (a directory listing or a traceback names
hundreds of paths nobody will ask about), and so are earlier summaries and notices handed over
as :class:`~sessionfold.core.frame.EarlierFold` (their identifiers are the previous summary's
business). A user message that merely looks like a summary is read like any other: it is one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .errors import InvalidInputError
from .frame import EarlierFold
from .messages import Message, TextBlock, ToolUseBlock

__all__ = [
    "IDENTIFIER_LIMIT",
    "RetentionResult",
    "check_retention",
    "excerpts",
    "extract_identifiers",
    "find_identifiers",
    "identifiers_remembered",
    "mentions",
]

#: The most identifiers of a span the retention check compares: its most recurring ones. A
#: summary is expected to carry this many whatever their length (the extractive summarizer lists
#: them all); the planner's ``RETENTION_LIMIT`` is this count.
IDENTIFIER_LIMIT = 40

# File extensions a bare file name must carry to count (a slash-separated path may carry any).
# Extensions that double as common attribute names (``math.log``, ``mock.patch``, ``django.conf``,
# ``self.h``, ``np.diff``) are left out: without a slash they are more often code than files.
_BARE_EXTENSIONS = (
    "cfg", "csv", "html", "ini", "ipynb", "java", "json", "jsonl", "jsx", "md", "php", "py", "pyi",
    "pyx", "rst", "scss", "sh", "sql", "toml", "tsx", "txt", "yaml", "yml",
)

_URL = re.compile(r"\b(?:https?|ftp)://[^\s<>\"'`()\[\]{}|\\^]+")
# Uppercase prefix (maybe several dash-separated parts), a dash, digits: ACCT-8842, CVE-2024-3094.
_TICKET = re.compile(r"(?<![\w-])(?:[A-Z][A-Z0-9]*[A-Z](?:-[A-Z0-9]+)*|gh|bpo)-[0-9]+(?![\w-])")
# ServiceNow-style: INC0012345, CHG0001234, RITM0012345.
_RECORD = re.compile(r"(?<![\w-])[A-Z]{2,5}[0-9]{5,10}(?![\w-])")
_ISSUE = re.compile(r"(?<![\w&/#])#[0-9]{1,7}(?![\w-])")
_SHA = re.compile(r"(?<![\w-])[0-9a-f]{7,40}(?![\w-])")
_PATH_CHARS = r"[\w.@+~-]"
_PATH = re.compile(
    rf"(?<![\w./~:-])"
    rf"(?:"
    # rooted: /x/y, ./x, ../x, ~/x (at least one path segment after the root)
    rf"(?:\.{{1,2}}/|~/|/){_PATH_CHARS}+(?:/{_PATH_CHARS}+)*/?"
    rf"|"
    # relative with at least one slash, ending in .ext
    rf"{_PATH_CHARS}+(?:/{_PATH_CHARS}+)+"
    rf"|"
    # a bare file name with a well-known extension
    rf"[\w-][\w.-]*\.(?:{'|'.join(_BARE_EXTENSIONS)})"
    rf")"
    rf"(?![\w/(-])"
)
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,7}$")

# Things that look like identifiers and are not: encodings, hash names, device files.
_STOP_TICKETS = {"UTF", "UCS", "SHA", "ISO", "AES", "MD", "X", "TLS", "SSL", "HTTP", "IPV", "UTC",
                 "GMT", "CP", "KOI", "WIN", "LATIN", "BASE"}
_STOP_PATHS = {"/", "./", "../", "~/"}
_TRAILING = ".,;:!?)]}'\"`"


@dataclass(frozen=True)
class RetentionResult:
    """How many of the span's identifiers a summary kept.

    ``ratio`` is ``len(kept) / len(identifiers)`` (1.0 for no identifiers); ``ok`` is
    ``ratio >= minimum``.
    """

    kept: tuple[str, ...]
    missing: tuple[str, ...]
    ratio: float
    ok: bool


def _clean_path(raw: str) -> str | None:
    path = raw.rstrip(".")
    if path in _STOP_PATHS or path.startswith(("/dev/", "/proc/")):
        return None
    rooted = path.startswith(("/", "./", "../", "~/"))
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if not rooted and not _EXTENSION.search(last):
        return None
    if path.startswith("/") and path.rstrip("/").count("/") == 1:
        # A lone "/word" or "/name.ext" is more often a fragment ("$(pwd)/x.log", a regex, a
        # unit) than a path someone will ask for; a real absolute path has two segments or more.
        return None
    if rooted and not _EXTENSION.search(last) and len(last) == 1:
        return None  # sed and regex addresses: '/return/p', '/pattern/i'
    if re.fullmatch(r"[0-9./_-]+", path):  # dates and numbers such as 10/24/2024 or 1.2/3.4
        return None
    return path


_DIGIT = re.compile(r"[0-9]")
# What every identifier holds: a digit (tickets, records, issues, shas), a slash (paths, URLs),
# or a dot before a letter (a bare file name's extension).
_CANDIDATE = re.compile(r"[0-9/]|\.[A-Za-z]")
_HEX_LETTERS = re.compile(r"[a-f]")
#: Texts up to this size have their identifiers remembered, the last 2,048 of them (a fold reads
#: its span twice: the summarizer's wanted list and the retention check): 16 M characters at most.
#: Larger texts are rare in authored text and scanned each time.
_MEMO_MAX_CHARS = 8_192


def find_identifiers(text: str) -> list[str]:
    """Every identifier occurrence in ``text``, in order (repeats included)."""
    if len(text) <= _MEMO_MAX_CHARS:
        return list(_remembered(text))
    return _scan(text)


@lru_cache(maxsize=2048)
def _remembered(text: str) -> tuple[str, ...]:
    return tuple(_scan(text))


def _scan(text: str) -> list[str]:
    # No pattern matches across whitespace, and each treats whitespace beside a match as it
    # treats the ends of the text. So only the whitespace-free runs holding a character some
    # identifier needs (``_CANDIDATE``) are scanned, joined by single spaces, in order: the same
    # identifiers in the same order, from about a quarter of the text on the shipped
    # transcripts. Within them, a pattern is skipped when a character it needs ("://", a digit,
    # "-", "#", "/" or ".") is absent.
    text = " ".join(run for run in text.split() if _CANDIDATE.search(run))
    found: list[tuple[int, str]] = []
    masked = text
    if "://" in text:
        urls = [(m.start(), m.end(), m.group().rstrip(_TRAILING)) for m in _URL.finditer(text)]
        found.extend((start, url) for start, _, url in urls)
        # Blank URLs out so their paths, anchors and hashes are not counted a second time.
        # One pass (slicing the whole text once per URL made a text of many links quadratic).
        pieces: list[str] = []
        last = 0
        for start, end, _ in urls:
            pieces += (text[last:start], " " * (end - start))
            last = end
        pieces.append(text[last:])
        masked = "".join(pieces)
    if _DIGIT.search(masked) is not None:
        if "-" in masked:
            for m in _TICKET.finditer(masked):
                token = m.group()
                if token.rsplit("-", 1)[0] not in _STOP_TICKETS:
                    found.append((m.start(), token))
        found.extend((m.start(), m.group()) for m in _RECORD.finditer(masked))
        if "#" in masked:
            found.extend((m.start(), m.group()) for m in _ISSUE.finditer(masked))
        for m in _SHA.finditer(masked):
            token = m.group()
            # Two letters at least: dates and numbers with one stray letter (d20191103) are
            # not shas.
            if _DIGIT.search(token) and len(_HEX_LETTERS.findall(token)) >= 2:
                found.append((m.start(), token))
    if "/" in masked or "." in masked:
        for m in _PATH.finditer(masked):
            path = _clean_path(m.group())
            if path is not None:
                found.append((m.start(), path))
    found.sort(key=lambda pair: pair[0])
    return [token for _, token in found]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _authored_text(message: Message) -> Iterator[str]:
    for block in message.blocks():
        if isinstance(block, TextBlock):
            yield block.text
        elif isinstance(block, ToolUseBlock):
            yield from _strings(block.input)


#: Inside :func:`identifiers_remembered`: the ranked identifiers of each message list asked for,
#: by the identities of its messages (the list is kept with them, so no identity is reused).
_REMEMBERED: ContextVar[dict[tuple[int, ...], tuple[tuple[Message, ...], list[str]]] | None] = (
    ContextVar("sessionfold_remembered_identifiers", default=None))


@contextmanager
def identifiers_remembered() -> Iterator[None]:
    """Within the block, :func:`extract_identifiers` reads the same messages once.

    A planner summarizing a span asks for the span's identifiers (the retention check's list)
    and the extractive summarizer asks again for the same message objects; the second answer
    comes from memory. Only the same objects in the same order match, and only inside the
    block, where the caller does not change the messages it passes.
    """
    token = _REMEMBERED.set({})
    try:
        yield
    finally:
        _REMEMBERED.reset(token)


def extract_identifiers(messages: Sequence[Message], *, exclude: str = "",
                        limit: int = IDENTIFIER_LIMIT) -> list[str]:
    """The identifiers ``messages`` named, the most recurring first, at most ``limit``.

    Ties keep the order of first mention. Identifiers that ``exclude`` (an earlier summary's
    text) already mentions are left out: they are that summary's to keep.
    """
    if limit < 0:
        raise InvalidInputError(f"limit must be >= 0, got {limit}")
    authored = tuple(m for m in messages if not isinstance(m, EarlierFold))
    remembered = _REMEMBERED.get()
    if remembered is None:
        ranked = _ranked_identifiers(authored)
    else:
        key = tuple(map(id, authored))
        hit = remembered.get(key)
        if hit is None:
            hit = remembered[key] = (authored, _ranked_identifiers(authored))
        ranked = hit[1]
    if exclude:
        ranked = [t for t in ranked if not mentions(exclude, t)]
    return ranked[:limit]


def _ranked_identifiers(messages: Sequence[Message]) -> list[str]:
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    for message in messages:
        for text in _authored_text(message):
            for token in find_identifiers(text):
                counts[token] += 1
                first.setdefault(token, len(first))
    return sorted(counts, key=lambda t: (-counts[t], first[t]))


@lru_cache(maxsize=4096)
def _token_pattern(identifier: str) -> re.Pattern[str]:
    head = r"(?<![\w])" if re.match(r"\w", identifier) else ""
    tail = r"(?![\w])" if re.search(r"\w$", identifier) else ""
    return re.compile(head + re.escape(identifier) + tail)


def mentions(text: str, identifier: str) -> bool:
    """True if ``text`` names ``identifier`` as a whole token (``#12`` is not in ``#123``)."""
    if not identifier:
        return False
    return _token_pattern(identifier).search(text) is not None


def excerpts(messages: Sequence[Message], identifiers: Sequence[str], *,
             width: int = 160) -> list[tuple[int, str]]:
    """Where ``messages`` last named each of ``identifiers``: ``(message index, excerpt)``.

    The excerpt is the line of authored text (read as :func:`extract_identifiers` reads it)
    that holds the latest mention, cut to ``width`` characters either side of it (``…`` marks a
    cut). Excerpts of one message are joined, in the order of the message, one per line and
    each line once; messages come in span order. An identifier no message names (the caller
    asked for one from elsewhere) has no excerpt. This is what a summary repair reads instead
    of the whole span again: the places the missing identifiers came from, in context.
    """
    if width < 1:
        raise InvalidInputError(f"width must be at least 1, got {width}")
    found: dict[int, dict[tuple[int, int], str]] = {}  # message -> (text, cut) -> excerpt
    for identifier in dict.fromkeys(i for i in identifiers if i):
        latest = _latest_mention(messages, _token_pattern(identifier))
        if latest is not None:
            index, t, text, match = latest
            cut, excerpt = _line_around(text, match.start(), match.end(), width)
            found.setdefault(index, {})[(t, cut)] = excerpt
    return [(index, "\n".join(dict.fromkeys(found[index][key] for key in sorted(found[index]))))
            for index in sorted(found)]


def _latest_mention(messages: Sequence[Message], pattern: re.Pattern[str]
                    ) -> tuple[int, int, str, re.Match[str]] | None:
    """The last match of ``pattern`` in the messages' authored text: (message index, text
    index within the message, the text, the match); None if no message names it."""
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], EarlierFold):
            continue
        hit = None
        for t, text in enumerate(_authored_text(messages[index])):
            for match in pattern.finditer(text):
                hit = (index, t, text, match)
        if hit is not None:
            return hit
    return None


def _line_around(text: str, start: int, end: int, width: int) -> tuple[int, str]:
    """The line holding ``text[start:end]``, cut to ``width`` characters either side (``…``
    marks a cut): (where the cut starts, the excerpt)."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    cut_start, cut_end = max(line_start, start - width), min(line_end, end + width)
    excerpt = text[cut_start:cut_end].strip()
    return cut_start, ("…" if cut_start > line_start else "") + excerpt + (
        "…" if cut_end < line_end else "")


def check_retention(summary_text: str, identifiers: Sequence[str],
                    minimum: float) -> RetentionResult:
    """Which of ``identifiers`` ``summary_text`` mentions, and whether that is at least
    ``minimum`` (a fraction in [0, 1]) of them. No identifiers: ratio 1.0, ok."""
    if not 0 <= minimum <= 1:
        raise InvalidInputError(f"minimum must be a fraction in [0, 1], got {minimum}")
    unique = list(dict.fromkeys(identifiers))
    kept = tuple(i for i in unique if mentions(summary_text, i))
    missing = tuple(i for i in unique if i not in kept)
    ratio = len(kept) / len(unique) if unique else 1.0
    return RetentionResult(kept=kept, missing=missing, ratio=ratio, ok=ratio >= minimum)
