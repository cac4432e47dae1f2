"""The window and what a fold leaves behind: items, spans, refusals and records.

The *ledger* is every message ever appended, numbered by ``seq``. The *window* is what the model
is sent: an ordered list of :class:`WindowItem`, each either one ledger message (``kind
"message"``, maybe edited by a layer that names itself in ``edits``) or one item standing for a
contiguous seq range (``kind "summary"``, or ``"notice"`` for ``drop-oldest``).

A fold is described to the store as a :class:`FoldEdit`: the items it replaces (with the version
each had when the fold was planned, for the compare-and-set) and the items that take their place.

What an item *is* lives in its record, never in its text: ``kind`` says whether it is a summary
or a notice, ``edits`` which layers changed it. A user can type a frame line and a tool can print
a mask stub; only sessionfold sets these fields. The sizes the authored lines name come from the
original message (:data:`Originals` looks it up in the ledger), never from numbers in text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from .messages import Message
from .policy import FoldPolicy

__all__ = [
    "CompactionRecord",
    "Edit",
    "FoldEdit",
    "FoldedSpan",
    "ItemKind",
    "Originals",
    "Outcome",
    "Refusal",
    "RefusalReason",
    "SummarizerUsage",
    "Trigger",
    "WindowItem",
    "items_from_messages",
    "window_messages",
]

ItemKind = Literal["message", "summary", "notice", "recall"]
Edit = Literal["masked", "thinking-dropped", "clipped", "dropped"]
RefusalReason = Literal[
    "first-user",
    "inside-keep-window",
    "unresolved-tool-call",
    "pinned",
    "only-existing-summary",
    "replacement-not-smaller",
    "summarizer-failed",
    "retention-check-failed",
    "would-not-pay",
]
Outcome = Literal["folded", "nothing-to-fold", "refused", "stale"]
#: Why a visit runs: past the trigger (``threshold``), the provider refused the request
#: (``overflow``, inline), asked for (``manual``), or idle past its cache's lifetime (``idle``).
Trigger = Literal["threshold", "overflow", "manual", "idle"]
#: The ledger message at a seq exactly as appended, or None when it is gone (discarded). Layers
#: that edit a clipped item again (mask it, clip it shorter) read the original's size from it.
Originals: TypeAlias = Callable[[int], Message | None]


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
    #: The part of the counts above billed through a provider's batch API, at its batch rate
    #: (:meth:`~sessionfold.core.prices.ModelPrices.batched`): included in them, never added to
    #: them. A summarizer sets no cache breakpoints, so a batch call's cache reads and writes
    #: (none, normally) are counted at the list price: over, never under.
    batch_calls: int = 0
    batch_input_tokens: int = 0
    batch_output_tokens: int = 0

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
            batch_calls=self.batch_calls + other.batch_calls,
            batch_input_tokens=self.batch_input_tokens + other.batch_input_tokens,
            batch_output_tokens=self.batch_output_tokens + other.batch_output_tokens,
        )

    def through_batch(self) -> SummarizerUsage:
        """This usage, every call of it billed through a provider's batch API."""
        return self.model_copy(update={"batch_calls": self.calls,
                                       "batch_input_tokens": self.input_tokens,
                                       "batch_output_tokens": self.output_tokens})


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
    """Every over-budget visit leaves one, whether it folded or not.

    The planner (:func:`~sessionfold.core.compact.fold_window`) writes the record of a visit it
    ran; the visits that end before planning have their constructors here, so each is written
    one way wherever it happens: :meth:`paused`, :meth:`out_of_time`, :meth:`gave_up`,
    :meth:`moved` for an inline visit whose window a fold replaced after the caller measured
    it, and :meth:`as_stale` for a visit that lost its race.
    """

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
    #: The cost model's figures when the visit was priced (policy ``economics="dollars"``):
    #: :meth:`FoldChoice.to_json() <sessionfold.core.cycles.FoldChoice.to_json>`, or
    #: ``{"why": "nothing-to-price", "fold": False, "window_tokens": …}`` when no fold was on
    #: offer; None when it was not priced.
    economics: dict[str, Any] | None = None

    @classmethod
    def paused(cls, *, trigger: Trigger, policy: FoldPolicy, current_tokens: int,
               measured: bool, target_tokens: int | None = None) -> CompactionRecord:
        """A background visit to a paused session: nothing folds until it is resumed.

        ``current_tokens`` is the session's size as the store keeps it (``measured``: it rests
        on a provider's report, not only on the estimate).
        """
        return cls(trigger=trigger, outcome="nothing-to-fold",
                   budget_tokens=policy.budget_tokens,
                   target_tokens=target_tokens or policy.target_tokens,
                   measured_tokens=current_tokens, measured_by=_measured_by(measured),
                   tokens_after=current_tokens,
                   detail="the session is paused: background folds wait until it is resumed")

    @classmethod
    def out_of_time(cls, *, trigger: Trigger, policy: FoldPolicy, current_tokens: int,
                    measured_tokens: int | None, window: tuple[int, int], why: str,
                    forced: bool = False, target_tokens: int | None = None) -> CompactionRecord:
        """A visit cut short before it could fold (``why``: Celery's soft time limit).

        Nothing changed; a ``summarizer-failed`` refusal over ``window`` (its first and last
        seq) says why, and the visit is retried. What the summarizer was paid for is unknown:
        the call did not return.
        """
        return cls(trigger=trigger, outcome="refused", budget_tokens=policy.budget_tokens,
                   target_tokens=target_tokens or policy.target_tokens,
                   measured_tokens=(measured_tokens if measured_tokens is not None
                                    else current_tokens),
                   measured_by=_measured_by(measured_tokens is not None),
                   tokens_after=current_tokens, forced=forced,
                   refusals=(Refusal(reason="summarizer-failed", start_seq=window[0],
                                     end_seq=window[1], detail=why),),
                   detail=f"{why}: the visit ran out of time before it could fold; retried")

    @classmethod
    def gave_up(cls, *, trigger: Trigger, policy: FoldPolicy, current_tokens: int,
                measured: bool, reason: str) -> CompactionRecord:
        """A fold job given up on (dead-lettered): a refusal whose detail says why."""
        return cls(trigger=trigger, outcome="refused", budget_tokens=policy.budget_tokens,
                   target_tokens=policy.target_tokens, measured_tokens=current_tokens,
                   measured_by=_measured_by(measured), tokens_after=current_tokens,
                   detail=f"dead-lettered: {reason}")

    @classmethod
    def moved(cls, *, trigger: Trigger, policy: FoldPolicy, current_tokens: int,
              measured: bool, decided_at: int, revision: int,
              target_tokens: int | None = None) -> CompactionRecord:
        """An inline visit decided on the window at revision ``decided_at`` that found it at
        ``revision``: a fold landed (or another writer appended) in between, so what the
        caller measured no longer names the window. Nothing is folded (outcome ``stale``); the
        caller measures it again."""
        return cls(trigger=trigger, outcome="stale", budget_tokens=policy.budget_tokens,
                   target_tokens=target_tokens or policy.target_tokens,
                   measured_tokens=current_tokens, measured_by=_measured_by(measured),
                   tokens_after=current_tokens, forced=True,
                   detail=f"the window moved (revision {decided_at} -> {revision}) since the "
                          "request was measured: not folded; the request is measured again")

    def as_stale(self, reason: str) -> CompactionRecord:
        """This record as the record of a lost race: outcome ``stale``, ``reason`` after the
        detail it had (nothing of the visit landed)."""
        return self.model_copy(update={
            "outcome": "stale", "detail": "; ".join(x for x in (self.detail, reason) if x)})


def _measured_by(measured: bool) -> Literal["reported", "estimate"]:
    return "reported" if measured else "estimate"


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
