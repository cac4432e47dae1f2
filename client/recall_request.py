"""What a recall asks and what it gives back: :class:`RecallRequest`, :class:`RecallAnswer`.

A request is ledger rows by ``seq`` (as the window prints them: ``12``, ``"#12"``, ``"12-30"``,
``"#12–#30"``) with an ``offset`` to page a long original, or a text ``query``; a tool call's
``input`` is checked into one by :meth:`RecallRequest.from_input`. An answer is the text for the
tool result and what it came to (its outcome, from a closed set, for metrics). The answers are
written from the ledger by :mod:`.recall_ledger` and served by :mod:`.recall`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sessionfold.core.errors import InvalidInputError
from sessionfold.core.frame import RECALL_TOOL_NAME, seq_spec
from sessionfold.store import LedgerEntry, SessionInfo
from sessionfold.store.results import SearchHit

__all__ = [
    "RecallAnswer",
    "RecallKind",
    "RecallOutcome",
    "RecallRequest",
    "RecallStore",
    "parse_seq",
    "request_kind",
]

RecallKind = Literal["seq", "query", "unknown"]
RecallOutcome = Literal["served", "clipped", "unavailable", "no-match", "invalid"]

_SEQ_FORMS = '"12", "#12", "12-30" or "#12–#30"'
_MAX_DIGITS = 12  # past any ledger; int() of a 5,000-digit string is refused by Python anyway
_SEQ = re.compile(
    rf"(?:ledger\s*)?#?\s*(?P<start>[0-9]{{1,{_MAX_DIGITS}}})"
    rf"(?:\s*(?:-|–|—|\.\.)\s*#?\s*(?P<end>[0-9]{{1,{_MAX_DIGITS}}}))?",
    re.IGNORECASE)
_INPUT_KEYS = ("seq", "offset", "query")


def parse_seq(spec: object) -> tuple[int, int]:
    """``(start, end)`` of a ledger row or range as the window prints it.

    Takes ``12``, ``"12"``, ``"#12"``, ``"ledger #12"``, ``"12-30"``, ``"#12–#30"`` (en or em
    dash, ``..``); InvalidInputError, saying what is taken, for anything else.
    """
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 0:
            raise InvalidInputError(f"seq must not be negative, got {spec}")
        return spec, spec
    if not isinstance(spec, str):
        raise InvalidInputError(f"seq is a ledger row or range such as {_SEQ_FORMS}, got "
                                f"{type(spec).__name__}")
    match = _SEQ.fullmatch(spec.strip())
    if match is None:
        raise InvalidInputError(f"seq must be a ledger row or range such as {_SEQ_FORMS}; got "
                                f"{spec[:60]!r}")
    start = int(match["start"])
    end = int(match["end"]) if match["end"] is not None else start
    if end < start:
        raise InvalidInputError(f"the range #{start}–#{end} ends before it starts")
    return start, end


def _offset(value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 15:
        value = int(value.strip())  # a model may quote a number
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"offset must be a whole number of characters >= 0, got "
                                f"{str(value)[:40]!r}")
    return value


def _given(value: object) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


@dataclass(frozen=True, slots=True)
class RecallRequest:
    """One recall: ledger rows ``seq`` (first, last) from character ``offset`` of the first,
    or a text ``query`` over the session's ledger."""

    seq: tuple[int, int] | None = None
    query: str | None = None
    offset: int = 0

    def __post_init__(self) -> None:
        if (self.seq is None) == (self.query is None):
            raise InvalidInputError("give seq (ledger rows) or query (words to search for), "
                                    "not both")
        if self.query is not None and self.offset:
            raise InvalidInputError("offset pages the rows of a seq; a query answers with "
                                    "excerpts, each naming its seq and offset")
        _offset(self.offset)  # every way in (the tool, the CLI, code) meets the same check

    @property
    def kind(self) -> Literal["seq", "query"]:
        return "seq" if self.seq is not None else "query"

    @classmethod
    def from_input(cls, raw: object) -> RecallRequest:
        """The request a tool call's ``input`` makes; InvalidInputError says what is wrong."""
        if not isinstance(raw, Mapping):
            raise InvalidInputError(f"the input of {RECALL_TOOL_NAME} is an object with seq "
                                    f"or query, got {type(raw).__name__}")
        unknown = sorted(str(k)[:40] for k in raw if k not in _INPUT_KEYS)
        if unknown:
            raise InvalidInputError(f"unknown field(s) {unknown}; {RECALL_TOOL_NAME} takes "
                                    + ", ".join(_INPUT_KEYS))
        seq, query = raw.get("seq"), raw.get("query")
        if _given(seq) and _given(query):
            raise InvalidInputError("give seq or query, not both: ask twice for both")
        if _given(seq):
            offset = _offset(raw["offset"]) if raw.get("offset") is not None else 0
            return cls(seq=parse_seq(seq), offset=offset)
        if _given(query):
            if not isinstance(query, str):
                raise InvalidInputError(f"query is text, got {type(query).__name__}")
            if raw.get("offset"):
                return cls(query=query, offset=_offset(raw["offset"]))  # refused, saying why
            return cls(query=query.strip())
        raise InvalidInputError(f"give seq (ledger rows such as {_SEQ_FORMS}) or query (words "
                                "to search for)")


def request_kind(raw: object) -> RecallKind:
    """What kind of request a tool call's ``input`` meant, however malformed (for metrics)."""
    if isinstance(raw, Mapping):
        if _given(raw.get("seq")):
            return "seq"
        if _given(raw.get("query")):
            return "query"
    return "unknown"


# --- answers ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RecallAnswer:
    """What a recall gives back: ``text`` for the tool result, and what it came to.

    ``outcome``: ``served`` (everything asked for), ``clipped`` (cut at the cap; the text says
    where to go on, and ``next_offset``/``next_seq`` hold it for a caller), ``unavailable``
    (nothing could be given back: discarded, past the ledger, only recall exchanges, no room),
    ``no-match`` (a query found nothing), ``invalid`` (the request was malformed: an error
    result the model can correct). Label values for metrics come from these closed sets.
    """

    kind: RecallKind
    outcome: RecallOutcome
    text: str
    tokens: int
    next_seq: tuple[int, int] | None = None
    next_offset: int | None = None

    @property
    def is_error(self) -> bool:
        return self.outcome == "invalid"

    def tool_result(self, tool_use_id: str) -> dict[str, Any]:
        """The Anthropic ``tool_result`` block answering call ``tool_use_id``."""
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id,
                                 "content": self.text}
        if self.is_error:
            block["is_error"] = True
        return block

    def openai_message(self, tool_call_id: str) -> dict[str, Any]:
        """The OpenAI chat ``tool`` message answering call ``tool_call_id``."""
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.text}

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "outcome": self.outcome, "tokens": self.tokens,
                "next_seq": seq_spec(*self.next_seq) if self.next_seq else None,
                "next_offset": self.next_offset, "text": self.text}


class RecallStore(Protocol):
    """What a recall reads (a :class:`~sessionfold.store.SessionStore` is one)."""

    def get_session(self, sid: str) -> SessionInfo: ...

    def read_ledger(self, sid: str, start: int = 0,
                    end: int | None = None) -> list[LedgerEntry]: ...

    def search(self, sid: str, query: str, *, limit: int = 10) -> list[SearchHit]: ...
