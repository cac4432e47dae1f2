"""The stand-in's prompt caches: what part of a request each API would bill as read from its
cache, or as written to it.

- **The Messages API's** (:meth:`PromptCache.messages_split`): a request whose content carries
  ``cache_control`` breakpoints reads the longest prefix cached before (found at a breakpoint
  or up to :data:`CACHE_LOOKBACK_BLOCKS` blocks before one) and writes the rest up to its last
  breakpoint.
- **OpenAI's**, automatic (:meth:`PromptCache.openai_cached`): the longest prefix of messages
  seen before, of at least :data:`OPENAI_CACHE_MIN_TOKENS`, in steps of
  :data:`OPENAI_CACHE_STEP`, is read from the cache.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CACHE_LOOKBACK_BLOCKS",
    "OPENAI_CACHE_MIN_TOKENS",
    "OPENAI_CACHE_STEP",
    "PromptCache",
]

#: How many blocks before a breakpoint the Messages API looks for an earlier cached prefix.
CACHE_LOOKBACK_BLOCKS = 20
#: OpenAI caches a prompt's prefix from this many tokens on, in steps of OPENAI_CACHE_STEP.
OPENAI_CACHE_MIN_TOKENS = 1024
OPENAI_CACHE_STEP = 128


class PromptCache:
    """The prefixes both APIs' requests have cached so far, counted with ``count`` (the
    provider's token count of a request). Not locked: the provider calls it under its lock."""

    def __init__(self, count: Callable[[Mapping[str, Any]], int]) -> None:
        self._count = count
        self._prefixes: set[str] = set()

    def messages_split(self, request: Mapping[str, Any], prompt: int) -> tuple[int, int]:
        """(cache write, cache read) tokens, as the Messages API bills a request with
        ``cache_control`` breakpoints.

        Each breakpoint looks for the longest prefix cached before, at its own block or at
        one of the :data:`CACHE_LOOKBACK_BLOCKS` blocks before it; what the longest hit covers
        is read, the rest up to the last breakpoint written, and every breakpoint's prefix is
        cached from then on. Markers are not part of the content: a prefix cached with its
        marker on its last block is hit by a request whose marker has moved further on.
        """
        units = _cache_units(request)
        marks = [k for k, unit in enumerate(units) if unit.marked]
        if not marks:
            return 0, 0
        head = {"system": request.get("system") if isinstance(request.get("system"), str)
                else None, "tools": _unmarked(request.get("tools"))}
        digest = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
        keys: list[str] = []
        for unit in units:
            digest.update(unit.key.encode())
            keys.append("anthropic:" + digest.copy().hexdigest())
        hit = -1
        for mark in marks:
            for k in range(mark, max(-1, mark - CACHE_LOOKBACK_BLOCKS), -1):
                if keys[k] in self._prefixes:
                    hit = max(hit, k)
                    break
        self._prefixes.update(keys[m] for m in marks)
        last = marks[-1]
        read = self._count(_prefix_request(request, units[hit])) if hit >= 0 else 0
        through = self._count(_prefix_request(request, units[last])) if last > hit else 0
        read = min(prompt, read)
        return max(0, min(prompt - read, through - read)), read

    def openai_cached(self, request: Mapping[str, Any]) -> int:
        """OpenAI's automatic prompt cache: tokens of the longest prefix of messages (after the
        system prompt and tools) seen in an earlier request, of at least
        :data:`OPENAI_CACHE_MIN_TOKENS`, in steps of :data:`OPENAI_CACHE_STEP`."""
        messages = list(request.get("messages") or [])
        head = {"system": request.get("system"), "tools": request.get("tools")}
        digest = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
        longest = 0
        for i, message in enumerate(messages, start=1):
            digest.update(json.dumps(message, sort_keys=True).encode())
            key = "openai:" + digest.copy().hexdigest()
            if key in self._prefixes:
                longest = i
            else:
                self._prefixes.add(key)
        if not longest:
            return 0
        tokens = self._count({**head, "messages": messages[:longest]})
        return tokens // OPENAI_CACHE_STEP * OPENAI_CACHE_STEP if (
            tokens >= OPENAI_CACHE_MIN_TOKENS) else 0


@dataclass(frozen=True)
class _CacheUnit:
    """One block of a request, in the order the prompt cache reads it: the system prompt's
    blocks (when it is a list), then each message's (string content is one text block)."""

    message: int  # -1 for a system block
    block: int
    key: str  # the block as content: without its marker, with its message's position and role
    marked: bool


def _unmarked(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def _cache_units(request: Mapping[str, Any]) -> list[_CacheUnit]:
    units: list[_CacheUnit] = []
    system = request.get("system")
    if isinstance(system, list):
        for j, block in enumerate(system):
            marked = isinstance(block, Mapping) and "cache_control" in block
            units.append(_CacheUnit(-1, j, json.dumps(["system", _unmarked(block)],
                                                      sort_keys=True), marked))
    for i, message in enumerate(request.get("messages") or []):
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else (
            content if isinstance(content, list) else [])
        for j, block in enumerate(blocks):
            marked = isinstance(block, Mapping) and "cache_control" in block
            key = json.dumps([i, message.get("role"), _unmarked(block)], sort_keys=True)
            units.append(_CacheUnit(i, j, key, marked))
    return units


def _prefix_request(request: Mapping[str, Any], unit: _CacheUnit) -> dict[str, Any]:
    """The request cut after ``unit`` (for counting the tokens of a cached prefix)."""
    system = request.get("system")
    messages = list(request.get("messages") or [])
    if unit.message < 0:
        return {"system": list(system or [])[:unit.block + 1], "tools": request.get("tools"),
                "messages": []}
    message = messages[unit.message]
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return {"system": system, "tools": request.get("tools"),
            "messages": [*messages[:unit.message],
                         {**message, "content": blocks[:unit.block + 1]}]}
