"""The fold planner: :func:`fold_window` for a stored window, :func:`compact` for a message list.

A visit measures the window; at or under the trigger (and not forced) it changes nothing.
Otherwise it runs the policy's layers cheapest first, re-measuring after each and stopping as
soon as the window is at or under the target:

1. ``clip-oversized`` (always; idempotent, normally already done on append);
2. ``drop-recall`` (always, when the window holds recall exchanges): unprotected recall
   exchanges, oldest first, each run of them replaced by one line saying it was dropped. They
   are copies of ledger rows the model asked for, so they are the cheapest thing to give up;
3. ``mask-tool-results`` and ``drop-thinking`` on unprotected items, oldest first;
4. ``summarize`` (or ``drop-oldest``) on the oldest run of foldable turns: the shortest prefix of
   the run expected to reach the target is replaced by one summary (or notice) item. An earlier
   summary at the head of the run is passed on as ``previous_summary`` and replaced (rolling),
   so each run of foldable history is led by at most one summary. If the summary came out
   larger than expected, the next turns of the run are folded into it the same way.

Recall exchanges are never summarized (a summary covering them leaves them out of what the
summarizer reads, and so of the retention check) and never count toward ``keep_recent_turns``.

Every refusal is data in the record: protection (``first-user``, ``inside-keep-window``, ...),
``only-existing-summary``, ``replacement-not-smaller`` and ``retention-check-failed`` (both carry
the span fingerprint so the store latches it and the span is not paid for again),
``summarizer-failed`` (a transient error is also returned in :attr:`FoldResult.summarizer_error`
so a Celery task can retry it), and ``would-not-pay``.

**Priced visits.** Given ``economics`` (a :class:`~.economics.FoldEconomics`) and a policy with
``economics="dollars"``, a background visit (not forced, not ``overflow``) is priced before any
layer runs: the planner measures what the cheap layers alone and a fold of every foldable run
would leave (a dry run of the free layers on a copy: no summarizer call), and
:func:`~.economics.decide` chooses. The visit then folds to the chosen, deeper target (every
layer in one rewrite, so one cache break), or changes nothing and records ``would-not-pay`` with
the figures (:attr:`CompactionRecord.economics`). ``idle`` visits start from the policy's idle
trigger and are priced with a cold cache. Without ``economics``, or with ``economics="window"``,
nothing is priced: the visit runs as described above. A fold that can wait for a provider's
batch API (:mod:`.batching`) is priced at its rate and asks its summaries of the visit's batch
summarizer.

The planner is pure: the only I/O is the summarizer call (and the ``originals`` lookup a caller
may pass, read only for a clipped output edited again). The result describes the change as a
:class:`~sessionfold.core.window.FoldEdit` (items replaced, with their versions, and the items
that take their place), which the store commits under compare-and-set.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .clip import clip_oversized
from .economics import FoldEconomics, decide, nothing_to_price
from .errors import (
    InvalidInputError,
    InvalidMessageError,
    SummarizerError,
    TransientSummarizerError,
)
from .frame import frame_info
from .layers import item_tokens
from .messages import Message, SummaryMark, check_tool_pairing, parse_message
from .planner import CHEAP_LAYERS, Planner
from .policy import FoldPolicy
from .sizes import Sizes, message_chars
from .summarizers import Summarizer
from .tokens import Calibration, TokenCounter, default_counter
from .turns import protect, protection_refusals
from .window import (
    CompactionRecord,
    FoldEdit,
    FoldedSpan,
    Originals,
    Outcome,
    Refusal,
    RefusalReason,
    Trigger,
    WindowItem,
)

if TYPE_CHECKING:
    from .cycles import FoldChoice

__all__ = ["CompactResult", "FoldResult", "FoldVisit", "compact", "fold_window"]

# Refusals that are about folding itself (not protection): a visit with one of these and no
# change is "refused", not "nothing-to-fold".
_FOLD_REFUSALS: frozenset[str] = frozenset({
    "only-existing-summary", "replacement-not-smaller", "summarizer-failed",
    "retention-check-failed", "would-not-pay",
})


@dataclass(frozen=True)
class FoldResult:
    """What a visit decided: the new window, the edit to commit, the record and the spans.

    ``summarizer_error`` is the error behind a ``summarizer-failed`` refusal, if any. fold_window
    never raises it: the cheap layers' work stays in ``edit`` (worth committing), and a caller
    that can retry (a Celery task) commits that, then retries when :attr:`retryable`.
    """

    window: list[WindowItem]
    edit: FoldEdit
    record: CompactionRecord
    spans: list[FoldedSpan]
    summarizer_error: SummarizerError | None = None

    @property
    def changed(self) -> bool:
        return not self.edit.empty

    @property
    def retryable(self) -> bool:
        """The summarizer failed with a transient error (429, 529, 5xx, timeout)."""
        return isinstance(self.summarizer_error, TransientSummarizerError)

    def messages(self) -> list[Message]:
        return [item.message for item in self.window]


@dataclass(frozen=True)
class CompactResult:
    """:func:`compact`'s answer: the window, its messages, the record and the spans."""

    window: list[WindowItem]
    messages: list[Message]
    record: CompactionRecord
    spans: list[FoldedSpan]
    summarizer_error: SummarizerError | None = None

    @property
    def summaries(self) -> tuple[SummaryMark, ...]:
        """The summaries and notices of :attr:`messages`, as a session file marks them."""
        return tuple(SummaryMark(index=i, kind=item.kind, start_seq=item.start_seq,
                                 end_seq=item.end_seq)
                     for i, item in enumerate(self.window) if item.kind in ("summary", "notice"))


