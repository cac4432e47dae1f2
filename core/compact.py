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
nothing is priced: the visit runs as described above.

The planner is pure: the only I/O is the summarizer call (and the ``originals`` lookup a caller
may pass, read only for a clipped output edited again). The result describes the change as a
:class:`~sessionfold.core.window.FoldEdit` (items replaced, with their versions, and the items
that take their place), which the store commits under compare-and-set.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .economics import FoldEconomics, FoldShape, decide, nothing_to_price
from .errors import (
    InvalidInputError,
    InvalidMessageError,
    PermanentSummarizerError,
    SummarizerError,
    TransientSummarizerError,
)
from .frame import (
    EarlierFold,
    fingerprint,
    frame_info,
    legacy_fingerprint,
    notice_message,
    summary_body,
    summary_message,
)
from .layers import (
    DROP_RECALL,
    LayerMemo,
    clip_oversized,
    drop_recall_items,
    drop_thinking,
    has_thinking,
    item_tokens,
    last_assistant,
    mask_tool_results,
)
from .messages import Message, SummaryMark, check_tool_pairing, parse_message
from .policy import FoldPolicy
from .retention import (
    IDENTIFIER_LIMIT,
    check_retention,
    excerpts,
    extract_identifiers,
    identifiers_remembered,
)
from .summarizers import Summarizer
from .tokens import Calibration, TokenCounter, count_text, default_counter
from .turns import (
    Protection,
    Run,
    Turn,
    foldable_runs,
    group_turns,
    protect,
    protection_refusals,
    turn_reasons,
)
from .window import (
    CompactionRecord,
    FoldEdit,
    FoldedSpan,
    Originals,
    Outcome,
    Refusal,
    RefusalReason,
    SummarizerUsage,
    Trigger,
    WindowItem,
)

if TYPE_CHECKING:
    from .cost import FoldChoice

__all__ = ["CompactResult", "FoldResult", "compact", "fold_window"]

#: Identifiers the retention check compares at most (the most recurring of the span's own).
RETENTION_LIMIT = IDENTIFIER_LIMIT
#: Characters a summary repair reads either side of a missing identifier's latest mention.
REPAIR_EXCERPT_CHARS = 160
#: The prefix of a retention refusal's latch (see :func:`retention_latch`).
RETENTION_LATCH = "retention"

# Refusals that are about folding itself (not protection): a visit with one of these and no
# change is "refused", not "nothing-to-fold".
_FOLD_REFUSALS: frozenset[str] = frozenset({
    "only-existing-summary", "replacement-not-smaller", "summarizer-failed",
    "retention-check-failed", "would-not-pay",
})
#: Layers that cost nothing and change items in place (the dry run of a priced visit runs them).
_CHEAP_LAYERS = ("mask-tool-results", "drop-thinking")
#: A notice's expected size (one short line), in estimate tokens.
_NOTICE_TOKENS = 64
#: Turns whose mean size estimates a session's growth per call (at least).
_GROWTH_TURNS = 4


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

    def known_chars(self, items: Sequence[WindowItem], chars: Sequence[int | None]) -> None:
        """Take the character sizes the caller knows (``None``: not known, counted if asked)."""
        if len(chars) != len(items):
            raise InvalidInputError(f"item_chars has {len(chars)} sizes for {len(items)} items")
        for item, n in zip(items, chars, strict=True):
            if n is None:
                continue
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise InvalidInputError(f"item_chars holds {n!r} for item #{item.start_seq}; "
                                        "a size is an integer >= 0 or None")
            self._chars[id(item)] = (item, n)

    def chars(self, item: WindowItem) -> int:
        hit = self._chars.get(id(item))
        if hit is None:
            hit = (item, _message_chars(item.message))
            self._chars[id(item)] = hit
        return hit[1]


def _message_chars(message: Message) -> int:
    """Characters of the message as compact JSON: what goes over the wire."""
    return len(message.model_dump_json(exclude_unset=True))


