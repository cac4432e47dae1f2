"""The no-compaction baseline: every request is the system prompt plus every message so far."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .counting import Request
from .replay import Env
from .transcripts import Transcript

__all__ = ["NoCompaction"]


class _Session:
    def __init__(self, transcript: Transcript) -> None:
        self.system = transcript.system
        self.messages: list[Mapping[str, Any]] = []

    def append(self, message: Mapping[str, Any]) -> None:
        self.messages.append(message)

    def request(self) -> Request:
        return Request(self.system, list(self.messages))

    def reported(self, request: Request, tokens: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def retained(self) -> list[Mapping[str, Any]]:
        return list(self.messages)


class NoCompaction:
    name = "none"

    def describe(self, budget: int) -> str:
        return "no compaction: the whole conversation on every call"

    def session(self, transcript: Transcript, budget: int, env: Env) -> _Session:
        return _Session(transcript)
