"""Summarizers: what writes the text that stands for a folded span.

A summarizer turns a span of messages (and the summary that already stood for the history before
it, if any) into text plus the usage it cost::

    class Summarizer(Protocol):
        model: str
        context_tokens: int      # the most transcript tokens one call may carry
        def summarize(self, messages, *, previous_summary=None, must_keep=()) -> Summary: ...

Three implementations ship, one here and two beside the runtime:

- :class:`~sessionfold.runtime.providers.anthropic.AnthropicSummarizer`, in the fold runtime
  (the engine imports no network client), calls a cheap model through ``anthropic``. The transcript
  goes between markers carrying a random per-call nonce, and the instruction names what is between
  them as material to summarize, never to obey: transcript text cannot close the markers, since it
  cannot know the nonce. The SDK's own retries are off (``max_retries=0``): the caller (a Celery
  task) owns retries, their count and their cap. Errors are mapped where they enter:
  429, 529, 5xx, 408/409 (the statuses the SDK itself would retry), timeouts and connection
  errors become :class:`TransientSummarizerError` (with the ``retry-after`` hint in seconds);
  any other status, an empty answer, a refusal or a context-window stop become
  :class:`PermanentSummarizerError`.
- :class:`~sessionfold.runtime.providers.openai.OpenAISummarizer` does the same through the
  ``openai`` SDK for any OpenAI-compatible Chat Completions endpoint (the ``openai`` extra), with
  the same markers, the same error mapping and its usage reported in the shape above.
- :class:`ExtractiveSummarizer` writes a bounded, deterministic digest without any model: the
  identifiers first, every one the retention check counts whatever its length (so it passes the
  check), then the requests and the agent's latest notes. It serves demos, tests and sessions
  whose owners want no summarizer cost. Its usage reports one call and zero tokens: it costs no
  provider anything.

Test doubles (failing or scripted summarizers) live in the tests, not here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .errors import InvalidInputError
from .frame import EarlierFold
from .messages import (
    DocumentBlock,
    ImageBlock,
    Message,
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .retention import IDENTIFIER_LIMIT, extract_identifiers, find_identifiers
from .window import SummarizerUsage

__all__ = [
    "DEFAULT_MODEL",
    "ExtractiveSummarizer",
    "Summarizer",
    "Summary",
    "render_transcript",
]

DEFAULT_MODEL = "claude-haiku-5-5"



@dataclass(frozen=True)
class Summary:
    """The summarizer's text (without the frame: the engine adds it) and what it cost."""

    text: str
    usage: SummarizerUsage


@runtime_checkable
class Summarizer(Protocol):
    """Writes the text that stands for a span of messages."""

    model: str
    #: The most transcript tokens one call may carry; larger spans are summarized in chunks.
    context_tokens: int

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        """Summarize ``messages``, folding ``previous_summary`` in; mention every ``must_keep``.

        A summary or notice that stood inside the span arrives as an
        :class:`~sessionfold.core.frame.EarlierFold` (the window item's kind, range and body);
        every other message is what its author wrote, whatever its text looks like.
        Raises TransientSummarizerError (retry later) or PermanentSummarizerError.
        """
        ...


# --- rendering ---------------------------------------------------------------------------------

def _render_block(block: Any) -> str:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ToolUseBlock):
        args = json.dumps(block.input, ensure_ascii=False, sort_keys=True)
        return f"(tool call {block.name}, id {block.id}) {args}"
    if isinstance(block, ToolResultBlock):
        flag = ", error" if block.is_error else ""
        return f"(tool result for {block.tool_use_id}{flag})\n{block.output_text()}"
    if isinstance(block, ThinkingBlock):
        return f"(thinking)\n{block.thinking}"
    if isinstance(block, RedactedThinkingBlock):
        return "(redacted thinking)"
    if isinstance(block, ImageBlock):
        return "(image)"
    if isinstance(block, DocumentBlock):
        data = block.source.get("data")
        if block.source.get("type") == "text" and isinstance(data, str):
            return f"(document)\n{data}"
        return "(document)"
    if isinstance(block, OpaqueBlock):
        # A server tool's call or result, an MCP call: shown as the API wrote it, cut short.
        return f"({block.type}) {_clip(block.model_dump_json(exclude={'type'}), 2000)}"
    return ""  # pragma: no cover - every block type is handled above


