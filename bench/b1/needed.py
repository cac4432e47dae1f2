"""Needed-context recall, and the identifier digest every B1 system gets as its summarizer.

**The measure** (issue 11). A compactor is good if the request for call k still holds what the
model goes on to use in its answer. For each call k -- the request made before the transcript's
assistant message k -- NEED_k is the set of code identifiers that message k names and that some
earlier message of the transcript named too (what the agent took from its context, not what it
made up); recall_k is the share of NEED_k the request holds. Aggregated over calls as a
micro-average (present / needed, summed over calls), over the calls from each transcript's first
compaction on, and as the number of calls under 0.5. The no-compaction baseline scores 1.0:
its request holds every earlier message whole.

**Identifiers** (:func:`identifiers`), the issue's definition, made precise:

- paths: a run of ``[\\w.-]`` segments joined by ``/`` holding a letter, whose last segment has
  a file extension or which has three segments or more (``django/db/models/sql/query.py``,
  ``/testbed/src``; not ``and/or`` nor ``10/24/2024``); a leading ``/``, ``./`` or ``~/`` is left
  out;
- dotted names: two components or more, each ``[A-Za-z_]\\w*``, the longest of 3+ characters
  (``self.alias_map``, ``base.py``; not ``e.g``);
- snake_case names of 6+ characters holding an underscore and a letter (``alias_map``,
  ``_pytest``, ``__init__``);
- CamelCase names of 6+ characters with a case change inside (``FilteredRelation``, ``getState``,
  ``HTTPError``; not ``Django`` nor ``README``);
- numbers of 4+ digits (``90417`` in ``ACCT-90417``; a hyphen separates, so ``2024-01-15`` names
  ``2024``).

A dotted run whose components are not all names (``v1.2``, ``3.14159``) is read as its
components. A path is counted whole; its segments are not identifiers of their own.

**Presence** (:func:`mentioned`): an identifier is in a text when it occurs there with no word
character on either side (``alias_map`` is in ``self.alias_map``, ``query.py`` in
``sql/query.py``, ``90417`` is not in ``190417``); case matters. The same rule decides "named
earlier in the transcript" and "held by the request". A message's text is everything it says
(:func:`message_text`): text blocks, each tool call's name and input strings (not JSON-escaped),
tool output and thinking. The system prompt is part of every request, not of "earlier".

**Why not sessionfold's own finders.** ``b1`` is imported by the peers' own virtualenvs, which
have no sessionfold (this module needs only the standard library and ``b1.counting``). And
neither fits: ``sessionfold.core.retention.find_identifiers`` looks for tickets, paths, URLs and
hashes in authored text (the question "did a summary keep the span's ids"), without snake_case,
CamelCase, dotted names or plain numbers; ``sessionfold.core.searchtext`` indexes every word and
its parts, which is not a set of identifiers.

**The digest** (:func:`digest_summary`): the deterministic summarizer the issue gives every B1
system, so the measure compares policies, not summarizer luck -- the identifiers of what it is
given, most mentioned first (ties: most recent first), under a one-line heading, cut to a token
cap as counted by B1's counter. It reads the *material* of a summarizer prompt (the part holding
the conversation), not the instruction around it, and lists only identifiers the conversation
itself named (:func:`named_identifiers`, the ``only`` argument): a model summarizes what it is
shown, and does not take a framework's wrapping -- OpenHands' event class names, LangChain's XML
attributes, tool-call ids, sessionfold's stub wording -- for the agent's identifiers.

How B1 uses this (``b1.replay``, ``b1.results``, ``b1.fakes``):

- per transcript, once: ``need = need_sets(transcript.messages)`` (one set per call, in call
  order -- the order of ``TranscriptRun.requests``);
- per call k, on the request the system returned:
  ``r = request_recall(need[k], request.system, request.messages)``, recorded as ``needed``
  and ``present`` in the call's ``RequestRecord`` (``r.missing`` is what the recall oracle asks
  for);
- per system run: ``recall_totals(t.requests for t in run.transcripts)``;
- the fake summarizer answers ``digest_summary(material, SUMMARY_TOKENS, counter=counter,
  only=named_identifiers(transcript.messages))``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from .counting import Counter

__all__ = [
    "CallCounts",
    "CallRecall",
    "RecallTotals",
    "digest_summary",
    "first_compaction",
    "identifiers",
    "mentioned",
    "message_text",
    "named_identifiers",
    "need_sets",
    "recall_answers",
    "recall_totals",
    "request_recall",
    "request_text",
    "without_recall_echo",
]

Message = Mapping[str, Any]

_RUN = re.compile(r"[\w./~-]+")
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,7}$")
_NAME = re.compile(r"[A-Za-z_]\w*")
_CAMEL = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_CASE_CHANGE = re.compile(r"[a-z0-9][A-Z]|[A-Z]{2}[a-z]")
_NUMBER = re.compile(r"[0-9]{4,}")
_EDGES = "./-~"
MIN_NAME_CHARS = 6
#: sessionfold's recall tool (``sessionfold.core.frame.RECALL_TOOL_NAME``; a test checks they
#: agree): the one tool whose calls and answers the measure reads apart.
RECALL_TOOL = "sessionfold_recall"
DIGEST_HEADING = "Summary of the earlier steps: the identifiers they named, most mentioned first:"
DIGEST_EMPTY = "Summary of the earlier steps: they named no code identifiers."


# --- identifiers ---------------------------------------------------------------------------------

def _path(run: str) -> str | None:
    path = run.strip(_EDGES)
    segments = [s for s in path.split("/") if s]
    if "/" not in path or not re.search(r"[A-Za-z]", path):
        return None
    if _EXTENSION.search(segments[-1]) or len(segments) >= 3:
        return path
    return None


def _name(piece: str) -> Iterator[str]:
    """The identifier(s) a piece without ``/`` or ``-`` is, if any."""
    if "." in piece:
        components = piece.split(".")
        if (all(_NAME.fullmatch(c) for c in components)
                and max(len(c) for c in components) >= 3):
            yield piece
            return
        for component in components:
            yield from _name(component)
        return
    if _is_snake(piece) or _is_camel(piece) or _NUMBER.fullmatch(piece):
        yield piece


def _is_snake(piece: str) -> bool:
    return (len(piece) >= MIN_NAME_CHARS and "_" in piece and _NAME.fullmatch(piece) is not None
            and re.search(r"[A-Za-z]", piece) is not None)


def _is_camel(piece: str) -> bool:
    return (len(piece) >= MIN_NAME_CHARS and _CAMEL.fullmatch(piece) is not None
            and _CASE_CHANGE.search(piece) is not None)


def _occurrences(text: str) -> Iterator[str]:
    for match in _RUN.finditer(text):
        run = match.group()
        path = _path(run) if "/" in run else None
        if path is not None:
            yield path
            continue
        for piece in re.split(r"[/~-]", run):
            piece = piece.strip(_EDGES)
            if piece:
                yield from _name(piece)


def identifiers(text: str) -> list[str]:
    """The distinct identifiers ``text`` names, in order of first mention."""
    return list(dict.fromkeys(_occurrences(text)))


def mentioned(text: str, identifier: str) -> bool:
    """Whether ``text`` holds ``identifier`` with no word character on either side."""
    size = len(identifier)
    at = text.find(identifier)
    while at >= 0:
        before = text[at - 1] if at else " "
        after = text[at + size] if at + size < len(text) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return True
        at = text.find(identifier, at + 1)
    return False


# --- what a message and a request say ----------------------------------------------------------

def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield json.dumps(value)


def _block_texts(block: Any) -> Iterator[str]:
    if not isinstance(block, Mapping):
        return
    kind = block.get("type")
    if kind == "text":
        yield str(block.get("text", ""))
    elif kind == "tool_use":
        yield str(block.get("name", ""))
        yield from _strings(block.get("input", {}))
    elif kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            yield content
        else:
            for part in content:
                yield from _block_texts(part)
    elif kind == "thinking":
        yield str(block.get("thinking", ""))


def message_text(message: Message) -> str:
    """Everything ``message`` says, one piece per line."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "\n".join(t for block in content for t in _block_texts(block))


