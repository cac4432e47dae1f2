"""The fold planner: :func:`fold_window` for a stored window, :func:`compact` for a message list.

A visit measures the window; at or under the trigger (and not forced) it changes nothing.
Otherwise it runs the policy's layers cheapest first, re-measuring after each and stopping as
soon as the window is at or under the target:

1. ``clip-oversized`` (always; idempotent, normally already done on append);
2. ``mask-tool-results`` and ``drop-thinking`` on unprotected items, oldest first;
3. ``summarize`` (or ``drop-oldest``) on the oldest run of foldable turns: the shortest prefix of
   the run expected to reach the target is replaced by one summary (or notice) item. An earlier
   summary at the head of the run is passed on as ``previous_summary`` and replaced (rolling),
   so each run of foldable history is led by at most one summary. If the summary came out
   larger than expected, the next turns of the run are folded into it the same way.

Every refusal is data in the record: protection (``first-user``, ``inside-keep-window``, ...),
``only-existing-summary``, ``replacement-not-smaller`` and ``retention-check-failed`` (both carry
the span fingerprint so the store latches it and the span is not paid for again),
``summarizer-failed`` (a transient error is also returned in :attr:`FoldResult.summarizer_error`
so a Celery task can retry it).

The planner is pure: the only I/O is the summarizer call. The result describes the change as a
:class:`~sessionfold.core.window.FoldEdit` (items replaced, with their versions, and the items
that take their place), which the store commits under compare-and-set.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import (
    InvalidInputError,
    PermanentSummarizerError,
    SummarizerError,
    TransientSummarizerError,
)
from .frame import fingerprint, frame_info, notice_message, summary_body, summary_message
from .layers import clip_oversized, drop_thinking, item_tokens, mask_tool_results
from .messages import Message, check_tool_pairing, parse_message
from .policy import FoldPolicy
from .retention import check_retention, extract_identifiers
from .summarizers import Summarizer
from .tokens import Calibration, TokenCounter, count_text, default_counter
from .turns import Protection, Run, Turn, foldable_runs, group_turns, protect, protection_refusals
from .window import (
    CompactionRecord,
    FoldEdit,
    FoldedSpan,
    Outcome,
    Refusal,
    RefusalReason,
    SummarizerUsage,
    Trigger,
    WindowItem,
)

__all__ = ["CompactResult", "FoldResult", "compact", "fold_window"]

#: Identifiers the retention check compares at most (the most recurring of the span's own).
RETENTION_LIMIT = 40

# Refusals that are about folding itself (not protection): a visit with one of these and no
# change is "refused", not "nothing-to-fold".
_FOLD_REFUSALS: frozenset[str] = frozenset({
    "only-existing-summary", "replacement-not-smaller", "summarizer-failed",
    "retention-check-failed",
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


class _Sizes:
    """Token and character sizes of items, counted once per item object."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        # Keyed by id(); the item is held in the value so its id cannot be reused meanwhile.
        self._tokens: dict[int, tuple[WindowItem, int]] = {}
        self._chars: dict[int, tuple[WindowItem, int]] = {}

    def tokens(self, item: WindowItem) -> int:
        if item.tokens is not None:
            return item.tokens
        hit = self._tokens.get(id(item))
        if hit is None:
            hit = (item, item_tokens(item, self.counter))
            self._tokens[id(item)] = hit
        return hit[1]

    def chars(self, item: WindowItem) -> int:
        hit = self._chars.get(id(item))
        if hit is None:
            hit = (item, _message_chars(item.message))
            self._chars[id(item)] = hit
        return hit[1]


def _message_chars(message: Message) -> int:
    """Characters of the message as JSON: what goes over the wire."""
    return len(json.dumps(message.to_json(), ensure_ascii=False, separators=(",", ":")))


@dataclass
class _Paid:
    """Summarizer usage of one span, accumulated call by call (kept even if a call fails)."""

    usage: SummarizerUsage = field(default_factory=SummarizerUsage)


@dataclass
class _SpanFold:
    """A replacement item for a span, with its record, or the refusal that stopped it."""

    item: WindowItem | None = None
    span: FoldedSpan | None = None
    refusal: Refusal | None = None
    error: SummarizerError | None = None