def render_transcript(messages: Sequence[Message]) -> str:
    """The span as plain text: one header line per message, then its blocks.

    An earlier summary or notice inside the span (an :class:`EarlierFold`: the window item said
    so) is shown as what it is, its body as data like the rest. Any other message is shown as its
    role wrote it, even one whose text starts like a frame line: text never makes a summary.
    """
    parts: list[str] = []
    for number, message in enumerate(messages, start=1):
        if isinstance(message, EarlierFold):
            label = "earlier summary" if message.fold_kind == "summary" else "notice"
            body = message.body or message.text()
            parts.append(f"[{number}: {label} of ledger #{message.start_seq}–#{message.end_seq}]"
                         f"\n{body}")
            continue
        blocks = "\n".join(_render_block(b) for b in message.blocks())
        parts.append(f"[{number}: {message.role}]\n{blocks}")
    return "\n\n".join(parts)


# --- the Anthropic summarizer ------------------------------------------------------------------

def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)].rstrip() + "…"


def _leading_line(text: str, need: int) -> str:
    """``_one_line(text)``, or a prefix of it at least ``need`` characters long: only a head of
    a long text is normalized (its last word dropped, as it may be cut)."""
    n = max(need * 2, 64)
    while n < len(text):
        head = _one_line(text[:n])
        cut = head.rfind(" ")
        if cut >= need:
            return head[:cut]
        n *= 2
    return _one_line(text)


def _first_sentence(text: str, limit: int = 160) -> str:
    # Only the first limit + 1 characters of the line decide the answer (a stop must start
    # before ``limit``, and the clip keeps less): a head of them is enough.
    line = _leading_line(text, limit + 2)
    for stop in (". ", "? ", "! "):
        cut = line.find(stop)
        if 0 < cut < limit:
            line = line[: cut + 1]
    return _clip(line, limit)


def _first_sentences(messages: Iterable[Message], room: int) -> str:
    """The distinct first sentences of the messages' own texts, in order, joined by " | ",
    read only until the joined text is longer than ``room``."""
    seen: dict[str, None] = {}
    size = 0
    for message in messages:
        text = message.text()
        if not text.strip():
            continue
        sentence = _first_sentence(text)
        if sentence in seen:
            continue
        seen[sentence] = None
        size += len(sentence) + (3 if len(seen) > 1 else 0)
        if size > room:
            break
    return " | ".join(seen)