def _check_items(items: Sequence[WindowItem]) -> None:
    for pos in range(1, len(items)):
        if items[pos].start_seq <= items[pos - 1].end_seq:
            raise InvalidInputError(
                f"window items must be ordered by seq without overlap: item {pos} starts at "
                f"#{items[pos].start_seq}, item {pos - 1} ends at #{items[pos - 1].end_seq}"
            )
        if items[pos].start_seq != items[pos - 1].end_seq + 1:
            raise InvalidInputError(
                f"window items must cover every seq: #{items[pos - 1].end_seq + 1}–"
                f"#{items[pos].start_seq - 1} are missing before item {pos}"
            )
        if items[pos].end_seq < items[pos].start_seq:
            raise InvalidInputError(f"item {pos} ends (#{items[pos].end_seq}) before it starts")


def _edit(before: Sequence[WindowItem], after: Sequence[WindowItem]) -> FoldEdit:
    """Exactly the items removed or changed, and their replacements (identity decides)."""
    kept = {id(item) for item in after}
    old = {id(item) for item in before}
    return FoldEdit(replaced=tuple(i for i in before if id(i) not in kept),
                    inserted=tuple(i for i in after if id(i) not in old))


def _why_not(planner: Planner, protected: list[Refusal]) -> str:
    reasons: list[str] = []
    for refusal in planner.refusals:
        if refusal.reason in _FOLD_REFUSALS:
            reasons.append(f"{refusal.reason} (#{refusal.start_seq}–#{refusal.end_seq}"
                           + (f": {refusal.detail}" if refusal.detail else "") + ")")
    reasons.extend(planner.notes)
    names = sorted({r.reason for r in protected})
    if names:
        reasons.append("everything else is protected (" + ", ".join(names) + ")")
    return (f"still {round(planner.current)} tokens, over the target of {planner.target}: "
            + "; ".join(reasons or ["the layers ran out of foldable history"]))


