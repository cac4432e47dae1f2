"""The window and what a fold leaves behind: items, spans, refusals and records.

The *ledger* is every message ever appended, numbered by ``seq``. The *window* is what the model
is sent: an ordered list of :class:`WindowItem`, each either one ledger message (``kind
"message"``, maybe edited by a layer that names itself in ``edits``) or one item standing for a
contiguous seq range (``kind "summary"``, or ``"notice"`` for ``drop-oldest``).

A fold is described to the store as a :class:`FoldEdit`: the items it replaces (with the version
each had when the fold was planned, for the compare-and-set) and the items that take their place.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .messages import Message

__all__ = [
    "CompactionRecord",
    "Edit",
    "FoldEdit",
    "FoldedSpan",
    "ItemKind",
    "Outcome",
    "Refusal",
    "RefusalReason",
    "SummarizerUsage",
    "Trigger",
    "WindowItem",
    "items_from_messages",
    "window_messages",
]

ItemKind = Literal["message", "summary", "notice"]
Edit = Literal["masked", "thinking-dropped", "clipped"]
RefusalReason = Literal[
    "first-user",
    "inside-keep-window",
    "unresolved-tool-call",
    "pinned",
    "only-existing-summary",
    "replacement-not-smaller",
    "summarizer-failed",
    "retention-check-failed",
]
Outcome = Literal["folded", "nothing-to-fold", "refused", "stale"]
Trigger = Literal["threshold", "overflow", "manual"]


class WindowItem(BaseModel):
    """One entry of the window: a ledger message, or a summary/notice covering a seq range."""

    model_config = ConfigDict(frozen=True)

    start_seq: int = Field(ge=0)
    end_seq: int = Field(ge=0)
    kind: ItemKind = "message"
    message: Message
    edits: tuple[Edit, ...] = ()
    #: Store-assigned; a fold's commit checks it (compare-and-set). 0 outside a store.
    version: int = 0
    #: Cached token estimate of ``message`` (framing included); None until counted.
    tokens: int | None = None

    @property
    def seq_count(self) -> int:
        return self.end_seq - self.start_seq + 1

    def to_json(self) -> dict[str, Any]:
        return {"start_seq": self.start_seq, "end_seq": self.end_seq, "kind": self.kind,
                "edits": list(self.edits), "version": self.version,
                "message": self.message.to_json()}


class SummarizerUsage(BaseModel):
    """What the summarizer calls of one fold cost, in the provider's own counts."""

    model_config = ConfigDict(frozen=True)

    model: str = ""
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    def __add__(self, other: SummarizerUsage) -> SummarizerUsage:
        return SummarizerUsage(
            model=other.model or self.model,
            calls=self.calls + other.calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens=(
                self.cache_creation_input_tokens + other.cache_creation_input_tokens
            ),
        )


class Refusal(BaseModel):
    """Why a range of the window was not folded. Refusals are data, not log lines."""

    model_config = ConfigDict(frozen=True)

    reason: RefusalReason
    start_seq: int
    end_seq: int
    detail: str = ""
    #: Span fingerprint, for refusals the store latches (same span: not paid for twice).
    fingerprint: str | None = None


class FoldedSpan(BaseModel):
    """The record of one folded seq range: what replaced it, by whom, at what cost."""

    model_config = ConfigDict(frozen=True)

    start_seq: int
    end_seq: int
    message_count: int
    fingerprint: str
    kind: Literal["summary", "notice"] = "summary"
    model: str = ""
    usage: SummarizerUsage = SummarizerUsage()
    retained: bool = True
    #: Identifiers the retention check found missing in a forced (overflow) fold.
    lost_identifiers: tuple[str, ...] = ()
    #: Chars of the span's messages, and of the item that replaced them.
    chars_before: int = 0
    chars_after: int = 0


class CompactionRecord(BaseModel):
    """Every over-budget visit leaves one, whether it folded or not."""

    model_config = ConfigDict(frozen=True)

    trigger: Trigger
    outcome: Outcome
    budget_tokens: int
    target_tokens: int
    #: The size the visit started from: provider-measured when known, else the estimate.
    measured_tokens: int
    measured_by: Literal["reported", "estimate"] = "estimate"
    tokens_after: int
    layers_run: tuple[str, ...] = ()
    folded: tuple[tuple[int, int], ...] = ()
    chars_before: int = 0
    chars_after: int = 0
    summarizer_usage: SummarizerUsage = SummarizerUsage()
    refusals: tuple[Refusal, ...] = ()
    forced: bool = False
    detail: str = ""


class FoldEdit(BaseModel):
    """A planned window change, as the store commits it.

    ``replaced`` are the items the fold removes or changes, exactly as planned (the store checks
    each one's ``version`` under compare-and-set); ``inserted`` are the items that take their
    place, ordered by ``start_seq``. Items after the last replaced one (concurrent appends) are
    untouched, so a fold and appends commute.
    """

    model_config = ConfigDict(frozen=True)

    replaced: tuple[WindowItem, ...] = ()
    inserted: tuple[WindowItem, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.replaced and not self.inserted


def items_from_messages(messages: Iterable[Message], first_seq: int = 0) -> list[WindowItem]:
    """One unedited window item per message, seqs counted from ``first_seq``."""
    return [WindowItem(start_seq=first_seq + i, end_seq=first_seq + i, message=m)
            for i, m in enumerate(messages)]


def window_messages(items: Sequence[WindowItem]) -> list[Message]:
    return [item.message for item in items]
