"""Builders and checks shared by the store tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sessionfold.cli.files import load_conversation_file
from sessionfold.core.compact import FoldResult, FoldVisit, fold_window
from sessionfold.core.frame import fingerprint, summary_message
from sessionfold.core.messages import Message, check_tool_pairing
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.summarizers import ExtractiveSummarizer
from sessionfold.core.window import (
    CompactionRecord,
    FoldEdit,
    FoldedSpan,
    WindowItem,
)
from sessionfold.store import SessionStore
from sessionfold.store.schema import metadata

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"

#: Small budget so that a few dozen short turns fold; keep two turns.
POLICY = FoldPolicy(budget_tokens=2000, keep_recent_turns=2)


class Clock:
    """A clock that only moves when a test says so (the store stamps rows and leases with it)."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def turn(tag: str, lines: int = 8) -> list[dict[str, Any]]:
    """One whole turn: an assistant tool call and the user message holding its result."""
    call_id = f"call-{tag}"
    output = "\n".join(f"{tag} line {i}: some tool output worth reading" for i in range(lines))
    return [
        {"role": "assistant", "content": [
            {"type": "text", "text": f"Step {tag}: look at the next file."},
            {"type": "tool_use", "id": call_id, "name": "bash",
             "input": {"command": f"cat file-{tag}.txt"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": output},
        ]},
    ]


def transcript(name: str) -> tuple[str, list[Message]]:
    conv = load_conversation_file(TRANSCRIPTS / f"{name}.json")
    return conv.system, list(conv.messages)


def transcript_names() -> list[str]:
    return sorted(p.stem for p in TRANSCRIPTS.resolve().glob("*.json"))


def plan(store: SessionStore, sid: str, *, force: bool = False,
         target_tokens: int | None = None) -> FoldResult:
    """fold_window on the stored window with the offline summarizer, as a worker would."""
    info = store.get_session(sid)
    window = store.read_window(sid)
    return fold_window(window.items, FoldVisit(info.policy, ExtractiveSummarizer(max_chars=300),
                       system=window.system, calibration=info.calibration,
                       trigger="overflow" if force else "threshold", force=force,
                       target_tokens=target_tokens, latched=store.latched(sid),
                       originals=lambda seq: store.recover(sid, seq, seq)[0]))


def hand_fold(items: Sequence[WindowItem], start: int, stop: int,
              text: str = "summary of the earlier steps") -> FoldResult:
    """Replace ``items[start:stop]`` by one framed summary item, built by hand (no planner)."""
    replaced = tuple(items[start:stop])
    first, last = replaced[0].start_seq, replaced[-1].end_seq
    count = last - first + 1
    message = summary_message(text, start_seq=first, end_seq=last, message_count=count,
                              model="hand")
    summary = WindowItem(start_seq=first, end_seq=last, kind="summary", message=message)
    window = [*items[:start], summary, *items[stop:]]
    span = FoldedSpan(start_seq=first, end_seq=last, message_count=count,
                      fingerprint=fingerprint([i.message for i in replaced]), model="hand")
    record = CompactionRecord(trigger="manual", outcome="folded", budget_tokens=2000,
                              target_tokens=1200, measured_tokens=3000, tokens_after=1000,
                              folded=((first, last),))
    return FoldResult(window, FoldEdit(replaced=replaced, inserted=(summary,)), record, [span])


def check_window(store: SessionStore, sid: str) -> None:
    """The window invariants: ordered, covering every ledger seq exactly once, message items on
    one seq, tool calls and results still paired, and the sizes the session row keeps agree."""
    info = store.get_session(sid)
    window = store.read_window(sid)
    assert window.revision == info.revision
    expected = 0
    for item in window.items:
        assert item.start_seq == expected, f"gap or overlap at #{expected}: {item.start_seq}"
        assert item.end_seq >= item.start_seq
        if item.kind == "message":
            assert item.end_seq == item.start_seq
        expected = item.end_seq + 1
    assert expected == info.ledger_len
    check_tool_pairing(window.messages())
    assert info.window_tokens == sum(item.tokens or 0 for item in window.items)


def ledger_json(store: SessionStore, sid: str) -> list[Any]:
    return [e.message.to_json() if e.message else None for e in store.read_ledger(sid)]


def row_counts(store: SessionStore) -> dict[str, int]:
    """Rows per table: 'nothing was written' is checked against these."""
    with store.engine.connect() as conn:
        return {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in metadata.sorted_tables}


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
