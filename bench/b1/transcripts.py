"""Loading the shared transcripts (``<repo>/tests/data/transcripts``, shipped with the repository).

A transcript is ``{"id", "source", "model", "system", "messages"}`` in the Anthropic shape; the
replay makes one model call per assistant message (:mod:`b1.replay`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_DIR",
    "STRESS_TRANSCRIPT",
    "Transcript",
    "load_transcripts",
    "task_text",
]

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"
#: The transcript whose final tool output (868 K characters) is followed by the stress request.
STRESS_TRANSCRIPT = "psf__requests-1142"


@dataclass(frozen=True)
class Transcript:
    #: The file's stem, e.g. ``psf__requests-1142``.
    id: str
    system: str
    messages: tuple[Mapping[str, Any], ...]

    @property
    def calls(self) -> int:
        """Model calls the replay makes: one per assistant message."""
        return sum(1 for m in self.messages if m["role"] == "assistant")

    @property
    def task(self) -> str:
        return task_text(self.messages)


def task_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the first user message: the task the agent was given."""
    for message in messages:
        if message["role"] == "user":
            content = message["content"]
            if isinstance(content, str):
                return content
            return "\n".join(str(b["text"]) for b in content if b.get("type") == "text")
    raise ValueError("the transcript has no user message")


def _load(path: Path) -> Transcript:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a transcript ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ValueError(f"{path}: a transcript is an object with a 'messages' list")
    messages = tuple(data["messages"])
    if not messages or messages[0].get("role") != "user":
        raise ValueError(f"{path}: a transcript starts with the user's task")
    return Transcript(id=path.stem, system=str(data.get("system") or ""),
                      messages=messages)


def load_transcripts(directory: Path = DEFAULT_DIR,
                     only: Sequence[str] | None = None) -> list[Transcript]:
    """Every ``*.json`` transcript in ``directory`` (sorted by id), or just those in ``only``."""
    directory = directory.resolve()
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such transcript directory")
    transcripts = [_load(p) for p in sorted(directory.glob("*.json"))]
    if only is not None:
        by_id = {t.id: t for t in transcripts}
        missing = [name for name in only if name not in by_id]
        if missing:
            raise ValueError(f"unknown transcript(s) {missing}; have: {sorted(by_id)}")
        transcripts = [by_id[name] for name in only]
    if not transcripts:
        raise ValueError(f"{directory}: no transcripts found")
    return transcripts