@dataclass(frozen=True)
class FoldVisit:
    """What one visit of a window is given, beside the items: the policy and the summarizer,
    what is known of the window's size, why the visit happens and how hard it may fold, and what
    it may read. One value, so a caller names what it knows and the planner reads it in one
    place::

        fold_window(window.items, FoldVisit(info.policy, summarizer, trigger="threshold",
                                            measured_tokens=info.current_tokens))

    ``measured_tokens`` is the provider-reported size of this window plus the system prompt;
    without it the (calibrated) estimate is used. ``force`` (overflow) folds even under the
    trigger and lets the retention check record lost identifiers instead of refusing.
    ``target_tokens`` overrides the policy's target. ``latched`` holds fingerprints of spans
    refused before (optionally mapped to their reason): they are not sent to the summarizer
    again. ``originals`` looks up a ledger message by seq: it is called only for an item the
    ``edits`` say was clipped, when a layer edits it again (masks it, or clips it shorter), so
    the line it writes names the original's size; without it that size is left unnamed.
    ``summarizer_skipped`` says why ``summarizer`` is None (a spend cap reached, no slot free):
    the record names it when the ``summarize`` layer is reached and skipped.
    ``economics`` prices the visit when the policy says ``economics="dollars"`` (see "Priced
    visits" in the module doc); forced and ``overflow`` visits are never priced.
    ``batch_summarizer`` is what a visit the cost model sends through a provider's batch API
    asks its summaries of (:mod:`.batching`; the economics' ``batch`` terms price it, and are
    ignored without it). It may raise :class:`~.errors.SummaryDeferred` (the request went to
    the batch API), which fold_window lets through: the visit is made again, with the same
    inputs, once the answer is in.
    ``trigger_tokens`` is the session's trigger as the store keeps it: for a priced visit it may
    be below the policy's (the cost model set the next visit earlier:
    :func:`~.economics.next_trigger_tokens`); an unpriced visit always waits for the policy's.
    ``item_chars`` is, when the caller knows it, the size of each item's message as compact JSON
    (what the record's ``chars_before`` and ``chars_after`` add up), parallel to the items; a
    None entry, or no list, is measured here. The store passes the length of the JSON it holds
    (:attr:`~sessionfold.store.results.Window.chars`): serializing every message again only to
    measure it was a tenth of a fold's CPU.
    """

    policy: FoldPolicy
    summarizer: Summarizer | None = None
    system: str = ""
    measured_tokens: int | None = None
    calibration: Calibration | None = None
    trigger: Trigger = "manual"
    force: bool = False
    target_tokens: int | None = None
    pinned: Collection[int] = ()
    latched: Collection[str] | Mapping[str, RefusalReason] = ()
    counter: TokenCounter | None = None
    originals: Originals | None = None
    summarizer_skipped: str | None = None
    economics: FoldEconomics | None = None
    trigger_tokens: int | None = None
    item_chars: Sequence[int | None] | None = None
    batch_summarizer: Summarizer | None = None