class ExtractiveSummarizer:
    """An offline, deterministic summarizer: no model, bounded to ``max_chars``, or to the
    identifiers it must keep when they need more.

    The text is built in this order, each part within what is left of ``max_chars``:

    1. ``Identifiers:`` the ``must_keep`` ones, then the span's own (most recurring first, as the
       retention check ranks them), then those the previous summary carried. The first
       :data:`~.retention.IDENTIFIER_LIMIT` (40) of them, and every ``must_keep`` one, are listed
       however long they are: they hold every identifier the retention check counts (the span's
       40 most recurring that the previous summary does not name), and a Claude Code session
       names its files by absolute paths of 80-100 characters, 40 of which do not fit in 1,200
       characters. The others fill what is left of the line's share of ``max_chars`` (all of it
       but :attr:`prose_reserve`), so rolling folds do not pile identifiers up;
    2. ``Earlier:`` the previous summary's other text, clipped;
    3. ``Requests:`` the first sentence of each user request in the span;
    4. ``Latest notes:`` the first sentence of the agent's latest texts, newest first;
    5. ``Tool calls:`` how many, by tool name.

    The text is at most ``max_chars`` long, unless the identifiers listed whatever their length
    need more: then it is their line and at most :attr:`prose_reserve` characters of prose. Such
    a summary is still smaller than the span it stands for, which named each of the span's own
    identifiers in its text and said more around them (the span of a planner's fold is at least
    one turn of the agent's, with its frame and tool calls).

    Usage: one call, zero tokens (nothing is billed), ``model`` as given.
    """

    def __init__(self, *, max_chars: int = 1200, model: str = "extractive",
                 context_tokens: int = 1_000_000) -> None:
        if max_chars < 200:
            raise InvalidInputError(f"max_chars must be at least 200, got {max_chars}")
        if context_tokens < 1000:
            raise InvalidInputError(f"context_tokens must be at least 1000, got {context_tokens}")
        self.max_chars = max_chars
        self.model = model
        self.context_tokens = context_tokens

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(max_chars={self.max_chars}, model={self.model!r})"

    @property
    def prose_reserve(self) -> int:
        """Characters of ``max_chars`` the identifiers leave to the prose sections when they
        can (a fifth, at most 200): all the prose a summary whose identifiers need more than
        ``max_chars`` holds."""
        return min(200, self.max_chars // 5)

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        if not messages:
            raise InvalidInputError("nothing to summarize: the span holds no messages")
        previous = (previous_summary or "").strip()
        prev_lines = previous.splitlines()
        prev_ids = prev_lines[0].removeprefix("Identifiers: ").split("; ") if (
            prev_lines and prev_lines[0].startswith("Identifiers: ")) else []
        prev_rest = _one_line(" ".join(
            line for line in prev_lines if not line.startswith("Identifiers: ")))
        # Kept whatever their length: ``must_keep``, and what the planner's retention check
        # counts, the span's own identifiers less those the previous summary names; then the
        # others, up to the check's count (a rolling fold so carries the previous summary's
        # first ones on).
        own = extract_identifiers(messages, limit=IDENTIFIER_LIMIT)
        counted = extract_identifiers(messages, exclude=previous, limit=IDENTIFIER_LIMIT) if (
            previous) else own
        kept = list(dict.fromkeys([*(_one_line(k) for k in must_keep if k.strip()), *counted]))
        identifiers = list(dict.fromkeys([*kept, *own, *prev_ids, *find_identifiers(previous)]))
        keep = set(identifiers[:max(len(kept), IDENTIFIER_LIMIT)])
        ids_line = self._identifiers_line(identifiers, keep, self.max_chars - self.prose_reserve)
        # The prose has what the identifiers leave of max_chars, and its reserve at least.
        limit = max(self.max_chars, len(ids_line) + self.prose_reserve)
        lines = [ids_line] if ids_line else []
        budget = limit - len(ids_line) - 1 if ids_line else limit

        sections = self._sections(messages, prev_rest, room=self.max_chars)
        for index, (label, text) in enumerate(sections):
            share = budget // (len(sections) - index)
            line = _clip(f"{label}: {text}", share - 1)
            if line and len(line) > len(label) + 3:
                lines.append(line)
                budget -= len(line) + 1
        text = "\n".join(lines)
        if not text:
            text = _clip(_one_line(render_transcript(messages)), self.max_chars)
        return Summary(text=text[:limit], usage=SummarizerUsage(model=self.model, calls=1))

    @staticmethod
    def _identifiers_line(identifiers: Sequence[str], kept: set[str], room: int) -> str:
        """``Identifiers:`` and ``identifiers`` in their order: every one in ``kept``, whatever
        the room (the retention check counts them: a summary without them is refused), and of
        the others those that fit in what ``kept`` leaves of ``room`` characters."""
        # The line's length as names are added, each after a "; " (the first has none).
        size = len("Identifiers: ") - 2 + sum(len(i) + 2 for i in identifiers if i in kept)
        chosen = set(kept)
        for ident in identifiers:
            if ident in chosen:
                continue
            if size + len(ident) + 2 > room:
                continue  # a shorter identifier further down may still fit
            chosen.add(ident)
            size += len(ident) + 2
        listed = [i for i in identifiers if i in chosen]
        return "Identifiers: " + "; ".join(listed) if listed else ""

    @staticmethod
    def _sections(messages: Sequence[Message], previous: str, *,
                  room: int) -> list[tuple[str, str]]:
        """The prose sections, each as long as it can be shown: a section's line is clipped
        to at most ``room`` characters (a prefix), so the first sentences are read only
        until the joined ones pass that (the rest could not change the line)."""
        user: list[Message] = []
        agent: list[Message] = []
        tools: dict[str, int] = {}
        for message in messages:
            if isinstance(message, EarlierFold):
                body = message.body
                if body:
                    previous = f"{previous} {_one_line(body)}".strip()
                continue
            (user if message.role == "user" else agent).append(message)
            if not isinstance(message.content, str):
                for block in message.content:
                    if isinstance(block, ToolUseBlock):
                        tools[block.name] = tools.get(block.name, 0) + 1
        requests = _first_sentences(user, room)
        notes = _first_sentences(reversed(agent), room)  # newest first
        sections: list[tuple[str, str]] = []
        if previous:
            sections.append(("Earlier", previous))
        if requests:
            sections.append(("Requests", requests))
        if notes:
            sections.append(("Latest notes", notes))
        if tools:
            counted = ", ".join(f"{name} ×{n}" for name, n in sorted(tools.items()))
            sections.append(("Tool calls", counted))
        return sections
