"""What takes a folded span's place: a summary, or a notice that the span was dropped.

The planner's last step for one span (:class:`Replacements`, mixed into
:class:`~.planner.Planner`): the summarizer is called in chunks when the span is larger than
its context, the summary is checked for the span's identifiers (asked once more, naming what it
left out, where a missing one would be refused), and a replacement no smaller than its span is
refused. See ``docs/internals.md`` for the retention rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import PermanentSummarizerError, SummarizerError, TransientSummarizerError
from .frame import EarlierFold, notice_message, summary_body, summary_message
from .messages import Message
from .policy import FoldPolicy
from .retention import (
    IDENTIFIER_LIMIT,
    check_retention,
    excerpts,
    extract_identifiers,
    identifiers_remembered,
)
from .sizes import Sizes
from .summarizers import Summarizer
from .tokens import count_text
from .turns import Turn
from .window import FoldedSpan, Refusal, SummarizerUsage, WindowItem

__all__ = ["REPAIR_EXCERPT_CHARS", "RETENTION_LATCH", "RETENTION_LIMIT", "Replacements",
           "retention_latch"]

#: Identifiers the retention check compares at most (the most recurring of the span's own).
RETENTION_LIMIT = IDENTIFIER_LIMIT
#: Characters a summary repair reads either side of a missing identifier's latest mention.
REPAIR_EXCERPT_CHARS = 160
#: The prefix of a retention refusal's latch (see :func:`retention_latch`).
RETENTION_LATCH = "retention"


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


class Replacements:
    """The planner's steps that write a span's replacement (a mixin of
    :class:`~.planner.Planner`, which holds the state they read)."""

    policy: FoldPolicy
    summarizer: Summarizer | None
    sizes: Sizes
    force: bool
    #: What the visit has paid the summarizer so far (this step adds each span's calls).
    usage: SummarizerUsage

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
    until it is twice as long (:meth:`~.planner.Planner.retention_latched`)."""
    return f"{RETENTION_LATCH}:{start_seq}:{end_seq}"


def _for_summarizer(item: WindowItem) -> Message:
    """What a summarizer is given for ``item``: its message, or for a summary or notice the
    message with the item's record (kind, range, body) attached."""
    return item.message if item.kind == "message" else EarlierFold.of(item)