def fold_window(items: Sequence[WindowItem], visit: FoldVisit) -> FoldResult:
    """Plan and run one visit of a window (see the module docstring, :class:`FoldVisit` and
    docs/internals.md). Never raises a summarizer error: see :class:`FoldResult`."""
    if not isinstance(visit, FoldVisit):
        raise InvalidInputError(f"fold_window takes a FoldVisit, got {type(visit).__name__}")
    policy, summarizer, trigger, force = (visit.policy, visit.summarizer, visit.trigger,
                                          visit.force)
    target_tokens, calibration, economics = (visit.target_tokens, visit.calibration,
                                             visit.economics)
    _check_items(items)
    if economics is not None and economics.batch is not None and visit.batch_summarizer is None:
        economics = replace(economics, batch=None)  # no batch API to send the fold to
    if target_tokens is not None and target_tokens < 0:
        raise InvalidInputError(f"target_tokens must be >= 0, got {target_tokens}")
    sizes = Sizes(visit.counter or default_counter())
    if visit.item_chars is not None:
        sizes.known_chars(items, visit.item_chars)
    target = policy.target_tokens if target_tokens is None else target_tokens
    estimate = sizes.counter.system(visit.system) + sum(sizes.tokens(i) for i in items)
    if visit.measured_tokens is not None:
        before, measured_by = float(visit.measured_tokens), "reported"
    else:
        before = float(calibration.predict(estimate) if calibration else estimate)
        measured_by = "estimate"
    slope = calibration.a if calibration is not None and calibration.samples > 0 else 1.0
    chars_before = sum(sizes.chars(i) for i in items)

    def record(outcome: Outcome, tokens_after: float, **extra: Any) -> CompactionRecord:
        return CompactionRecord(
            trigger=trigger, outcome=outcome, budget_tokens=policy.budget_tokens,
            target_tokens=target, measured_tokens=round(before), measured_by=measured_by,
            tokens_after=round(tokens_after), chars_before=chars_before, forced=force, **extra,
        )

    priced = (economics is not None and policy.economics == "dollars" and not force
              and trigger != "overflow")
    idle = priced and trigger == "idle"
    gate_tokens = policy.trigger_tokens
    if priced and visit.trigger_tokens is not None:
        gate_tokens = max(0, min(gate_tokens, visit.trigger_tokens))
    if not force and not (policy.over_idle_trigger(before) if idle else before > gate_tokens):
        gate = (f"the idle trigger of {policy.idle_trigger_tokens}" if idle
                else f"the trigger of {gate_tokens}")
        return FoldResult(list(items), FoldEdit(), record(
            "nothing-to-fold", before, chars_after=chars_before,
            detail=f"{round(before)} tokens, at or under {gate}",
        ), [])

    planner = Planner(items=list(items), policy=policy, summarizer=summarizer, sizes=sizes,
                      target=target, slope=slope, current=before, force=force,
                      pinned=visit.pinned, latched=visit.latched, originals=visit.originals)
    planner.clip()
    planner.protection = protect(planner.items, policy, visit.pinned, turns=planner.turns())
    protected = protection_refusals(planner.turns(), planner.protection,
                                    reasons=planner.guarded().reasons)
    choice: FoldChoice | None = None
    if economics is not None and priced:
        choice = decide(policy, economics, planner.shape(economics.growth_tokens))
    waiting = choice is not None and not choice.fold  # the cost model says: not now
    if choice is not None and waiting:
        planner.would_not_pay(choice)  # nothing more runs: the window stays as it is
    elif choice is not None:
        # Deeper than the policy's target when that pays best: every layer, one rewrite.
        target = planner.target = choice.option.target_tokens
        if choice.batch:
            planner.summarizer = visit.batch_summarizer
    if planner.over() and not waiting:
        planner.drop_recall()
    for layer in policy.layers:
        if waiting or not planner.over():
            break
        if layer in CHEAP_LAYERS:
            planner.cheap_layer(layer)
        elif summarizer is None and layer == "summarize":
            planner.notes.append("summarize skipped: "
                               + (visit.summarizer_skipped or "no summarizer given"))
            continue
        else:
            planner.fold_runs("summary" if layer == "summarize" else "notice")
        planner.layers_run.append(layer)

    edit = _edit(items, planner.items)
    refusals = (*protected, *planner.refusals)
    if not edit.empty:
        outcome: Outcome = "folded"
    elif any(r.reason in _FOLD_REFUSALS for r in planner.refusals):
        outcome = "refused"
    else:
        outcome = "nothing-to-fold"
    if choice is not None and waiting:
        detail = choice.explain()
    elif planner.over():
        detail = _why_not(planner, protected)
    elif choice is not None:
        detail = choice.explain()
    elif edit.empty:
        detail = f"{round(before)} tokens, already at or under the target of {target}"
    else:
        detail = ""
    return FoldResult(planner.items, edit, record(
        outcome, planner.current, layers_run=tuple(planner.layers_run),
        folded=tuple((s.start_seq, s.end_seq) for s in planner.spans),
        chars_after=sum(sizes.chars(i) for i in planner.items),
        summarizer_usage=planner.usage, refusals=refusals, detail=detail,
        economics=(choice.to_json() if choice is not None
                   else nothing_to_price(before) if priced else None),
    ), list(planner.spans), planner.error)


def _marks_by_index(messages: Sequence[Message],
                    summaries: Sequence[SummaryMark]) -> dict[int, SummaryMark]:
    """The marks by message index, each checked against the message it points at.

    A mark must point at a user text message whose frame line names the same kind and range:
    that frame is how sessionfold writes every summary, so a mark shifted by an edit (or naming
    a user's message) is refused instead of turning someone's words into a summary.
    """
    marks: dict[int, SummaryMark] = {}
    for mark in summaries:
        if not isinstance(mark, SummaryMark):
            raise InvalidInputError(f"summaries take SummaryMark objects, got "
                                    f"{type(mark).__name__}")
        if mark.index >= len(messages) or mark.index in marks:
            raise InvalidInputError(f"summary mark of message {mark.index}: no such message, "
                                    "or marked twice")
        if mark.end_seq < mark.start_seq:
            raise InvalidMessageError(f"marked range #{mark.start_seq}–#{mark.end_seq} ends "
                                      "before it starts", index=mark.index, field="summaries")
        info = frame_info(messages[mark.index])
        if info is None or (info.kind, info.start_seq, info.end_seq) != (
                mark.kind, mark.start_seq, mark.end_seq):
            says = ("no frame line sessionfold writes" if info is None else
                    f"a {info.kind} of #{info.start_seq}–#{info.end_seq}")
            raise InvalidMessageError(
                f"marked as a {mark.kind} of #{mark.start_seq}–#{mark.end_seq}, but the message "
                f"holds {says}", index=mark.index, field="summaries")
        marks[mark.index] = mark
    return marks


