"""Turns, protection, and the runs of window history a fold may take.

A *turn* is one assistant message together with the user message that answers its tool calls
(the next message, whenever it holds a ``tool_result``, even beside text). A user message without
tool results stands alone, and so does a summary or notice item. A recall exchange (items of kind
``"recall"``: the model asking ``sessionfold_recall``, the client's answer) is a turn of its own,
and so is the line a dropped one leaves. Cuts fall only between turns, so a ``tool_use`` and its
``tool_result`` are never separated::

    [user task] [asst+tool_use, user tool_result] [asst+tool_use, user tool_result] [user] ...
      turn 0             turn 1                            turn 2                  turn 3

Protection names why a turn may not be folded (refusals are data, not log lines):

- ``first-user``: the task, the first user message that says something of its own (text, an
  image, a document: not only tool results, and not a summary) (``keep_first_user``). A log
  may open with an assistant tool call (an agent that runs ``git status`` before the human
  speaks): the message answering it carries a tool's output, not the task;
- ``pinned``: a turn holding a seq the caller pinned;
- ``unresolved-tool-call``: a turn whose ``tool_use`` has no ``tool_result`` yet;
- ``inside-keep-window``: the last ``keep_recent_turns`` turns. They are counted as *assistant
  messages* from the end, because a tool-using agent sends one request and then hundreds of tool
  steps (counting user requests would protect the whole run). When the oldest kept assistant
  message directly follows a plain user message (a chat question), the window starts at that
  question, so an answer is never kept without the question it answers. Recall exchanges are
  not counted (the client made them, not the agent) and do not come between an answer and its
  question; inside the keep window they are kept like everything else.

Protection is keyed by seq, not by position, so it stays valid while a fold replaces items.
A *run* is a maximal stretch of consecutive unprotected turns; a fold takes the oldest one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from .messages import Message, ToolResultBlock, ToolUseBlock
from .policy import FoldPolicy
from .window import Refusal, RefusalReason, WindowItem

__all__ = [
    "Protection",
    "Run",
    "Turn",
    "foldable_runs",
    "group_turns",
    "protect",
    "protection_refusals",
    "turn_reasons",
]


@dataclass(frozen=True)
class Turn:
    """Consecutive window items that a fold keeps or takes together.

    ``index`` is the position of the first item in the window the turn was grouped from.
    """

    index: int
    items: tuple[WindowItem, ...]

    @property
    def start_seq(self) -> int:
        return self.items[0].start_seq

    @property
    def end_seq(self) -> int:
        return self.items[-1].end_seq

    @property
    def stop(self) -> int:
        """Position just after the turn's last item."""
        return self.index + len(self.items)

    @property
    def is_fold(self) -> bool:
        """A summary or notice left by an earlier fold."""
        return self.items[0].kind in ("summary", "notice")

    @property
    def is_recall(self) -> bool:
        """A recall exchange, or the line a dropped one left."""
        return self.items[0].kind == "recall"

    @property
    def is_dropped_recall(self) -> bool:
        return self.is_recall and all("dropped" in item.edits for item in self.items)

    @property
    def is_summary(self) -> bool:
        return self.items[0].kind == "summary"

    def unresolved_tool_use_ids(self) -> list[str]:
        """Ids of tool calls in this turn that no tool_result of this turn answers."""
        asked: list[str] = []
        for item in self.items:
            message = item.message
            if message.role == "assistant" and not isinstance(message.content, str):
                asked += [b.id for b in message.content if isinstance(b, ToolUseBlock)]
        if not asked:
            return []
        answered = {i for item in self.items for i in item.message.tool_result_ids()}
        return [i for i in asked if i not in answered]


def _states_task(message: Message) -> bool:
    """Whether ``message`` is a user's own word (text, an image, a document...), not only the
    results of tool calls: the first such message is the task."""
    if message.role != "user":
        return False
    return isinstance(message.content, str) or not all(
        isinstance(b, ToolResultBlock) for b in message.content)


def _answers(message: Message) -> bool:
    return message.role == "user" and message.has_tool_results()


def _pairs(item: WindowItem, following: WindowItem) -> bool:
    """Whether ``following`` answers the tool calls of ``item``: a turn of two. A call and its
    answer are of one kind (both the agent's, or both a recall exchange's)."""
    return (item.kind in ("message", "recall") and following.kind == item.kind
            and item.message.role == "assistant" and _answers(following.message))


def group_turns(items: Sequence[WindowItem]) -> list[Turn]:
    """Group window items into turns (see the module docstring)."""
    turns: list[Turn] = []
    last = len(items) - 1
    i = 0
    while i <= last:
        item = items[i]
        if i < last and _pairs(item, items[i + 1]):
            turns.append(Turn(i, (item, items[i + 1])))
            i += 2
        else:
            turns.append(Turn(i, (item,)))
            i += 1
    return turns