@dataclass(frozen=True)
class _Guarded:
    """What protection holds in one grouping of the window (see :meth:`_Planner.guarded`)."""

    turns: list[Turn]
    protection: Protection
    reasons: list[RefusalReason | None]
    positions: tuple[int, ...]


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
class _Planner:
    """The planner of one visit: the mutable state of one fold_window call, and its steps."""

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
    originals: Originals | None = None
    protection: Protection = field(default_factory=Protection)
    refusals: list[Refusal] = field(default_factory=list)
    spans: list[FoldedSpan] = field(default_factory=list)
    usage: SummarizerUsage = field(default_factory=SummarizerUsage)
    layers_run: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: SummarizerError | None = None
    #: ``group_turns(self.items)``, kept until the items change (replace, apply_pass).
    _turns: list[Turn] | None = field(default=None, repr=False)
    #: For the turns and protection they were computed from: each turn's protection reason,
    #: and the positions of the items no protection holds (``unprotected_positions``).
    _guarded: _Guarded | None = field(default=None, repr=False)
    #: What each cheap layer made of each item, kept for the visit once a priced visit's dry
    #: run starts (its real pass then masks or thins no item twice); None: not kept.
    memos: dict[str, LayerMemo] | None = field(default=None, repr=False)

    def turns(self) -> list[Turn]:
        """The items grouped into turns (computed once per change of the items)."""
        if self._turns is None:
            self._turns = group_turns(self.items)
        return self._turns

    def guarded(self) -> _Guarded:
        """Each turn's protection reason and the unprotected positions, computed once per
        change of the turns' shape or of the protection (a fold asks for them in every pass)."""
        turns, protection = self.turns(), self.protection
        held = self._guarded
        if held is None or held.turns is not turns or held.protection is not protection:
            reasons = turn_reasons(turns, protection)
            positions = tuple(pos for turn, reason in zip(turns, reasons, strict=True)
                              if reason is None for pos in range(turn.index, turn.stop))
            held = self._guarded = _Guarded(turns, protection, reasons, positions)
        return held

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
        self._turns = None
        self.current -= self.slope * saved

    def apply_pass(self, items: list[WindowItem], saved: int,
                   changed: Sequence[int] | None = None) -> None:
        """Take the window a cheap layer left: item for item the same shape (masking and
        thinning keep each item's kind, role and tool ids), so the turns keep their grouping
        and only take the new items (grouping again reads every message). ``changed``: the
        positions the layer changed (None: any); the other turns are kept as they are."""
        turns = self._turns
        if turns is not None and len(items) == len(self.items):
            if changed is None:
                self._turns = [Turn(t.index, tuple(items[t.index:t.stop])) for t in turns]
            else:
                self._turns = list(turns)
                starts = [t.index for t in turns]
                for pos in changed:
                    at = bisect_right(starts, pos) - 1
                    turn = turns[at]
                    self._turns[at] = Turn(turn.index, tuple(items[turn.index:turn.stop]))
            held = self._guarded
            if held is not None and held.turns is turns:
                # Same seqs and kinds turn for turn: protection (keyed by seq) says the same.
                self._guarded = replace(held, turns=self._turns)
        else:
            self._turns = None
        self.items = items
        self.current -= self.slope * saved

    # --- pricing (economics="dollars") -------------------------------------------------------

    def summary_reserve(self) -> int:
        """What one summary is expected to take, in estimate tokens (a twentieth of the budget)."""
        return self.policy.budget_tokens // 20

    def shape(self, growth_tokens: float | None) -> FoldShape:
        """What this visit could do, measured on a copy (the free layers only, no I/O)."""
        # The dry run starts from this planner's items, grouping and layer memos (the same
        # objects: what it computes is kept for the real pass).
        if self.memos is None:
            self.memos = {}
        dry = _Planner(items=list(self.items), policy=self.policy, summarizer=None,
                       sizes=self.sizes, target=0, slope=self.slope, current=self.current,
                       force=self.force, pinned=self.pinned, latched=self.latched,
                       protection=self.protection, _turns=self._turns, _guarded=self._guarded,
                       memos=self.memos)
        dry.drop_recall()
        for layer in self.policy.layers:
            if layer in _CHEAP_LAYERS:
                dry.cheap_layer(layer)
        shape = FoldShape(window_tokens=round(self.current), head_tokens=self.head_tokens(),
                          growth_tokens=growth_tokens or self.growth_tokens(),
                          cheap_tokens=(round(dry.current) if dry.current < self.current
                                        else None))
        kind = ("summary" if "summarize" in self.policy.layers and self.summarizer is not None
                else "notice" if "drop-oldest" in self.policy.layers else None)
        if kind is None:
            return shape
        runs = [r for r in foldable_runs(dry.turns(), self.protection,
                                         reasons=dry.guarded().reasons) if r.body]
        folded = sum(dry.turn_tokens(t) for r in runs for t in r.turns)
        each = self.summary_reserve() if kind == "summary" else _NOTICE_TOKENS
        written = self.slope * each * len(runs)
        if not runs or self.slope * folded <= written:
            return shape
        after = dry.current - self.slope * folded + written
        removed = self.current - after
        return replace(shape, folded_tokens=round(after),
                       summary_tokens=round(written) if kind == "summary" else 0,
                       summarized_fraction=self.slope * folded / removed if removed > 0 else 1.0,
                       fold_label="summarize" if kind == "summary" else "drop-oldest")

    def growth_tokens(self) -> float:
        """Tokens per call, estimated as the mean size of the most recent turns."""
        turns = [t for t in self.turns() if not t.is_recall]
        recent = turns[-max(_GROWTH_TURNS, self.policy.keep_recent_turns):]
        if not recent:
            return max(1.0, self.policy.budget_tokens / 100)
        return max(1.0, self.slope * sum(self.turn_tokens(t) for t in recent) / len(recent))

    def head_tokens(self) -> int:
        """The stable head: the window before the first item a fold may change (system prompt,
        tools and the protected task), still read from the cache after the fold."""
        positions = self.unprotected_positions()
        first = positions[0] if positions else len(self.items)
        tail = sum(self.sizes.tokens(i) for i in self.items[first:])
        return max(0, round(self.current - self.slope * tail))

    def would_not_pay(self, choice: FoldChoice) -> None:
        """Record the choice not to fold (``would-not-pay``) over the foldable range."""
        positions = self.unprotected_positions()
        if choice.refusal is None or not positions:
            return
        self.refusals.append(Refusal(
            reason=choice.refusal, start_seq=self.items[positions[0]].start_seq,
            end_seq=self.items[positions[-1]].end_seq, detail=choice.explain()))

    # --- cheap layers -----------------------------------------------------------------------

    def unprotected_positions(self) -> list[int]:
        return list(self.guarded().positions)

    def clip(self) -> None:
        limit = self.policy.max_item_tokens
        for pos, item in enumerate(self.items):
            if self.sizes.tokens(item) <= limit:
                # The cap is the item's whole count: an item within it has nothing to clip
                # (most items; clip_oversized would count their texts again).
                continue
            new = clip_oversized(item, None, limit, self.sizes.counter)
            if new is not item and "clipped" in item.edits and self.originals is not None:
                # Clipped before, too large for a smaller limit now: clip the ledger original
                # instead, so the clip line names its size (read only in this rare case).
                original = self.originals(item.start_seq)
                if original is not None:
                    new = clip_oversized(item, None, limit, self.sizes.counter,
                                         original=original)
            if new is not item:
                self.replace(pos, pos + 1, [new])
                if "clip-oversized" not in self.layers_run:
                    self.layers_run.append("clip-oversized")

    def drop_recall(self) -> None:
        """``drop-recall``: recall exchanges, oldest first, until enough is saved; each run of
        consecutive ones becomes one line (a line left by an earlier drop is taken along, never
        dropped on its own).

        An exchange is dropped when no protection holds it, and also inside the keep window
        once the model has moved past it (a reply that is not a recall call came after it):
        its answer is a copy of ledger rows that the model used for that step and can ask
        for again, while the turns it sits among stay whole. The newest exchanges, the ones
        the model has not answered yet, are kept."""
        turns = self.turns()
        # Position of the last assistant reply that is not a recall call: exchanges before it
        # have been acted on.
        moved_on = max((t.index for t in turns if not t.is_recall and any(
            i.kind == "message" and i.message.role == "assistant" for i in t.items)),
            default=-1)
        runs: list[list[Turn]] = []
        for turn, reason in zip(turns, self.guarded().reasons, strict=True):
            droppable = (turn.is_recall and not turn.unresolved_tool_use_ids() and (
                reason is None or (reason == "inside-keep-window" and turn.index < moved_on)))
            if not droppable:
                runs.append([])
            elif runs and runs[-1]:
                runs[-1].append(turn)
            else:
                runs.append([turn])
        shift = 0  # items removed before the next run, by the runs dropped so far
        for run in runs:
            if not self.over():
                break
            if not run or all(turn.is_dropped_recall for turn in run):
                continue
            start, stop = run[0].index - shift, run[-1].stop - shift
            line = drop_recall_items(self.items[start:stop], self.sizes.counter)
            if self.sizes.tokens(line) >= sum(self.sizes.tokens(i)
                                              for i in self.items[start:stop]):
                continue
            self.replace(start, stop, [line])
            shift += stop - start - 1
            if DROP_RECALL not in self.layers_run:
                self.layers_run.append(DROP_RECALL)

    def cheap_layer(self, name: str) -> None:
        memo = self.memos.setdefault(name, {}) if self.memos is not None else None
        if name == "mask-tool-results":
            result = mask_tool_results(
                self.items, self.unprotected_positions(), tokens_to_save=self.need(),
                size=self.sizes.tokens, counter=self.sizes.counter, originals=self.originals,
                memo=memo)
        else:
            result = drop_thinking(self.items, self.unprotected_positions(),
                                   tokens_to_save=self.need(), size=self.sizes.tokens,
                                   counter=self.sizes.counter, memo=memo)
        self.apply_pass(result.items, result.saved, result.changed)
        if name == "drop-thinking" and self.over():
            # The layer kept it on purpose; a record short of its target says so.
            last = last_assistant(self.items)
            if (last is not None and has_thinking(self.items[last])
                    and last in self.guarded().positions):
                seq = self.items[last].start_seq
                self.notes.append(f"drop-thinking kept the thinking of #{seq}, the last "
                                  "assistant message (the API requires it)")

    # --- folding runs -----------------------------------------------------------------------

    def fold_runs(self, kind: str) -> None:
        """Fold the oldest runs, prefix by prefix, until at or under the target."""
        finished: set[int] = set()
        while self.over():
            runs = foldable_runs(self.turns(), self.protection,
                                 reasons=self.guarded().reasons)
            run = next((r for r in runs if r.start_seq not in finished), None)
            if run is None:
                return
            if kind == "summary" and self.usage.calls >= self.policy.max_summarizer_calls:
                self.notes.append(f"summarize stopped: this fold made "
                                  f"{self.usage.calls} summarizer calls, the most "
                                  "max_summarizer_calls allows")
                return
            finished_run = self.fold_one(run, kind)
            if finished_run:
                finished.add(run.start_seq)
            if self.error is not None:
                return  # the summarizer is failing: calling it again this visit will not help

    def latched_as(self, fp: str, span: Sequence[WindowItem]) -> str | None:
        """The latch that refused ``span`` before (its fingerprint ``fp``), if one did: one
        stored under ``fp``, or under the span's :func:`~.frame.legacy_fingerprint` (latches
        written before the fingerprint changed; computed only when there are latches)."""
        if not self.latched:
            return None
        if fp in self.latched:
            return fp
        old = legacy_fingerprint([item.message for item in span])
        return old if old in self.latched else None

    def retention_latched(self, start: int, end: int) -> Refusal | None:
        """The refusal to record instead of asking for a summary of ``#start–#end`` again: a
        summary from ``start`` failed the retention check before (latched as
        :func:`retention_latch`) and this span is less than twice that one. A longer span holds
        more identifiers, not fewer: without this, every visit of a growing session paid for a
        summary that would be refused again."""
        prefix = f"{RETENTION_LATCH}:{start}:"
        ends = [int(fp[len(prefix):]) for fp in self.latched
                if fp.startswith(prefix) and fp[len(prefix):].isdigit()]
        if not ends:
            return None
        refused = max(ends)
        if end - start + 1 >= 2 * (refused - start + 1):
            return None
        return Refusal(reason="retention-check-failed", start_seq=start, end_seq=end,
                       detail=f"a summary of #{start}–#{refused} failed the retention check "
                              "before (latched); asked again once the span is twice as long")

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
                          self.summary_reserve())
        else:
            reserve = 64  # a notice is one short line
        count = self.prefix_length(body, head_tokens, reserve)
        if kind == "summary":
            # Recall exchanges are not summarized: a span needs one turn of the agent's.
            agents = [n for n, turn in enumerate(body, 1) if not turn.is_recall]
            if not agents:
                self.refusals.append(Refusal(
                    reason="only-existing-summary", start_seq=run.start_seq,
                    end_seq=run.end_seq, detail="the only foldable history here is an earlier "
                                                "summary and recall exchanges"))
                return True
            count = max(count, agents[0])
        while True:
            span = [*(head.items if head is not None else ()),
                    *(item for turn in body[:count] for item in turn.items)]
            if kind == "summary" and self.retention_veto():
                refused = self.retention_latched(span[0].start_seq, span[-1].end_seq)
                if refused is not None:
                    self.refusals.append(refused)
                    return True
            fp = fingerprint([item.message for item in span])
            held = self.latched_as(fp, span)
            if held is None:
                break
            reason: RefusalReason = (
                self.latched[held] if isinstance(self.latched, Mapping)
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
            # The longer span read each inner summary (its chars_after) where the window had
            # held what that summary replaced (its chars_before): count the latter.
            chars = span.chars_before
            for s in inner:
                usage = s.usage + usage
                lost.extend(x for x in s.lost_identifiers if x not in lost)
                chars += s.chars_before - s.chars_after
            span = span.model_copy(update={"usage": usage, "lost_identifiers": tuple(lost),
                                           "chars_before": chars})
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
                          tokens=self.sizes.counter.fresh(message))
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
        # Whether an item is a summary is its kind, as the store recorded it: a user message
        # that starts like a frame is summarized as the user's words, never passed on here.
        previous = summary_body(head.items[0]) if head and head.is_summary else None
        # An earlier summary inside the span (not at its head) goes along as an EarlierFold;
        # recall exchanges are copies of ledger rows, the summarizer is not given them.
        groups = [list(t.items) for t in (turns[1:] if head is not None else turns)
                  if not t.is_recall]
        paid = _Paid()
        # The extractive summarizer reads the span's identifiers again: once is enough.
        with identifiers_remembered():
            identifiers = extract_identifiers(
                [i.message for g in groups for i in g if i.kind == "message"],
                exclude=previous or "", limit=RETENTION_LIMIT)
            veto = self.retention_veto()
            try:
                text = self.chain(summarizer, groups, previous, (), paid)
                check = check_retention(text, identifiers, self.policy.retention_min)
                calls = self.usage.calls + paid.usage.calls
                if not check.ok and veto and calls < self.policy.max_summarizer_calls:
                    # Once more, naming what went missing; keep whichever answer kept more.
                    text2 = self.repair(summarizer, groups, previous, text, check.missing, paid)
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
        lost: tuple[str, ...] = ()
        if not check.ok:
            if veto:
                return _SpanFold(refusal=Refusal(
                    reason="retention-check-failed", start_seq=start, end_seq=end,
                    fingerprint=retention_latch(start, end),
                    detail=f"the summary kept {len(check.kept)} of {len(identifiers)} "
                           f"identifiers ({check.ratio:.2f} < {self.policy.retention_min}); "
                           "missing: " + ", ".join(check.missing[:20]),
                ))
            # The originals are one recall away (or this is an overflow): fold anyway, and say
            # in an authored line after the summary what it left out and where it is.
            lost = check.missing
        message = summary_message(text, start_seq=start, end_seq=end, message_count=count,
                                  model=summarizer.model, retained=retained, left_out=lost)
        item = WindowItem(start_seq=start, end_seq=end, kind="summary", message=message,
                          tokens=self.sizes.counter.fresh(message))
        before = sum(self.sizes.tokens(i) for i in span)
        if self.sizes.tokens(item) >= before:
            return _SpanFold(refusal=Refusal(
                reason="replacement-not-smaller", start_seq=start, end_seq=end, fingerprint=fp,
                detail=f"the summary ({self.sizes.tokens(item)} tokens) is no smaller than the "
                       f"span ({before} tokens)",
            ))
        return _SpanFold(item=item, span=FoldedSpan(
            start_seq=start, end_seq=end, message_count=count, fingerprint=fp, kind="summary",
            model=summarizer.model, usage=paid.usage, retained=retained, lost_identifiers=lost,
            chars_before=sum(self.sizes.chars(i) for i in span),
            chars_after=self.sizes.chars(item),
        ))

    def retention_veto(self) -> bool:
        """Whether a summary that misses identifiers is refused (``retention-check-failed``):
        only where the originals are not one recall away -- discarded (``retain="discard"``)
        or recall off -- and the visit is not forced. Elsewhere the summary folds with a line
        naming what it left out (:func:`~.frame.left_out_line`): asking again for a span the
        summary cannot hold only pays again (a standing day once spent 141 calls on that)."""
        return not self.force and (self.policy.retain == "discard" or not self.policy.recall)

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
                chunk.extend(_for_summarizer(i) for i in pending.pop(0))
                used += size
            summary = summarizer.summarize(chunk, previous_summary=running, must_keep=must_keep)
            paid.usage = paid.usage + summary.usage
            running = summary.text
            if not pending:
                return running

    def repair(self, summarizer: Summarizer, groups: list[list[WindowItem]],
               previous: str | None, draft: str, missing: Sequence[str], paid: _Paid) -> str:
        """The draft summary again, with the identifiers it lost: one call that reads the
        draft (as the summary to update) and the lines of the span that named them
        (:func:`~.retention.excerpts`), not the whole span a second time. Span text with none
        of them (cannot happen for identifiers taken from the span) falls back to the whole
        span, as the first call read it."""
        messages = [i.message for g in groups for i in g if i.kind == "message"]
        found = excerpts(messages, missing, width=REPAIR_EXCERPT_CHARS)
        if not found:
            return self.chain(summarizer, groups, previous, missing, paid)
        lines = [Message(role=messages[index].role,
                         content=f"(excerpt of the span: where it named identifiers the summary "
                                 f"must keep)\n{text}")
                 for index, text in found]
        summary = summarizer.summarize(lines, previous_summary=draft, must_keep=missing)
        paid.usage = paid.usage + summary.usage
        return summary.text


