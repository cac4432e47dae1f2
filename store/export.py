"""A session as one JSON object (``sessionfold export``) and as text for a person (``inspect``).

The export's shape is fixed::

    {"session", "system", "policy", "revision",
     "ledger": [{"seq", "origin", "message"}],             # message null once discarded;
                                                           # origin "agent" or "recall"
     "window": [{"start_seq", "end_seq", "kind", "message"}],
     "spans": [...], "records": [...]}

Messages are written as stored (``Message.to_json()`` without ``cache_control``), not re-encoded.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sessionfold.core.messages import Message, ToolResultBlock, ToolUseBlock
from sqlalchemy.engine import Connection

from .fold_commit import read_records, read_spans
from .results import SessionInfo, StoredSpan, Window
from .schema import ledger, window_items
from .sessions import load_session, session_info

__all__ = ["export_session", "render_inspect"]


def export_session(conn: Connection, sid: str) -> dict[str, Any]:
    info = session_info(load_session(conn, sid))
    ledger_rows = conn.execute(
        sa.select(ledger.c.seq, ledger.c.origin, ledger.c.message)
        .where(ledger.c.session_id == sid)
        .order_by(ledger.c.seq)).all()
    window_rows = conn.execute(
        sa.select(window_items.c.start_seq, window_items.c.end_seq, window_items.c.kind,
                  window_items.c.message)
        .where(window_items.c.session_id == sid).order_by(window_items.c.start_seq)).all()
    return {
        "session": info.id,
        "system": info.system,
        "policy": info.policy.to_json(),
        "revision": info.revision,
        "ledger": [{"seq": r.seq, "origin": r.origin, "message": r.message}
                   for r in ledger_rows],
        "window": [{"start_seq": r.start_seq, "end_seq": r.end_seq, "kind": r.kind,
                    "message": r.message} for r in window_rows],
        "spans": [s.model_dump(mode="json") for s in read_spans(conn, sid)],
        "records": [r.model_dump(mode="json") for r in read_records(conn, sid)],
    }


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(0, width - 1)] + "…"


def _preview(message: Message, width: int) -> str:
    parts: list[str] = []
    for block in message.blocks():
        if isinstance(block, ToolUseBlock):
            parts.append(f"[tool_use {block.name} {_one_line(str(block.input), 60)}]")
        elif isinstance(block, ToolResultBlock):
            text = block.output_text()
            flag = " error" if block.is_error else ""
            parts.append(f"[tool_result{flag} {len(text):,} chars] {_one_line(text, 80)}")
        elif hasattr(block, "text"):
            parts.append(str(block.text))
        else:
            parts.append(f"[{block.type}]")
    return _one_line(" ".join(parts), width)


def _seq_range(start: int, end: int) -> str:
    return f"#{start}" if start == end else f"#{start}–#{end}"


def render_inspect(info: SessionInfo, window: Window, spans: list[StoredSpan], *,
                   width: int = 100, full: bool = False) -> str:
    """The window for a person: one line per item, a seam around each fold with its span."""
    measured = (f"{info.measured_tokens:,} reported at seq {info.measured_seq}"
                if info.measured_tokens is not None else "never reported")
    lines = [
        f"session {info.id}  revision {window.revision}  ledger {info.ledger_len:,} messages  "
        f"window {len(window.items):,} items",
        f"size {info.current_tokens:,} tokens (trigger {info.trigger_tokens:,}, budget "
        f"{info.policy.budget_tokens:,}; {measured}; estimate {window.tokens:,})"
        + ("  PAUSED" if info.paused else ""),
        f"system: {_one_line(window.system, width - 8) if window.system else '(none)'}",
        "",
    ]
    latest: dict[tuple[int, int], StoredSpan] = {}
    for span in spans:
        latest[(span.start_seq, span.end_seq)] = span
    for item in window.items:
        where = _seq_range(item.start_seq, item.end_seq)
        tokens = f"{item.tokens or 0:,} tok"
        if item.kind in ("message", "recall"):
            edits = f" [{', '.join(item.edits)}]" if item.edits else ""
            # A recall exchange (the client answering the model from the ledger) is marked, so
            # it is not read as the agent's own conversation.
            who = item.message.role if item.kind == "message" else f"recall:{item.message.role}"
            head = f"  {where:<12} {who:<9} {tokens:>10}{edits}  "
            body = (_preview(item.message, 10_000) if full
                    else _preview(item.message, max(20, width - len(head))))
            lines.append(head + body)
            continue
        found = latest.get((item.start_seq, item.end_seq))
        seam = (f"── fold seam: ledger {where} ({item.seq_count:,} messages) folded into one "
                f"{item.kind}")
        if found is not None:
            span = found
            when = span.created_at.isoformat(timespec="seconds")
            seam += (f"; span {span.id} by job {span.job_id or '-'} at {when}, "
                     f"{span.chars_before:,} → {span.chars_after:,} chars"
                     + (f", model {span.model}" if span.model else "")
                     + ("" if span.retained else ", originals DISCARDED"))
        lines.append(seam + " ──")
        body = _preview(item.message, 10_000 if full else max(20, width - 30))
        lines.append(f"  {where:<12} {item.kind:<9} {tokens:>10}  {body}")
        lines.append("── end of fold " + where + "; `sessionfold export` or recover() give the "
                     "originals" + (" (discarded)" if found is not None and not found.retained
                                    else "") + " ──")
    if not window.items:
        lines.append("  (empty window)")
    return "\n".join(lines) + "\n"
