"""The recall oracle: what the scripted agent asks ``sessionfold_recall`` for, and what it got.

A system whose client answers recall itself (sessionfold's ``SessionHandle.call(fn)``) is not
handed one request per call: the harness gives the client the scripted model, and the client
calls it once -- or again, after answering a recall from the ledger. On the first request of
call k the scripted model scores the window (:func:`b1.needed.request_recall`, recall echoes left
out); when identifiers of NEED_k are missing, it answers with ONE recall turn (:func:`ask`)
instead of the transcript's message k, and on the request that follows -- the window plus the
exchange the client appended -- counts the missing identifiers the answers copied from the
ledger (:func:`recovered`) and answers with message k. The extra request is billed like any
other (:mod:`b1.replay`).

**How it asks.** One tool call per missing identifier, its ``query`` the identifier itself, all
in the one reply: one extra model call, however many identifiers are missing. Per-identifier
queries because the search ranks chunks by the query's words: a query of several identifiers
finds the chunks that hold most of them (or, in its fallback tier, any), while each identifier
alone finds the chunk that holds it. The client answers the calls in order, each sized by the room
the ones before it left, so when the window is nearly full the last ones may get no room: that
is the tool's bound, and counts as not recovered.

This replay knows what message k will need; a real agent does not, and would not always ask, nor
ask for exactly what it lacks. The figure with the tool is therefore an upper bound (an oracle
agent), reported beside the figure without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .needed import RECALL_TOOL, mentioned, recall_answers

__all__ = ["ask", "ask_ids", "recovered"]

Message = Mapping[str, Any]


def ask_ids(call: int, missing: Sequence[str]) -> list[str]:
    """The tool_use ids of call ``call``'s recall turn: unique within a session, as the store
    requires of every tool_use id."""
    return [f"toolu_b1_recall_{call}_{i}" for i in range(len(missing))]


def ask(call: int, missing: Sequence[str]) -> list[dict[str, Any]]:
    """The content of the recall turn of call ``call``: one query per missing identifier."""
    return [{"type": "tool_use", "id": tool_id, "name": RECALL_TOOL, "input": {"query": ident}}
            for tool_id, ident in zip(ask_ids(call, missing), missing, strict=True)]


def recovered(missing: Sequence[str], messages: Sequence[Message], call: int) -> int:
    """How many of ``missing`` the answers to call ``call``'s recall turn copied from the
    ledger (an answer's first line, which repeats the query, does not count)."""
    copied = recall_answers(messages, frozenset(ask_ids(call, missing)))
    return sum(mentioned(copied, ident) for ident in missing)