def retention_latch(start_seq: int, end_seq: int) -> str:
    """The latch a retention refusal leaves: by the span's start and end rather than its
    fingerprint, so a longer span from the same start is refused without a summarizer call
    until it is twice as long (:meth:`_Planner.retention_latched`)."""
    return f"{RETENTION_LATCH}:{start_seq}:{end_seq}"


def _for_summarizer(item: WindowItem) -> Message:
    """What a summarizer is given for ``item``: its message, or for a summary or notice the
    message with the item's record (kind, range, body) attached."""
    return item.message if item.kind == "message" else EarlierFold.of(item)


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


def _why_not(planner: _Planner, protected: list[Refusal]) -> str:
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
    originals: Originals | None = None,
    summarizer_skipped: str | None = None,
    economics: FoldEconomics | None = None,
    trigger_tokens: int | None = None,
    item_chars: Sequence[int | None] | None = None,
) -> FoldResult:
    """Plan and run one visit of a window (see the module docstring and docs/internals.md).

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
    ``trigger_tokens`` is the session's trigger as the store keeps it: for a priced visit it may
    be below the policy's (the cost model set the next visit earlier:
    :func:`~.economics.next_trigger_tokens`); an unpriced visit always waits for the policy's.
    ``item_chars`` is, when the caller knows it, the size of each item's message as compact JSON
    (what the record's ``chars_before`` and ``chars_after`` add up), parallel to ``items``; a
    None entry, or no list, is measured here. The store passes the length of the JSON it holds
    (:attr:`~sessionfold.store.results.Window.chars`): serializing every message again only to
    measure it was a tenth of a fold's CPU.
    Never raises a summarizer error: see :class:`FoldResult`.
    """
    _check_items(items)
    if target_tokens is not None and target_tokens < 0:
        raise InvalidInputError(f"target_tokens must be >= 0, got {target_tokens}")
    sizes = _Sizes(counter or default_counter())
    if item_chars is not None:
        sizes.known_chars(items, item_chars)
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

    priced = (economics is not None and policy.economics == "dollars" and not force
              and trigger != "overflow")
    idle = priced and trigger == "idle"
    gate_tokens = policy.trigger_tokens
    if priced and trigger_tokens is not None:
        gate_tokens = max(0, min(gate_tokens, trigger_tokens))
    if not force and not (policy.over_idle_trigger(before) if idle else before > gate_tokens):
        gate = (f"the idle trigger of {policy.idle_trigger_tokens}" if idle
                else f"the trigger of {gate_tokens}")
        return FoldResult(list(items), FoldEdit(), record(
            "nothing-to-fold", before, chars_after=chars_before,
            detail=f"{round(before)} tokens, at or under {gate}",
        ), [])

    planner = _Planner(items=list(items), policy=policy, summarizer=summarizer, sizes=sizes,
                   target=target, slope=slope, current=before, force=force, pinned=pinned,
                   latched=latched, originals=originals)
    planner.clip()
    planner.protection = protect(planner.items, policy, pinned, turns=planner.turns())
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
    if planner.over() and not waiting:
        planner.drop_recall()
    for layer in policy.layers:
        if waiting or not planner.over():
            break
        if layer in _CHEAP_LAYERS:
            planner.cheap_layer(layer)
        elif summarizer is None and layer == "summarize":
            planner.notes.append("summarize skipped: "
                               + (summarizer_skipped or "no summarizer given"))
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
    result = fold_window(loaded, policy, summarizer, system=system, measured_tokens=measured,
                         trigger=trigger, force=force, pinned=pinned, counter=counter,
                         originals=originals.get)
    record = result.record
    if clipped:
        record = record.model_copy(update={
            "layers_run": ("clip-oversized",
                           *(x for x in record.layers_run if x != "clip-oversized")),
            "chars_before": sum(_message_chars(m) for m in parsed),
            # The size of the input as given: the provider's, else the estimate fold_window
            # made of the clipped window plus what clipping took out of it.
            "measured_tokens": (measured_tokens if measured_tokens is not None
                                else record.measured_tokens + saved),
        })
    return CompactResult(result.window, result.messages(), record, result.spans,
                         result.summarizer_error)