def request_text(system: str, messages: Sequence[Message]) -> str:
    """Everything a request sends: the system prompt and every message."""
    return "\n".join([system, *(message_text(m) for m in messages)])


# --- recall exchanges --------------------------------------------------------------------------
#
# A recall exchange names the identifiers it asks for twice without giving anything back: in the
# model's tool call (``{"query": "alias_map"}``) and in the first line of the answer, which
# sessionfold writes and which repeats the query ("3 matches for \"alias_map\" ..."). Counted,
# they would make a query that found nothing look like a recovery, in the call that asked and in
# every later request the exchange stays in. So a request is scored without them: the call's
# input left empty, the answer from its second line on (the excerpts copied from the ledger).

def _answer_body(content: Any) -> str:
    text = content if isinstance(content, str) else "\n".join(
        str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return text.partition("\n")[2]


def _recall_ids(messages: Sequence[Message]) -> set[str]:
    return {str(b.get("id")) for m in messages if m["role"] == "assistant"
            and not isinstance(m["content"], str) for b in m["content"]
            if isinstance(b, Mapping) and b.get("type") == "tool_use"
            and b.get("name") == RECALL_TOOL}


def _scored_block(block: Any, asked: AbstractSet[str]) -> Any:
    if not isinstance(block, Mapping):
        return block
    if block.get("type") == "tool_use" and block.get("name") == RECALL_TOOL:
        return {**block, "input": {}}
    if block.get("type") == "tool_result" and block.get("tool_use_id") in asked:
        return {**block, "content": _answer_body(block.get("content", ""))}
    return block


def without_recall_echo(messages: Sequence[Message]) -> list[Message]:
    """``messages`` as the measure reads them: recall calls without their input, recall answers
    without their first line (see above). Messages without recall come back as they are."""
    asked = _recall_ids(messages)
    if not asked:
        return list(messages)
    return [m if isinstance(m["content"], str) else
            {**m, "content": [_scored_block(b, asked) for b in m["content"]]}
            for m in messages]


def recall_answers(messages: Sequence[Message], tool_use_ids: AbstractSet[str]) -> str:
    """What the answers to the recall calls ``tool_use_ids`` copied from the ledger (their
    bodies, without the first line), joined."""
    return "\n".join(_answer_body(b.get("content", "")) for m in messages
                     if m["role"] == "user" and not isinstance(m["content"], str)
                     for b in m["content"] if isinstance(b, Mapping)
                     and b.get("type") == "tool_result" and b.get("tool_use_id") in tool_use_ids)


# --- need and recall ---------------------------------------------------------------------------

def named_identifiers(messages: Sequence[Message]) -> frozenset[str]:
    """Every identifier the messages of a conversation name (what a digest may list)."""
    return frozenset(i for m in messages for i in _occurrences(message_text(m)))


def need_sets(messages: Sequence[Message]) -> list[frozenset[str]]:
    """NEED_k for every assistant message of a transcript, in order (one per B1 call)."""
    out: list[frozenset[str]] = []
    earlier = ""
    for message in messages:
        text = message_text(message)
        if message["role"] == "assistant":
            out.append(frozenset(i for i in identifiers(text) if mentioned(earlier, i)))
        earlier += "\n" + text
    return out


@dataclass(frozen=True)
class CallRecall:
    """How much of one call's NEED its request held."""

    needed: int
    present: int
    #: The needed identifiers the request lacked, sorted (what a recall call would ask for).
    missing: tuple[str, ...]

    @property
    def recall(self) -> float:
        """present / needed; 1.0 for a call that needed nothing."""
        return self.present / self.needed if self.needed else 1.0


def request_recall(need: AbstractSet[str], system: str,
                   messages: Sequence[Message]) -> CallRecall:
    """The share of ``need`` the request ``(system, messages)`` holds."""
    text = request_text(system, messages)
    missing = tuple(sorted(i for i in need if not mentioned(text, i)))
    return CallRecall(needed=len(need), present=len(need) - len(missing), missing=missing)


# --- aggregation -------------------------------------------------------------------------------

class CallCounts(Protocol):
    """What B1 records per call that the aggregation reads (``RequestRecord`` once it carries
    ``needed`` and ``present``)."""

    @property
    def needed(self) -> int: ...

    @property
    def present(self) -> int: ...

    @property
    def tokens(self) -> int: ...

    @property
    def cached(self) -> int: ...


def first_compaction(calls: Sequence[CallCounts]) -> int | None:
    """The index of a transcript's first call whose request does not extend the previous one
    (its prompt-cache prefix broke: the window was compacted) -- the rule ``b1.results``
    counts prefix breaks by. None if the transcript never compacted."""
    for k in range(1, len(calls)):
        if calls[k].cached < calls[k - 1].tokens:
            return k
    return None


@dataclass(frozen=True)
class RecallTotals:
    """Needed-context recall of one system at one budget, over all its transcripts."""

    calls: int
    needed: int
    present: int
    #: Calls from each transcript's first compaction on (that call included).
    calls_after: int
    needed_after: int
    present_after: int
    #: Calls that needed something and got less than half of it.
    under_half: int

    @property
    def recall(self) -> float | None:
        """Micro-average over all calls; None if no call needed anything."""
        return self.present / self.needed if self.needed else None

    @property
    def recall_after(self) -> float | None:
        """Micro-average over the calls after the first compaction; None without any."""
        return self.present_after / self.needed_after if self.needed_after else None


def recall_totals(transcripts: Iterable[Sequence[CallCounts]]) -> RecallTotals:
    """Aggregate per-call counts, one sequence of calls per transcript."""
    calls = needed = present = calls_after = needed_after = present_after = under_half = 0
    for run in transcripts:
        start = first_compaction(run)
        for k, call in enumerate(run):
            if call.present > call.needed or call.present < 0:
                raise ValueError(f"call {k}: present {call.present} of needed {call.needed}")
            calls += 1
            needed += call.needed
            present += call.present
            under_half += call.needed > 0 and 2 * call.present < call.needed
            if start is not None and k >= start:
                calls_after += 1
                needed_after += call.needed
                present_after += call.present
    return RecallTotals(calls=calls, needed=needed, present=present, calls_after=calls_after,
                        needed_after=needed_after, present_after=present_after,
                        under_half=under_half)


# --- the digest summarizer ----------------------------------------------------------------------

@lru_cache(maxsize=1)
def _default_counter() -> Counter:
    return Counter()


def _ranked(text: str, only: AbstractSet[str] | None) -> list[str]:
    """Identifiers of ``text`` (those in ``only``, if given): most mentioned first, then most
    recently mentioned."""
    count: dict[str, int] = {}
    last: dict[str, int] = {}
    for position, found in enumerate(_occurrences(text)):
        if only is not None and found not in only:
            continue
        count[found] = count.get(found, 0) + 1
        last[found] = position
    return sorted(count, key=lambda i: (-count[i], -last[i]))


def _fit(text: str, cap_tokens: int, counter: Counter) -> str:
    ids = counter.ids(text, cache=False)
    return text if len(ids) <= cap_tokens else counter.decode(ids[:cap_tokens])


def digest_summary(messages_text: str, cap_tokens: int, *, counter: Counter | None = None,
                   only: AbstractSet[str] | None = None, first: Sequence[str] = ()) -> str:
    """A summary of ``messages_text`` as a model told to keep identifiers would write it: its
    identifiers (those in ``only``, when given: the ones the conversation named), most mentioned
    first, at most ``cap_tokens`` tokens (B1's counter).

    ``first``: identifiers the request asked the summary to keep (sessionfold's ``must_keep``),
    listed before the ranked ones, as a model following that instruction would -- but within
    the same cap: a model asked for more than its summary's length holds cannot list them all.

    Deterministic: the same text, cap, ``only`` and ``first`` give the same digest.
    """
    if cap_tokens < 1:
        raise ValueError(f"cap_tokens must be at least 1, got {cap_tokens}")
    counter = counter or _default_counter()
    asked = list(dict.fromkeys(first))
    listed = set(asked)
    ranked = asked + [found for found in _ranked(messages_text, only) if found not in listed]
    if not ranked:
        return _fit(DIGEST_EMPTY, cap_tokens, counter)
    budget = cap_tokens - counter.text(DIGEST_HEADING, cache=False)
    kept: list[str] = []
    for found in ranked:
        cost = counter.text(" " + found, cache=False) + 1  # the separating comma
        if cost > budget:
            continue  # a shorter identifier further down may still fit
        kept.append(found)
        budget -= cost
    digest = DIGEST_HEADING + " " + ", ".join(kept) + "." if kept else DIGEST_HEADING
    # Tokens of joined text are not always the sum of the parts: trim until the cap holds.
    while kept and counter.text(digest, cache=False) > cap_tokens:
        kept.pop()
        digest = DIGEST_HEADING + " " + ", ".join(kept) + "." if kept else DIGEST_HEADING
    return _fit(digest, cap_tokens, counter)
