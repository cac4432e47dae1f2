"""The planner of one visit: the state of one :func:`~.compact.fold_window` call, and its steps.

The steps run in :func:`~.compact.fold_window`'s order: clip, drop recall exchanges, the cheap
layers, then fold runs of turns (writing each span's replacement is :mod:`.replacements`). A
priced visit first measures what it could do on a copy (:meth:`Planner.shape`). Each step
re-measures and keeps the turns and protection it computed until the items change.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .clip import clip_oversized
from .economics import FoldShape
from .errors import SummarizerError
from .frame import fingerprint, legacy_fingerprint
from .layers import (
    DROP_RECALL,
    LayerMemo,
    drop_recall_items,
    drop_thinking,
    has_thinking,
    last_assistant,
    mask_tool_results,
)
from .policy import FoldPolicy
from .recall_hints import out_of_sight
from .replacements import RETENTION_LATCH, Replacements
from .sizes import Sizes
from .summarizers import Summarizer
from .turns import (
    Protection,
    Run,
    Turn,
    foldable_runs,
    group_turns,
    turn_reasons,
)
from .window import (
    FoldedSpan,
    Originals,
    Refusal,
    RefusalReason,
    SummarizerUsage,
    WindowItem,
)

if TYPE_CHECKING:
    from .cycles import FoldChoice

__all__ = ["CHEAP_LAYERS", "Planner"]

#: Layers that cost nothing and change items in place (the dry run of a priced visit runs them).
CHEAP_LAYERS = ("mask-tool-results", "drop-thinking")
#: A notice's expected size (one short line), in estimate tokens.
_NOTICE_TOKENS = 64
#: Turns whose mean size estimates a session's growth per call (at least).
_GROWTH_TURNS = 4


@dataclass(frozen=True)
class _Guarded:
    """What protection holds in one grouping of the window (see :meth:`Planner.guarded`)."""

    turns: list[Turn]
    protection: Protection
    reasons: list[RefusalReason | None]
    positions: tuple[int, ...]


@dataclass
class Planner(Replacements):
    """The planner of one visit: the mutable state of one fold_window call, and its steps."""

    items: list[WindowItem]
    policy: FoldPolicy
    summarizer: Summarizer | None
    sizes: Sizes
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
        dry = Planner(items=list(self.items), policy=self.policy, summarizer=None,
                      sizes=self.sizes, target=0, slope=self.slope, current=self.current,
                      force=self.force, pinned=self.pinned, latched=self.latched,
                      protection=self.protection, _turns=self._turns, _guarded=self._guarded,
                      memos=self.memos)
        dry.drop_recall()
        for layer in self.policy.layers:
            if layer in CHEAP_LAYERS:
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
        tools and the protected task), still read from the cache after the fold. None of it
        when the fold is what brings the recall tool onto the requests: the tools lead the
        prompt, so the first request after it is written whole (B1: a ten-call
        customer-service session whose one output a cheap fold masked paid 1.26x of no
        compaction, priced as if its system prompt and task stayed cached)."""
        if self.policy.recall_offer == "edited" and self.policy.recall and not out_of_sight(
                self.items):
            return 0
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
        :func:`~.replacements.retention_latch`) and this span is less than twice that one. A
        longer span holds more identifiers, not fewer: without this, every visit of a growing
        session paid for a summary that would be refused again."""
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