def _load_items(messages: Sequence[Message], summaries: Sequence[SummaryMark], max_tokens: int,
                counter: TokenCounter) -> list[WindowItem]:
    """Window items for a message list: from seq 0, each message takes the next seq, and a
    marked summary (or notice) its marked range. Only a mark makes a summary."""
    marks = _marks_by_index(messages, summaries)
    items: list[WindowItem] = []
    seq = 0
    for index, message in enumerate(messages):
        mark = marks.get(index)
        if mark is None:
            # Counted here (fold_window counts every item anyway), so clipping answers most
            # messages from the count, and compact's own count of a clipped original is a hit.
            item = WindowItem(start_seq=seq, end_seq=seq, message=message,
                              tokens=counter.message(message))
            items.append(clip_oversized(item, seq, max_tokens, counter))
            seq += 1
            continue
        if mark.start_seq != seq:
            raise InvalidMessageError(
                f"marked as a {mark.kind} of #{mark.start_seq}–#{mark.end_seq}, but it stands "
                f"where #{seq} comes: seqs run on without gaps from #0",
                index=index, field="summaries")
        items.append(WindowItem(start_seq=mark.start_seq, end_seq=mark.end_seq, kind=mark.kind,
                                message=message))
        seq = mark.end_seq + 1
    return items


def compact(
    messages: Sequence[Message | Mapping[str, Any]], policy: FoldPolicy,
    summarizer: Summarizer | None, *,
    system: str = "",
    measured_tokens: int | None = None,
    trigger: Trigger = "manual",
    force: bool = False,
    pinned: Collection[int] = (),
    counter: TokenCounter | None = None,
    summaries: Sequence[SummaryMark] = (),
) -> CompactResult:
    """Compact a message list; without ``summaries`` its seqs are the 0-based input indexes.

    ``messages`` are :class:`Message` objects or raw Anthropic-shape dicts; tool pairing is
    checked. ``summaries`` marks the messages that are summaries (or notices) of an earlier
    compaction, with their ledger ranges (:attr:`CompactResult.summaries` gives them, and a
    session file keeps them beside its messages): such a summary is rolled into the next one
    instead of being summarized as a user's words. Only a mark makes a summary; a message whose
    text starts like a frame line is a plain message. Seqs then run from 0: each plain message
    takes the next one, each marked summary its range (``pinned`` names these seqs).

    Oversized messages are clipped as they are loaded (``clip-oversized``, always); then
    :func:`fold_window` runs on the clipped window. ``measured_tokens`` is the provider-reported
    size of ``messages`` plus ``system`` as given (before clipping); without it the record's
    ``measured_tokens`` is the estimate of the input as given, before clipping too, so a record
    of an input that only needed clipping shows what clipping saved (its outcome stays
    ``nothing-to-fold``: a clip is not a fold; ``layers_run`` names ``clip-oversized``).
    """
    counter = counter or default_counter()
    parsed = [parse_message(m, i) for i, m in enumerate(messages)]
    check_tool_pairing(parsed)
    loaded = _load_items(parsed, summaries, policy.max_item_tokens, counter)
    # The messages given are the originals a clipped item is masked against.
    originals = {item.start_seq: parsed[i] for i, item in enumerate(loaded)
                 if item.kind == "message"}
    clipped = [i for i, item in enumerate(loaded) if item.edits]
    # What clipping at load saved, in estimate tokens (counting the originals whole).
    saved = sum(counter.message(parsed[i]) - item_tokens(loaded[i], counter) for i in clipped)
    measured = measured_tokens
    if clipped and measured_tokens is not None:
        # The provider measured the outputs whole; the window fold_window sees is clipped.
        measured = max(0, measured_tokens - saved)
    result = fold_window(loaded, FoldVisit(
        policy, summarizer, system=system, measured_tokens=measured, trigger=trigger,
        force=force, pinned=pinned, counter=counter, originals=originals.get))
    record = result.record
    if clipped:
        record = record.model_copy(update={
            "layers_run": ("clip-oversized",
                           *(x for x in record.layers_run if x != "clip-oversized")),
            "chars_before": sum(message_chars(m) for m in parsed),
            # The size of the input as given: the provider's, else the estimate fold_window
            # made of the clipped window plus what clipping took out of it.
            "measured_tokens": (measured_tokens if measured_tokens is not None
                                else record.measured_tokens + saved),
        })
    return CompactResult(result.window, result.messages(), record, result.spans,
                         result.summarizer_error)