@dataclass
class _Visit:
    """The mutable state of one fold_window call."""

    items: list[WindowItem]
    policy: FoldPolicy
    summarizer: Summarizer | None
    sizes: _Sizes
    target: int
    slope: float
    current: float
    force: bool
    pinned: Collection[int]
    latched: Collection[str] | Mapping[str, RefusalReason]
    protection: Protection = field(default_factory=Protection)
    refusals: list[Refusal] = field(default_factory=list)
    spans: list[FoldedSpan] = field(default_factory=list)
    usage: SummarizerUsage = field(default_factory=SummarizerUsage)
    layers_run: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: SummarizerError | None = None

    # --- measuring --------------------------------------------------------------------------

    def over(self) -> bool:
        return self.current > self.target

    def need(self) -> int:
        """Estimate tokens still to save (the estimate moves ``slope`` times slower)."""
        return max(0, math.ceil((self.current - self.target) / self.slope))

    def replace(self, start: int, stop: int, new: Sequence[WindowItem]) -> None:
        saved = (sum(self.sizes.tokens(i) for i in self.items[start:stop])
                 - sum(self.sizes.tokens(i) for i in new))
        self.items[start:stop] = new
        self.current -= self.slope * saved

    def apply_pass(self, items: list[WindowItem], saved: int) -> None:
        self.items = items
        self.current -= self.slope * saved

    # --- cheap layers -----------------------------------------------------------------------

    def unprotected_positions(self) -> list[int]:
        return [pos for turn in group_turns(self.items) if self.protection.reason(turn) is None
                for pos in range(turn.index, turn.stop)]

    def clip(self) -> None:
        limit = self.policy.max_item_tokens
        for pos, item in enumerate(self.items):
            new = clip_oversized(item, None, limit, self.sizes.counter)
            if new is not item:
                self.replace(pos, pos + 1, [new])
                if "clip-oversized" not in self.layers_run:
                    self.layers_run.append("clip-oversized")

    def cheap_layer(self, name: str) -> None:
        run = mask_tool_results if name == "mask-tool-results" else drop_thinking
        result = run(self.items, self.unprotected_positions(), tokens_to_save=self.need(),
                     size=self.sizes.tokens, counter=self.sizes.counter)
        self.apply_pass(result.items, result.saved)

    # --- folding runs -----------------------------------------------------------------------

    def fold_runs(self, kind: str) -> None:
        """Fold the oldest runs, prefix by prefix, until at or under the target."""
        finished: set[int] = set()
        while self.over():
            runs = foldable_runs(group_turns(self.items), self.protection)
            run = next((r for r in runs if r.start_seq not in finished), None)
            if run is None:
                return
            finished_run = self.fold_one(run, kind)
            if finished_run:
                finished.add(run.start_seq)
            if self.error is not None:
                return  # the summarizer is failing: calling it again this visit will not help

    def fold_one(self, run: Run, kind: str) -> bool:
        """Fold a prefix of ``run``; True when nothing more of it can be folded."""
        body = run.body
        if not body:
            self.refusals.append(Refusal(
                reason="only-existing-summary", start_seq=run.start_seq, end_seq=run.end_seq,
                detail="the only foldable history here is an earlier summary",
            ))
            return True
        head = run.head
        head_tokens = self.turn_tokens(head) if head is not None else 0
        if kind == "summary":
            reserve = max(head_tokens if run.turns[0].is_summary else 0,
                          self.policy.budget_tokens // 20)
        else:
            reserve = 64  # a notice is one short line
        count = self.prefix_length(body, head_tokens, reserve)
        while True:
            span = [*(head.items if head is not None else ()),
                    *(item for turn in body[:count] for item in turn.items)]
            fp = fingerprint([item.message for item in span])
            if fp not in self.latched:
                break
            reason: RefusalReason = (
                self.latched[fp] if isinstance(self.latched, Mapping)
                else "replacement-not-smaller"
            )
            self.refusals.append(Refusal(
                reason=reason, start_seq=span[0].start_seq, end_seq=span[-1].end_seq,
                fingerprint=fp, detail="refused before (latched): not asked again",
            ))
            if count == len(body):
                return True
            count += 1  # the same span was refused before: a longer one is a new question
        turns = [*([head] if head is not None else []), *body[:count]]
        result = (self.summarize(turns, fp) if kind == "summary" else self.notice(span, fp))
        if result.error is not None:
            self.error = result.error
        if result.refusal is not None:
            self.refusals.append(result.refusal)
            return True
        assert result.item is not None and result.span is not None
        start = turns[0].index
        stop = turns[-1].stop
        self.replace(start, stop, [result.item])
        self.add_span(result.span)
        return count == len(body)

    def turn_tokens(self, turn: Turn) -> int:
        return sum(self.sizes.tokens(item) for item in turn.items)

    def prefix_length(self, body: Sequence[Turn], head_tokens: int, reserve: int) -> int:
        """The fewest turns of ``body`` whose fold is expected to reach the target."""
        need = self.need()
        total = head_tokens
        for n, turn in enumerate(body, 1):
            total += self.turn_tokens(turn)
            if total - reserve >= need:
                return n
        return len(body)

    def add_span(self, span: FoldedSpan) -> None:
        # A later round of the same visit may roll an earlier one of its own spans into a
        # longer one; only the span that stays in the window is recorded, with the cost of both.
        inner = [s for s in self.spans
                 if span.start_seq <= s.start_seq and s.end_seq <= span.end_seq]
        if inner:
            self.spans = [s for s in self.spans if s not in inner]
            usage = span.usage
            lost = list(span.lost_identifiers)
            for s in inner:
                usage = s.usage + usage
                lost.extend(x for x in s.lost_identifiers if x not in lost)
            span = span.model_copy(update={"usage": usage, "lost_identifiers": tuple(lost)})
        self.spans.append(span)

    # --- the replacements -------------------------------------------------------------------

    def span_bounds(self, items: Sequence[WindowItem]) -> tuple[int, int, int]:
        start, end = items[0].start_seq, items[-1].end_seq
        return start, end, end - start + 1

    def notice(self, span: list[WindowItem], fp: str) -> _SpanFold:
        start, end, count = self.span_bounds(span)
        message = notice_message(start_seq=start, end_seq=end, message_count=count,
                                 retained=self.policy.retain == "ledger")
        item = WindowItem(start_seq=start, end_seq=end, kind="notice", message=message,
                          tokens=self.sizes.counter.message(message))
        before = sum(self.sizes.tokens(i) for i in span)
        if self.sizes.tokens(item) >= before:
            return _SpanFold(refusal=Refusal(
                reason="replacement-not-smaller", start_seq=start, end_seq=end,
                detail=f"a notice ({self.sizes.tokens(item)} tokens) is no smaller than the "
                       f"span ({before} tokens)",
            ))
        return _SpanFold(item=item, span=FoldedSpan(
            start_seq=start, end_seq=end, message_count=count, fingerprint=fp, kind="notice",
            retained=self.policy.retain == "ledger",
            chars_before=sum(self.sizes.chars(i) for i in span),
            chars_after=self.sizes.chars(item),
        ))

    def summarize(self, turns: list[Turn], fp: str) -> _SpanFold:
        summarizer = self.summarizer
        assert summarizer is not None
        span = [item for turn in turns for item in turn.items]
        start, end, count = self.span_bounds(span)
        head = turns[0] if turns[0].is_fold else None
        previous = summary_body(head.items[0].message) if head and head.is_summary else None
        # An earlier summary inside the span (not at its head) goes along as a message.
        groups = [list(t.items) for t in (turns[1:] if head is not None else turns)]
        identifiers = extract_identifiers([i.message for g in groups for i in g],
                                          exclude=previous or "", limit=RETENTION_LIMIT)
        paid = _Paid()
        try:
            text = self.chain(summarizer, groups, previous, (), paid)
            check = check_retention(text, identifiers, self.policy.retention_min)
            if not check.ok:
                # Once more, naming what went missing; keep whichever answer kept more.
                text2 = self.chain(summarizer, groups, previous, check.missing, paid)
                check2 = check_retention(text2, identifiers, self.policy.retention_min)
                if check2.ratio >= check.ratio:
                    text, check = text2, check2
        except (TransientSummarizerError, PermanentSummarizerError) as exc:
            kind = "transient" if isinstance(exc, TransientSummarizerError) else "permanent"
            return _SpanFold(error=exc, refusal=Refusal(
                reason="summarizer-failed", start_seq=start, end_seq=end,
                detail=f"{kind}: {exc}",
            ))
        finally:
            self.usage = self.usage + paid.usage  # paid for, whatever came of it
        retained = self.policy.retain == "ledger"
        message = summary_message(text, start_seq=start, end_seq=end, message_count=count,
                                  model=summarizer.model, retained=retained)
        item = WindowItem(start_seq=start, end_seq=end, kind="summary", message=message,
                          tokens=self.sizes.counter.message(message))
        before = sum(self.sizes.tokens(i) for i in span)
        if self.sizes.tokens(item) >= before:
            return _SpanFold(refusal=Refusal(
                reason="replacement-not-smaller", start_seq=start, end_seq=end, fingerprint=fp,
                detail=f"the summary ({self.sizes.tokens(item)} tokens) is no smaller than the "
                       f"span ({before} tokens)",
            ))
        lost: tuple[str, ...] = ()
        if not check.ok:
            if not self.force:
                return _SpanFold(refusal=Refusal(
                    reason="retention-check-failed", start_seq=start, end_seq=end,
                    fingerprint=fp,
                    detail=f"the summary kept {len(check.kept)} of {len(identifiers)} "
                           f"identifiers ({check.ratio:.2f} < {self.policy.retention_min}); "
                           "missing: " + ", ".join(check.missing[:20]),
                ))
            lost = check.missing  # overflow: fold anyway, and say what was lost
        return _SpanFold(item=item, span=FoldedSpan(
            start_seq=start, end_seq=end, message_count=count, fingerprint=fp, kind="summary",
            model=summarizer.model, usage=paid.usage, retained=retained, lost_identifiers=lost,
            chars_before=sum(self.sizes.chars(i) for i in span),
            chars_after=self.sizes.chars(item),
        ))

    def chain(self, summarizer: Summarizer, groups: list[list[WindowItem]],
              previous: str | None, must_keep: Sequence[str], paid: _Paid) -> str:
        """Summarize ``groups`` (the items of one turn each), in chunks when they are larger
        than the summarizer's context, each chunk folded into the running summary."""
        running = previous
        pending = list(groups)
        while True:
            room = max(summarizer.context_tokens - count_text(running or ""),
                       summarizer.context_tokens // 2)
            chunk: list[Message] = []
            used = 0
            while pending:
                size = sum(self.sizes.tokens(i) for i in pending[0])
                if chunk and used + size > room:
                    break
                chunk.extend(i.message for i in pending.pop(0))
                used += size
            summary = summarizer.summarize(chunk, previous_summary=running, must_keep=must_keep)
            paid.usage = paid.usage + summary.usage
            running = summary.text
            if not pending:
                return running


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


def _why_not(visit: _Visit, protected: list[Refusal]) -> str:
    reasons: list[str] = []
    for refusal in visit.refusals:
        if refusal.reason in _FOLD_REFUSALS:
            reasons.append(f"{refusal.reason} (#{refusal.start_seq}–#{refusal.end_seq}"
                           + (f": {refusal.detail}" if refusal.detail else "") + ")")
    reasons.extend(visit.notes)
    names = sorted({r.reason for r in protected})
    if names:
        reasons.append("everything else is protected (" + ", ".join(names) + ")")
    return (f"still {round(visit.current)} tokens, over the target of {visit.target}: "
            + "; ".join(reasons or ["the layers ran out of foldable history"]))


def fold_window(
    items: Sequence[WindowItem], policy: FoldPolicy, summarizer: Summarizer | None, *,
    system: str = "",
    measured_tokens: int | None = None,
    calibration: Calibration | None = None,
    trigger: Trigger = "manual",
    force: bool = False,
    target_tokens: int | None = None,
    pinned: Collection[int] = (),
    latched: Collection[str] | Mapping[str, RefusalReason] = (),
    counter: TokenCounter | None = None,
) -> FoldResult:
    """Plan and run one visit of a window (see the module docstring and docs/internals.md).

    ``measured_tokens`` is the provider-reported size of this window plus the system prompt;
    without it the (calibrated) estimate is used. ``force`` (overflow) folds even under the
    trigger and lets the retention check record lost identifiers instead of refusing.
    ``target_tokens`` overrides the policy's target. ``latched`` holds fingerprints of spans
    refused before (optionally mapped to their reason): they are not sent to the summarizer
    again. Never raises a summarizer error: see :class:`FoldResult`.
    """
    _check_items(items)
    if target_tokens is not None and target_tokens < 0:
        raise InvalidInputError(f"target_tokens must be >= 0, got {target_tokens}")
    sizes = _Sizes(counter or default_counter())
    target = policy.target_tokens if target_tokens is None else target_tokens
    estimate = sizes.counter.system(system) + sum(sizes.tokens(i) for i in items)
    if measured_tokens is not None:
        before, measured_by = float(measured_tokens), "reported"
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

    if not force and before <= policy.trigger_tokens:
        return FoldResult(list(items), FoldEdit(), record(
            "nothing-to-fold", before, chars_after=chars_before,
            detail=f"{round(before)} tokens, at or under the trigger of {policy.trigger_tokens}",
        ), [])

    visit = _Visit(items=list(items), policy=policy, summarizer=summarizer, sizes=sizes,
                   target=target, slope=slope, current=before, force=force, pinned=pinned,
                   latched=latched)
    visit.clip()
    visit.protection = protect(visit.items, policy, pinned)
    protected = protection_refusals(group_turns(visit.items), visit.protection)
    for layer in policy.layers:
        if not visit.over():
            break
        if layer in ("mask-tool-results", "drop-thinking"):
            visit.cheap_layer(layer)
        elif summarizer is None and layer == "summarize":
            visit.notes.append("summarize skipped: no summarizer given")
            continue
        else:
            visit.fold_runs("summary" if layer == "summarize" else "notice")
        visit.layers_run.append(layer)

    edit = _edit(items, visit.items)
    refusals = (*protected, *visit.refusals)
    if not edit.empty:
        outcome: Outcome = "folded"
    elif any(r.reason in _FOLD_REFUSALS for r in visit.refusals):
        outcome = "refused"
    else:
        outcome = "nothing-to-fold"
    if visit.over():
        detail = _why_not(visit, protected)
    elif edit.empty:
        detail = f"{round(before)} tokens, already at or under the target of {target}"
    else:
        detail = ""
    return FoldResult(visit.items, edit, record(
        outcome, visit.current, layers_run=tuple(visit.layers_run),
        folded=tuple((s.start_seq, s.end_seq) for s in visit.spans),
        chars_after=sum(sizes.chars(i) for i in visit.items),
        summarizer_usage=visit.usage, refusals=refusals, detail=detail,
    ), list(visit.spans), visit.error)


def _load_item(message: Message, seq: int, max_tokens: int,
               counter: TokenCounter) -> WindowItem:
    info = frame_info(message) if message.role == "user" else None
    # A summary or notice in the input (a window compacted before) stays one: rolling folds
    # replace it rather than summarize a summary as if it were a user's words.
    kind = info.kind if info is not None else "message"
    item = WindowItem(start_seq=seq, end_seq=seq, kind=kind, message=message)
    return clip_oversized(item, seq, max_tokens, counter)


def compact(
    messages: Sequence[Message | Mapping[str, Any]], policy: FoldPolicy,
    summarizer: Summarizer | None, *,
    system: str = "",
    measured_tokens: int | None = None,
    trigger: Trigger = "manual",
    force: bool = False,
    pinned: Collection[int] = (),
    counter: TokenCounter | None = None,
) -> CompactResult:
    """Compact a plain message list: seqs are the 0-based input indexes.

    ``messages`` are :class:`Message` objects or raw Anthropic-shape dicts; tool pairing is
    checked. Oversized tool results are clipped as the messages are loaded (``clip-oversized``,
    always); then :func:`fold_window` runs. ``measured_tokens`` is the provider-reported size of
    ``messages`` plus ``system`` as given (before clipping); without it the record's
    ``measured_tokens`` is the estimate of the window as loaded (clipped). A message carrying a
    sessionfold frame loads as a summary (or notice) item, so compacting a compacted
    conversation rolls its summary instead of summarizing it as a user's words.
    """
    counter = counter or default_counter()
    parsed = [parse_message(m, i) for i, m in enumerate(messages)]
    check_tool_pairing(parsed)
    loaded = [_load_item(m, i, policy.max_item_tokens, counter) for i, m in enumerate(parsed)]
    clipped = [i for i, item in enumerate(loaded) if item.edits]
    measured = measured_tokens
    if clipped and measured_tokens is not None:
        # The provider measured the outputs whole; the window fold_window sees is clipped.
        saved = sum(counter.message(parsed[i]) - item_tokens(loaded[i], counter)
                    for i in clipped)
        measured = max(0, measured_tokens - saved)
    result = fold_window(loaded, policy, summarizer, system=system, measured_tokens=measured,
                         trigger=trigger, force=force, pinned=pinned, counter=counter)
    record = result.record
    if clipped:
        update: dict[str, Any] = {
            "layers_run": ("clip-oversized",
                           *(x for x in record.layers_run if x != "clip-oversized")),
            "chars_before": sum(_message_chars(m) for m in parsed),
        }
        if measured_tokens is not None:
            update["measured_tokens"] = measured_tokens
        record = record.model_copy(update=update)
    return CompactResult(result.window, result.messages(), record, result.spans,
                         result.summarizer_error)
