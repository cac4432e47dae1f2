"""Server-Sent Events as both APIs stream them: one frame, and text cut into the small deltas a
stream sends (each API's own events: :mod:`.messages_api`, :mod:`.chat_completions`)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["STREAM_PIECE_CHARS", "pieces", "sse_frame"]

#: Characters per delta of a streamed text or tool input (the API sends a few words at a time).
STREAM_PIECE_CHARS = 24


def pieces(text: str) -> list[str]:
    """``text`` cut into the small deltas a stream sends (at least one, maybe empty)."""
    return [text[i:i + STREAM_PIECE_CHARS]
            for i in range(0, len(text), STREAM_PIECE_CHARS)] or [""]


def sse_frame(event: str | None, data: Any) -> bytes:
    """One whole frame: ``event:`` when named, then ``data:`` (a string as it is, else its
    compact JSON)."""
    head = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {body}\n\n".encode()