@dataclass(frozen=True)
class Protection:
    """Why turns may not be folded, keyed by seq so it survives edits to the window."""

    first_user_seq: int | None = None
    #: Every item starting at or after this seq is inside the keep window (None: no keep window).
    keep_from_seq: int | None = None
    unresolved_seqs: frozenset[int] = frozenset()
    pinned: frozenset[int] = frozenset()

    def reason(self, turn: Turn) -> RefusalReason | None:
        """The reason ``turn`` may not be folded, or None if it may."""
        if self.first_user_seq is not None and any(
            item.start_seq == self.first_user_seq and item.kind == "message"
            for item in turn.items
        ):
            return "first-user"
        if self.pinned and any(
            s in self.pinned for item in turn.items
            for s in range(item.start_seq, item.end_seq + 1)
        ):
            return "pinned"
        if any(item.start_seq in self.unresolved_seqs for item in turn.items):
            return "unresolved-tool-call"
        if self.keep_from_seq is not None and turn.end_seq >= self.keep_from_seq:
            return "inside-keep-window"
        return None


def _question_before(turns: Sequence[Turn], pos: int) -> Turn | None:
    """The plain user message the turn at ``pos`` answers, past any recall exchange between
    them (the client's, made while the model answered); None if there is none."""
    for before in reversed(turns[:pos]):
        if before.is_recall:
            continue
        if (not before.is_fold and len(before.items) == 1
                and before.items[0].message.role == "user"):
            return before
        return None
    return None


def _keep_from_seq(turns: Sequence[Turn], keep_recent_turns: int) -> int | None:
    if keep_recent_turns <= 0:
        return None
    seen = 0
    for pos in range(len(turns) - 1, -1, -1):
        turn = turns[pos]
        if turn.is_fold or turn.is_recall:
            continue  # neither is a turn of the agent's
        seen += sum(1 for item in turn.items if item.message.role == "assistant")
        if seen >= keep_recent_turns:
            question = _question_before(turns, pos)
            if question is not None:
                return question.start_seq  # the question this kept answer replies to
            return turn.start_seq
    # Fewer assistant messages than the keep window holds: all of it is kept.
    return turns[0].start_seq if turns else None


def protect(items: Sequence[WindowItem], policy: FoldPolicy,
            pinned: Collection[int] = (), *,
            turns: Sequence[Turn] | None = None) -> Protection:
    """Work out what ``policy`` and the caller's pins protect in ``items``.

    ``turns``: ``group_turns(items)`` when the caller has it already.
    """
    turns = group_turns(items) if turns is None else turns
    first_user: int | None = None
    if policy.keep_first_user:
        first_user = next((item.start_seq for item in items
                           if item.kind == "message" and _states_task(item.message)), None)
    unresolved = frozenset(turn.start_seq for turn in turns if turn.unresolved_tool_use_ids())
    return Protection(first_user_seq=first_user,
                      keep_from_seq=_keep_from_seq(turns, policy.keep_recent_turns),
                      unresolved_seqs=unresolved, pinned=frozenset(pinned))


@dataclass(frozen=True)
class Run:
    """A maximal stretch of consecutive foldable turns; maybe headed by an earlier summary."""

    turns: tuple[Turn, ...]

    @property
    def start_seq(self) -> int:
        return self.turns[0].start_seq

    @property
    def end_seq(self) -> int:
        return self.turns[-1].end_seq

    @property
    def head(self) -> Turn | None:
        """The earlier summary or notice at the head of the run, if there is one."""
        return self.turns[0] if self.turns[0].is_fold else None

    @property
    def body(self) -> tuple[Turn, ...]:
        """The turns after the head: what a new fold of this run may take."""
        return self.turns[1:] if self.head is not None else self.turns


def turn_reasons(turns: Sequence[Turn], protection: Protection) -> list[RefusalReason | None]:
    """``protection.reason`` of each turn, in order (a planner keeps this list while the turns
    keep their shape, instead of asking again per pass)."""
    reason = protection.reason
    return [reason(turn) for turn in turns]


def foldable_runs(turns: Sequence[Turn], protection: Protection, *,
                  reasons: Sequence[RefusalReason | None] | None = None) -> list[Run]:
    """The runs of consecutive unprotected turns, oldest first.

    A summary or notice *inside* a run (left there when the caller's pins changed) stays part of
    the run: a fold that reaches it takes it along as one more message of the span.
    ``reasons``: :func:`turn_reasons` of ``turns`` when the caller holds it.
    """
    if reasons is None:
        reasons = turn_reasons(turns, protection)
    runs: list[Run] = []
    current: list[Turn] = []
    for turn, reason in zip(turns, reasons, strict=True):
        if reason is None:
            current.append(turn)
            continue
        if current:
            runs.append(Run(tuple(current)))
        current = []
    if current:
        runs.append(Run(tuple(current)))
    return runs


def protection_refusals(turns: Sequence[Turn], protection: Protection, *,
                        reasons: Sequence[RefusalReason | None] | None = None) -> list[Refusal]:
    """One refusal per stretch of consecutive turns protected for the same reason.
    ``reasons``: :func:`turn_reasons` of ``turns`` when the caller holds it."""
    if reasons is None:
        reasons = turn_reasons(turns, protection)
    refusals: list[Refusal] = []
    for turn, reason in zip(turns, reasons, strict=True):
        if reason is None:
            continue
        last = refusals[-1] if refusals else None
        if last is not None and last.reason == reason and last.end_seq == turn.start_seq - 1:
            refusals[-1] = last.model_copy(update={"end_seq": turn.end_seq})
        else:
            refusals.append(Refusal(reason=reason, start_seq=turn.start_seq,
                                    end_seq=turn.end_seq))
    return refusals
