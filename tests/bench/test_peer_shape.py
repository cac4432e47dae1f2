"""The peers' runner states ``is_error`` on every tool result before the round-trip check.

The peers' message types always hold an ``is_error`` value, so a transcript whose tool results
leave it out (the public traces) would otherwise fail the round trip and read as not
retrievable. ``peers.shape.explicit_is_error`` writes the Messages API's default (false) where
the field is missing and changes nothing else. The peers themselves run in virtualenvs of their
own (bench/peers/setup_peers.sh); this part needs none of them.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from b1.checks import retrievable  # noqa: E402
from peers.shape import check_round_trip, explicit_is_error  # noqa: E402

MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "Book the flight."}]},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_00001", "name": "search", "input": {"q": "LAX"}},
        {"type": "tool_use", "id": "toolu_00002", "name": "search", "input": {"q": "JFK"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_00001", "content": "3 flights"},
        {"type": "tool_result", "tool_use_id": "toolu_00002", "content": "no such airport",
         "is_error": True}]},
    {"role": "assistant", "content": "Booked."},
]


def _as_a_peer_writes_it(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What a peer's conversion gives back: every tool result with an explicit is_error."""
    out = []
    for message in messages:
        content = message["content"]
        if not isinstance(content, str):
            content = [{**b, "is_error": bool(b.get("is_error"))}
                       if b["type"] == "tool_result" else dict(b) for b in content]
        out.append({"role": message["role"], "content": content})
    return out


def test_a_missing_is_error_becomes_false_and_a_present_one_keeps_its_value() -> None:
    results = explicit_is_error(MESSAGES)[2]["content"]
    assert [b["is_error"] for b in results] == [False, True]
    assert [b["content"] for b in results] == ["3 flights", "no such airport"]


def test_the_transcript_it_was_given_is_not_modified() -> None:
    before = copy.deepcopy(MESSAGES)
    explicit_is_error(MESSAGES)
    assert before == MESSAGES


def test_messages_with_nothing_missing_are_returned_as_they_are() -> None:
    made = explicit_is_error(MESSAGES)
    assert [made[i] is MESSAGES[i] for i in range(len(MESSAGES))] == [True, True, False, True]


def test_a_transcript_omitting_is_error_survives_a_peer_round_trip_once_it_is_stated() -> None:
    with pytest.raises(AssertionError, match="message 2 does not survive"):
        check_round_trip("peer", MESSAGES, _as_a_peer_writes_it(MESSAGES))
    stated = explicit_is_error(MESSAGES)
    check_round_trip("peer", stated, _as_a_peer_writes_it(stated))
    assert retrievable(stated, _as_a_peer_writes_it(stated))
